// What follows a decode step's q/k/v projection, in one pass: for every token, each query
// and key head is RMS-normalized over the head by q_norm / k_norm (Qwen3's q/k norm; when
// given) and rounded, then rotated by RoPE at the token's position (kernels/rope's
// rotation and angles) and rounded; the rotated queries go to q_out, the rotated keys and
// the values to the paged cache at the token's slot (kernels/paged_attention's
// KvCacheWrite layout) and, when k_out is given, also to k_out (a prefill's attention reads
// them from there). Equal to those three ops one after the other.
//   q [t, hq, d], k and v [t, hkv, d] (rows of hq*d / hkv*d, contiguous); pos, slots [t]
//   i32 (slots checked by the caller); inv_freq: the host's d / 2 frequencies; q_out like
//   q; k_cache, v_cache [blocks * block_size, hkv, d].
// CPU: those ops' references. CUDA: bf16 or f32, d even and <= kRopeMaxHeadDim; one warp
// per (token, head), launched as a programmatic dependent (kernels/common/pdl.cuh).
#pragma once
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace tessera::kernels {
struct QkRopeCacheArgs {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  const int32_t *pos = nullptr, *slots = nullptr;
  int64_t tokens = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  const void *q_norm = nullptr, *k_norm = nullptr;  // [d] each, or both null
  float eps = 0.f;
  const float* inv_freq = nullptr;  // host, d / 2
  float scale = 1.f;
  void *q_out = nullptr, *k_cache = nullptr, *v_cache = nullptr;
  void* k_out = nullptr;  // [t, hkv, d] or null
};
absl::Status QkRopeCacheCpu(const QkRopeCacheArgs& a, DType t);
absl::Status QkRopeCacheCuda(const QkRopeCacheArgs& a, DType t, void* stream);
}  // namespace tessera::kernels
