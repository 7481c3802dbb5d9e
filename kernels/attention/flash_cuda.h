// Flash attention on CUDA (internal to kernels/attention; the public launchers are in
// attention.h). bf16, head_dim 64 or 128, causal or not, GQA, varlen (cu_seqlens).
//
// Both are written for sm_90a (TMA, mbarriers, wgmma; see flash_fwd_cuda.cu and
// flash_bwd_cuda.cu). Work is split into tiles of one sequence: the forward's work items are
// (query tile, query head) — persistent CTAs for full attention, a heavy-light pair of
// items per CTA for causal — the backward one CTA per (key tile, kv head) that loops
// over the query heads of its group and the query tiles that see it. Sequence boundaries live on the
// device (cu_seqlens), so a small kernel first writes the tile table {sequence, tile}
// — no host synchronization — and CTAs past the real tile count exit at once.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/attention.h"
#include "kernels/common/cuda_elem.cuh"

namespace tessera::kernels::flash {

// The shapes the flash kernels (and cuDNN's) are written for.
inline bool ShapeServed(const AttentionDims& d, DType t) {
  return t == DType::kBF16 && (d.head_dim == 64 || d.head_dim == 128);
}
// True when the flash kernels serve this case on the current device: those shapes, on a
// GPU that takes Hopper's kernels (else the generic kernels do).
inline bool Supported(const AttentionDims& d, DType t) { return ShapeServed(d, t) && HopperPaths(); }

// Upper bound on the tiles of `tile`-token blocks over all sequences.
inline int64_t TileCapacity(const AttentionDims& d, int tile) { return (d.tokens + tile - 1) / tile + d.batch; }

// The order of each sequence's tiles in a tile table. Causal work grows along a sequence
// for query tiles (tile i sees i + 1 key tiles) and shrinks for key tiles (tile j is seen
// by the queries from j on); the hardware starts CTAs in grid order, so the heaviest go
// first and the light ones fill in behind them (a longest-first list schedule).
enum class TileOrder {
  kLastFirst,   // n-1, n-2, ..., 0: query tiles, heaviest first (the causal forward)
  kPairs,       // n-1, 0, n-2, 1, ...: entries 2c and 2c+1 cost about the same for every c
  kFirstFirst,  // 0, 1, ..., n-1: key tiles, heaviest first (the causal backward)
};

// Writes table[0, capacity) = {sequence, tile index within it}, each sequence's tiles
// together in `order`; unused entries get sequence -1. Optionally (first_tile != null)
// also the index of each sequence's first tile, first_tile[b]; table may be null.
absl::Status BuildTileTable(const int32_t* cu, int64_t batch, int tile, int2* table, int64_t capacity, cudaStream_t s,
                            int32_t* first_tile = nullptr, TileOrder order = TileOrder::kLastFirst);

absl::Status Forward(const void* q, const void* k, const void* v, const int32_t* cu, void* out, float* lse,
                     const AttentionDims& d, cudaStream_t s);
// Gradients dq, dk, dv (bf16, like q, k, v); takes stream-ordered scratch of
// tokens*q_heads*(head_dim+2) f32 for the dq accumulator, lse*log2(e) and rowsum(dO O).
absl::Status Backward(const void* q, const void* k, const void* v, const int32_t* cu, const void* out, const void* dout,
                      const float* lse, void* dq, void* dk, void* dv, const AttentionDims& d, cudaStream_t s);

// Describes a [tokens, heads, dim] bf16 tensor for TMA, read in 128-byte-swizzled boxes
// of 64 (dim) x 1 (head) x rows (tokens). `name` goes into the error.
absl::Status TokenTensorMap(CUtensorMap* map, const void* base, int64_t tokens, int64_t heads, int64_t dim, int rows,
                            const char* name);

}  // namespace tessera::kernels::flash
