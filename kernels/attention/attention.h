// Attention over variable-length packed sequences (cu_seqlens), causal or not, with
// grouped-query heads; returns the log-sum-exp of every (token, head) so that blocks
// computed separately (ring attention over CP) can be merged.
//   q [T, Hq, D], k/v [T, Hkv, D] (Hq % Hkv == 0; query head h reads kv head h / (Hq/Hkv)),
//   cu_seqlens [B+1] i32 (0 = cu[0] < ... < cu[B] = T), out [T, Hq, D], lse [T, Hq] f32.
//   Causal masks are aligned at each sequence's start (query i sees keys j <= i).
// Backward: dq, dk, dv (same shapes/dtypes as q, k, v) from dout, out and lse.
// CPU: double accumulation (the oracle). CUDA: bf16 with head_dim 64/128 runs the flash
// kernels (tensor cores, see flash_cuda.h); other dtypes/head dims run generic one-warp-
// per-row kernels (correct, not fast). The CUDA backward needs scratch of
// tokens*q_heads*(head_dim+1) f32 from the stream-ordered pool.
#pragma once
#include <cstdint>

#include "absl/status/status.h"
#include "worker/runtime/dtype.h"

namespace tessera::kernels {
using runtime::DType;
struct AttentionDims {
  int64_t tokens, q_heads, kv_heads, head_dim, batch;  // batch = number of sequences
  bool causal;
  float scale;
};
absl::Status AttentionForwardCpu(const void* q, const void* k, const void* v, const int32_t* cu_seqlens, void* out,
                                 float* lse, const AttentionDims& d, DType t);
absl::Status AttentionBackwardCpu(const void* q, const void* k, const void* v, const int32_t* cu_seqlens,
                                  const void* out, const void* dout, const float* lse, void* dq, void* dk, void* dv,
                                  const AttentionDims& d, DType t);
absl::Status AttentionForwardCuda(const void* q, const void* k, const void* v, const int32_t* cu_seqlens, void* out,
                                  float* lse, const AttentionDims& d, DType t, void* stream);
absl::Status AttentionBackwardCuda(const void* q, const void* k, const void* v, const int32_t* cu_seqlens,
                                   const void* out, const void* dout, const float* lse, void* dq, void* dk, void* dv,
                                   const AttentionDims& d, DType t, void* stream);
}  // namespace tessera::kernels
