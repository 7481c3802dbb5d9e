// Fused AdamW on f32 master params (decoupled weight decay, bias correction):
//   g = grad_scale * grad (global-norm clipping, fused);
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//   p -= lr * ( (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps) + wd * p )
// grad is f32 or bf16; if p_bf16 is non-null it receives the updated params in bf16.
#pragma once
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace tessera::kernels {
struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;
  float grad_scale = 1.f;
};
absl::Status AdamWCpu(float* p, const void* g, DType gt, float* m, float* v, uint16_t* p_bf16, int64_t n, const AdamWArgs& a);
absl::Status AdamWCuda(float* p, const void* g, DType gt, float* m, float* v, uint16_t* p_bf16, int64_t n,
                       const AdamWArgs& a, void* stream);
}  // namespace tessera::kernels
