// Flash attention on CUDA (internal to kernels/attention; the public launchers are in
// attention.h). bf16, head_dim 64 or 128, causal or not, GQA, varlen (cu_seqlens).
//
// Work is split into tiles of one sequence: the forward runs one CTA per (query tile,
// query head), the backward one CTA per (key tile, kv head) that loops over the query
// heads of its group and the query tiles that see it. Sequence boundaries live on the
// device (cu_seqlens), so a small kernel first writes the tile table {sequence, tile}
// — no host synchronization — and CTAs past the real tile count exit at once.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/attention/attention.h"

namespace tessera::kernels::flash {

// True when the flash kernels serve this case (else the generic kernels do).
inline bool Supported(const AttentionDims& d, DType t) {
  return t == DType::kBF16 && (d.head_dim == 64 || d.head_dim == 128);
}

// Upper bound on the tiles of `tile`-token blocks over all sequences.
inline int64_t TileCapacity(const AttentionDims& d, int tile) { return (d.tokens + tile - 1) / tile + d.batch; }

// Writes table[0, capacity) = {sequence, tile index within it}, heaviest causal tiles
// first; unused entries get sequence -1.
absl::Status BuildTileTable(const int32_t* cu, int64_t batch, int tile, int2* table, int64_t capacity, cudaStream_t s);

absl::Status Forward(const void* q, const void* k, const void* v, const int32_t* cu, void* out, float* lse,
                     const AttentionDims& d, cudaStream_t s);
// dvec [T, Hq] = rowsum(dout * out) must be computed first; dq_acc [T, Hq, D] f32 must be
// zero. dq_acc receives dS K unscaled (the caller scales and casts); dk, dv are written.
absl::Status Backward(const void* q, const void* k, const void* v, const int32_t* cu, const void* dout,
                      const float* lse, const float* dvec, float* dq_acc, void* dk, void* dv, const AttentionDims& d,
                      cudaStream_t s);

}  // namespace tessera::kernels::flash
