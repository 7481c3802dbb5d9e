// Llama's internal structures, shared by its source files (llama.cc: training;
// llama_generate.cc: the forward over a KV cache). Not part of the model's interface.
#pragma once

#include <vector>

#include "worker/model/llama.h"

namespace tessera::model {

namespace internal {
inline absl::StatusOr<runtime::Tensor> New(runtime::Backend& b, std::vector<int64_t> shape,
                                           runtime::DType t = runtime::DType::kF32) {
  return b.Empty(std::move(shape), t);
}
// y [T, out] = x [T, in] W^T, W [out, in].
inline absl::Status Linear(runtime::Backend& b, const runtime::Tensor& x, const runtime::Tensor& w, runtime::Tensor& y) {
  return b.Gemm(x, false, w, true, y);
}
}  // namespace internal

struct Llama::LayerParams {
  Param *norm1, *wq, *wk, *wv, *bq = nullptr, *bk = nullptr, *bv = nullptr, *wo, *norm2, *wg, *wu, *wd;
};

struct Llama::Inputs {
  runtime::Tensor tokens, targets, positions;  // on the backend, i32 [T]
  runtime::Tensor cu;                          // on the host, i32 [B + 1]
  runtime::Tensor cu_half;                     // CP: the chunk boundaries within a half, host i32
  runtime::Tensor ones;                        // [T, 1] f32, for bias broadcasts (QKV bias only)
  std::vector<float> target_logit;             // [T] on the host, after the cross-entropy
};

// What the backward of one layer needs from its forward.
// (x_in, xn, rstd, x_mid: this rank's tokens under SP; xn_full and the rest: all tokens.)
struct Llama::LayerActs {
  runtime::Tensor x_in, xn1, xn1_full, rstd1, q, k, v, o, lse, x_mid, xn2, xn2_full, rstd2, gate, up, act;
};

// A layer's step over the KV cache (generation): its keys and values go to `slots` of
// layer `layer`'s cache; with `decode`, attention reads the cache instead of the batch.
struct Llama::CacheStep {
  KvCache* cache;
  int64_t layer;
  runtime::Tensor slots;  // i32 [T], on the host or the device
  const DecodeView* decode;
};

}  // namespace tessera::model
