// cuDNN's fused flash attention (cuDNN 9 graph API) as a second path of the CUDA attention
// forward, behind the same launcher (AttentionForwardCuda), used where it is
// measured faster. It serves sequences of one length only (the graph is a dense
// [batch, heads, seq, dim] problem over our packed [tokens, heads, dim] memory, described
// by strides — no copy); varlen batches stay on the flash kernels.
//
// cuDNN is loaded at first use (dlopen of libcudnn.so.9, like cuBLASLt), so a host without
// it runs the flash kernels. Each shape's graph is built once: the operation graph that
// cudnn_frontend's SDPA node lowers to (Q K^T, scale, causal mask by generated row/column
// indices, softmax with its log-sum-exp as the stats output, P V), the engines cuDNN's
// heuristics rank first tried in order; the plan is cached per device and shape.
// Building a plan loads kernels, which may wait for the device to drain: Prepare builds
// it ahead, where no collective is in flight (the trainer does so at a step's start).
// Threading: callable from any thread; each device's handle and plans are guarded by a
// mutex of that device (never one shared by all devices), and a plan executes on the
// caller's stream.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/attention/attention.h"

namespace tessera::kernels::cudnn_attention {

// out [tokens, q_heads, dim] bf16 and lse [tokens, q_heads] f32 (natural log of the
// scaled scores' sum of exponentials, as the flash forward writes it) for d.batch
// sequences of exactly `seq` tokens each (d.tokens == d.batch * seq). Unavailable when
// cuDNN cannot be loaded or has no engine for the graph; the message says which. With
// build false, a shape whose plan Prepare (or an earlier Forward) has not built is
// NOT_FOUND, at once: the caller runs the flash kernels instead of waiting ~0.1 s for a
// build (the rollout's prefills change shape every batch).
absl::Status Forward(const void* q, const void* k, const void* v, void* out, float* lse, const AttentionDims& d,
                     int64_t seq, cudaStream_t s, bool build = true);

// Builds (once) the plan Forward would use for these dims on the current device, without
// running it; the same errors as Forward's lookup. Bounded (the auto dispatch's
// preparation): when the device already holds kCudnnMaxAutoPlans plans, a new shape gets
// none (RESOURCE_EXHAUSTED) and so runs the flash kernels.
absl::Status Prepare(const AttentionDims& d, int64_t seq, cudaStream_t s, bool bounded = false);

// lse [rows, heads] from cuDNN's packed stats [batch, heads, seq] (rows = batch * seq);
// used when this cuDNN's engines want the stats packed (defined in attention_cuda.cu).
absl::Status StatsToTokenMajor(const float* stats, float* lse, int64_t heads, int64_t seq, int64_t rows, cudaStream_t s);

// "cuDNN 9.x.y (libcudnn.so.9)" once loaded, or why it cannot be (for benchmark reports).
std::string Describe();

}  // namespace tessera::kernels::cudnn_attention
