// Llama's internal structures, shared by its source files (llama.cc: training;
// llama_layer.cc: a decoder layer's forward and backward; llama_head.cc: the LM head
// and the value head; generator.cc: the forward
// over a KV cache: Generator). Not part of the model's interface.
#pragma once

#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "worker/model/generator.h"
#include "worker/model/llama.h"

namespace tessera::model {

namespace internal {
inline absl::StatusOr<runtime::Tensor> New(runtime::Backend& b, std::vector<int64_t> shape,
                                           tessera::DType t = tessera::DType::kF32) {
  return b.Empty(std::move(shape), t);
}
// A column of ones [rows, 1] in `t` (f32 or bf16): the QKV bias's broadcast over rows.
inline absl::StatusOr<runtime::Tensor> Ones(runtime::Backend& b, int64_t rows, tessera::DType t) {
  TESSERA_ASSIGN_OR_RETURN(runtime::Tensor ones, New(b, {rows, 1}, t));
  if (t == tessera::DType::kF32) {
    const std::vector<float> v(static_cast<size_t>(rows), 1.f);
    TESSERA_RETURN_IF_ERROR(b.CopyFromHost(v.data(), ones));
  } else {
    const std::vector<uint16_t> v(static_cast<size_t>(rows), tessera::FloatToBf16(1.f));
    TESSERA_RETURN_IF_ERROR(b.CopyFromHost(v.data(), ones));
  }
  return ones;
}
// y [T, n] += bias [n] (broadcast over rows: ones [T, 1] x bias [1, n]).
inline absl::Status AddBias(runtime::Backend& b, const runtime::Tensor& ones, const Param& bias, runtime::Tensor& y) {
  TESSERA_ASSIGN_OR_RETURN(runtime::Tensor row, bias.weight().Reshape({1, bias.weight().numel()}));
  return b.Gemm(ones, false, row, false, y, 1.f, 1.f);
}
// y [T, out] = x [T, in] W^T, W [out, in].
inline absl::Status Linear(runtime::Backend& b, const runtime::Tensor& x, const runtime::Tensor& w, runtime::Tensor& y) {
  return b.Gemm(x, false, w, true, y);
}
// dW += dy^T x; dx = dy W + beta_dx dx.
// The beta of a write into p.grad: 0 (overwrite) for the step's first (Param::grad_stale),
// else 1 (accumulate).
inline float GradBeta(Param& p) {
  const float beta = p.grad_stale ? 0.f : 1.f;
  p.grad_stale = false;
  return beta;
}
inline absl::Status LinearBackward(runtime::Backend& b, const runtime::Tensor& dy, const runtime::Tensor& x, Param& w,
                                   runtime::Tensor& dx, float beta_dx) {
  if (absl::Status s = b.Gemm(dy, true, x, false, w.grad, 1.f, GradBeta(w)); !s.ok()) return s;
  return b.Gemm(dy, false, w.weight(), false, dx, 1.f, beta_dx);
}
}  // namespace internal

struct Llama::LayerParams {
  Param *norm1, *wq, *wk, *wv, *bq = nullptr, *bk = nullptr, *bv = nullptr, *qn = nullptr, *kn = nullptr, *wo, *norm2,
      *wg, *wu, *wd;
};

struct Llama::Inputs {
  runtime::Tensor tokens, targets, positions;  // on the backend, i32 [T]
  runtime::Tensor cu;                          // on the host, i32 [B + 1]
  runtime::Tensor cu_half;                     // CP: the chunk boundaries within a half, host i32
  runtime::Tensor ones;                        // [T, 1] f32, for bias broadcasts (QKV bias only)
  std::vector<float> target_logit;             // [T] on the host, after the cross-entropy
  RopeFrequencies rope;                        // this batch's RoPE frequencies (Llama::RopeFor)
};

// What the backward of one layer needs from its forward.
// (x_in, xn, rstd, x_mid: this rank's tokens under SP; xn_full and the rest: all tokens.)
struct Llama::LayerActs {
  runtime::Tensor x_in, xn1, xn1_full, rstd1, q, k, v, o, lse, x_mid, xn2, xn2_full, rstd2, gate, up, act;
  runtime::Tensor q_pre, k_pre, rstd_q, rstd_k;  // qk_norm: each head's q and k before their norm
};

// One micro-batch's pass through one model chunk: what its backward needs.
struct Llama::Flight {
  Inputs in;
  std::vector<LayerActs> acts;  // per layer of the chunk
  runtime::Tensor x_last, xn, rstd, xn_full;  // the head (last virtual stage)
  runtime::Tensor logits;  // the head's logits, where one chunk held them (else the backward makes them again)
  int64_t head_rows = 0;   // tokens per logits chunk (Llama::HeadChunkTokens)
  std::vector<float> lse, dloss;
  runtime::Tensor lse_t, dloss_t;  // on the device instead (Llama::DeviceLoss)
  std::vector<float> dentropy;  // ForwardBackwardLogProbs with an entropy term: dL/dH per token
  std::vector<float>* values = nullptr;  // a critic's: filled by the value head
  const ValueGrad* value_grad = nullptr;  // ForwardBackwardValues: the per-token gradient
  std::vector<float> dvalues;
  TokenStats* stats = nullptr;  // TokenLogProbs: filled by the head
  const LogProbGrad* logprob_grad = nullptr;  // ForwardBackwardLogProbs: the per-token gradient
};

// A layer's step over the KV cache (generation): every row's keys and values go to
// `slots` of layer `layer`'s cache; the first `fresh` rows (the sequences of Inputs::cu)
// attend to each other, the others to the cache through `decode`'s block tables and
// lengths (one row each). `decode_only`: no fresh rows, and every row is the next token of
// a sequence of its own (no row's context holds another row's new slot), so its key and
// value can go to the cache within its attention (Backend::DecodeAttention).
struct Llama::CacheStep {
  KvCache* cache;
  int64_t layer;
  runtime::Tensor slots;  // i32 [T], on the host or the device
  const DecodeView* decode;
  int64_t fresh = 0;
  bool decode_only = false;
};

}  // namespace tessera::model
