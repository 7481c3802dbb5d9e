// Attention over variable-length packed sequences (cu_seqlens), causal or not, with
// grouped-query heads; returns the log-sum-exp of every (token, head) so that blocks
// computed separately (ring attention over CP) can be merged.
//   q [T, Hq, D], k/v [T, Hkv, D] (Hq % Hkv == 0; query head h reads kv head h / (Hq/Hkv)),
//   cu_seqlens [B+1] i32 (0 = cu[0] < ... < cu[B] = T), out [T, Hq, D], lse [T, Hq] f32.
//   Causal masks are aligned at each sequence's start (query i sees keys j <= i).
// Backward: dq, dk, dv (same shapes/dtypes as q, k, v) from dout, out and lse.
// CPU: double accumulation (the oracle). CUDA: forward only for now, one warp per
// (query, head) with an online softmax (correct, not fast; the flash kernel replaces it).
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
}  // namespace tessera::kernels
