// Decode attention over a paged KV cache (vLLM-style block tables): one new query token
// per sequence attends to its first context_len cached tokens.
//   q [B, Hq, D]; k_cache, v_cache [num_blocks, block_size, Hkv, D];
//   block_tables [B, max_blocks] i32 (token t of sequence b lives in block
//   block_tables[b][t / block_size], slot t % block_size); context_lens [B] i32 (>= 1);
//   out [B, Hq, D]; lse [B, Hq] f32. GQA as in attention.h.
// CPU: double accumulation. CUDA: bf16 with head_dim 64/128 (GQA group <= 16) runs a
// split-KV tensor-core kernel (paged_split.h); other cases one warp per (sequence, head).
#pragma once
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "kernels/common/scratch.h"

namespace tessera::kernels {
struct PagedDims {
  int64_t batch, q_heads, kv_heads, head_dim, block_size, max_blocks;
  float scale;
};
absl::Status PagedAttentionCpu(const void* q, const void* k_cache, const void* v_cache, const int32_t* block_tables,
                               const int32_t* context_lens, void* out, float* lse, const PagedDims& d, DType t);
// `scratch` (kernels/common/scratch.h; null: the stream's pool) holds the splits' partial
// results where a second kernel merges them.
absl::Status PagedAttentionCuda(const void* q, const void* k_cache, const void* v_cache, const int32_t* block_tables,
                                const int32_t* context_lens, void* out, float* lse, const PagedDims& d, DType t,
                                void* stream, DeviceScratch* scratch = nullptr);
// A decode step's q/k pass (kernels/decode/qk_rope_cache.h) and this attention in one
// kernel, for rows that are distinct sequences each attending to its cache plus its new
// token, the context's last (slots[b] is the slot of token context_lens[b] - 1, and no
// row's context holds another row's new slot): q, k_new, v_new the raw projections ([B, Hq,
// D], [B, Hkv, D]); the keys and values go to the cache at slots, and out/lse equal
// QkRopeCache then PagedAttention (the rotated queries are not stored). bf16 only, where
// PagedAttentionRopeCudaSupported.
// `warm`: up to kMaxL2Warm byte ranges of constant buffers (the weights the next kernels
// read) that the kernel prefetches into L2 once the kernel before it has ended: a decode
// step's attention leaves the memory bus mostly idle, so the next projections' first bytes
// arrive meanwhile. A hint: it changes no result.
constexpr int kMaxL2Warm = 4;
struct L2Range {
  const void* p = nullptr;  // 16-byte aligned
  int64_t bytes = 0;        // a multiple of 16 (rounded down)
};
struct PagedRopeArgs {
  const void *k_new = nullptr, *v_new = nullptr;
  const int32_t *pos = nullptr, *slots = nullptr;  // [B] on the device
  const void *q_norm = nullptr, *k_norm = nullptr;  // [D] each, or both null
  float eps = 0.f;
  const float* inv_freq = nullptr;  // host, D / 2
  float scale = 1.f;                // RoPE's attention scaling
  L2Range warm[kMaxL2Warm] = {};
};
bool PagedAttentionRopeCudaSupported(const PagedDims& d, DType t);
absl::Status PagedAttentionRopeCuda(const void* q, const PagedRopeArgs& rope, void* k_cache, void* v_cache,
                                    const int32_t* block_tables, const int32_t* context_lens, void* out, float* lse,
                                    const PagedDims& d, DType t, void* stream, DeviceScratch* scratch = nullptr);
// Writes new tokens' keys and values into the paged cache (prefill and decode):
// k_cache[slots[i]] = k[i], v_cache[slots[i]] = v[i] for i < tokens, where a slot is
// block * block_size + offset (the cache's first two dims flattened) and a row is
// row_bytes bytes (kv_heads * head_dim elements). Slots are checked by the caller.
absl::Status KvCacheWriteCpu(const void* k, const void* v, const int32_t* slots, void* k_cache, void* v_cache,
                             int64_t tokens, int64_t row_bytes);
absl::Status KvCacheWriteCuda(const void* k, const void* v, const int32_t* slots, void* k_cache, void* v_cache,
                              int64_t tokens, int64_t row_bytes, void* stream);
}  // namespace tessera::kernels
