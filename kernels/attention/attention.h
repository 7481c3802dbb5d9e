// Attention over variable-length packed sequences (cu_seqlens), causal or not, with
// grouped-query heads; returns the log-sum-exp of every (token, head) so that blocks
// computed separately (ring attention over CP) can be merged.
//   q [T, Hq, D], k/v [T, Hkv, D] (Hq % Hkv == 0; query head h reads kv head h / (Hq/Hkv)),
//   cu_seqlens [B+1] i32 (0 = cu[0] < ... < cu[B] = T), out [T, Hq, D], lse [T, Hq] f32.
//   Causal masks are aligned at each sequence's start (query i sees keys j <= i).
// Backward: dq, dk, dv (same shapes/dtypes as q, k, v) from dout, out and lse.
// CPU: double accumulation (the oracle). CUDA: bf16 with head_dim 64/128 runs the flash
// kernels on Hopper (tensor cores, see flash_cuda.h; other GPUs the generic kernels) —
// the forward over sequences of one length up
// to kCudnnMaxAutoSeq runs cuDNN's fused attention instead (cudnn_attention.h; measured
// faster there, see AttentionEngine); other dtypes/head dims run generic one-warp-
// per-row kernels (correct, not fast). The CUDA backward needs scratch of
// tokens*q_heads*(head_dim+1) f32 from the stream-ordered pool.
#pragma once
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace tessera::kernels {
// Which implementation serves the CUDA forward (bf16, head_dim 64/128). kAuto: cuDNN's
// fused attention (cudnn_attention.h) for sequences of one length up to
// kCudnnMaxAutoSeq tokens — where it measured faster (docs/perf.md) — when cuDNN loads
// and the shape was prepared (Backend::PrepareAttention: the trainer at a step's start),
// else the flash kernels: a plan is never built inside a forward (it takes ~0.1 s and
// may wait for the device to drain; the rollout's prefills change shape every batch). kFlash / kCudnn force one (tests, benchmarks); kCudnn fails
// when cuDNN is missing or the sequences differ in length. The CPU ignores it.
enum class AttentionEngine { kAuto, kFlash, kCudnn };
inline constexpr int64_t kCudnnMaxAutoSeq = 4096;
// kAuto builds plans for at most this many shapes per device; later shapes run flash.
// Sequences of one length in varying lengths (one-sample micro-batches, equal-length
// RL samples) would otherwise pay a ~0.1 s build per length and keep every plan.
inline constexpr int64_t kCudnnMaxAutoPlans = 32;

struct AttentionDims {
  int64_t tokens, q_heads, kv_heads, head_dim, batch;  // batch = number of sequences
  bool causal;
  float scale;
  int64_t uniform_len = 0;  // every sequence has this many tokens (0: unequal or unknown)
  AttentionEngine engine = AttentionEngine::kAuto;
};
absl::Status AttentionForwardCpu(const void* q, const void* k, const void* v, const int32_t* cu_seqlens, void* out,
                                 float* lse, const AttentionDims& d, DType t);
absl::Status AttentionBackwardCpu(const void* q, const void* k, const void* v, const int32_t* cu_seqlens,
                                  const void* out, const void* dout, const float* lse, void* dq, void* dk, void* dv,
                                  const AttentionDims& d, DType t);
// Merges a block's partial attention into a running one (ring attention over CP): per
// (token, head) with L = logaddexp(lse, lse_b): out = out e^(lse - L) + out_b e^(lse_b - L),
// lse = L. out/out_b [rows, D] (rows = tokens * heads, any float dtype), lse/lse_b [rows]
// f32. A row whose lse is -inf (no keys yet) takes the block's values.
absl::Status AttentionMergeCpu(void* out, float* lse, const void* out_b, const float* lse_b, int64_t rows, int64_t dim,
                               DType t);
absl::Status AttentionMergeCuda(void* out, float* lse, const void* out_b, const float* lse_b, int64_t rows, int64_t dim,
                                DType t, void* stream);
absl::Status AttentionForwardCuda(const void* q, const void* k, const void* v, const int32_t* cu_seqlens, void* out,
                                  float* lse, const AttentionDims& d, DType t, void* stream);
absl::Status AttentionBackwardCuda(const void* q, const void* k, const void* v, const int32_t* cu_seqlens,
                                   const void* out, const void* dout, const float* lse, void* dq, void* dk, void* dv,
                                   const AttentionDims& d, DType t, void* stream);
// Readies what the CUDA forward will need for these dims (d.uniform_len set), without
// computing: cuDNN's plan where the forward would take that path (building one loads
// kernels, which may wait for the device to drain — so callers do it before a collective
// is in flight). kAuto: a shape cuDNN cannot serve is not an error (the forward falls
// back to the flash kernels); kCudnn: the error the forward would return.
absl::Status AttentionPrepareCuda(const AttentionDims& d, DType t, void* stream);
}  // namespace tessera::kernels
