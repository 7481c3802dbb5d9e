#include <cmath>

#include "kernels/adamw/adamw.h"
#include "kernels/common/cuda_elem.cuh"

namespace tessera::kernels {
namespace {
template <typename G>
__global__ void Step(float* p, const G* g, float* m, float* v, __nv_bfloat16* lowp, int64_t n, float lr, float b1, float b2,
                     float eps, float wd, float inv_bc1, float inv_sqrt_bc2) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float gv = ToF(g[i]);
    float mi = b1 * m[i] + (1.f - b1) * gv;
    float vi = b2 * v[i] + (1.f - b2) * gv * gv;
    m[i] = mi;
    v[i] = vi;
    float pi = p[i];
    pi -= lr * ((mi * inv_bc1) / (sqrtf(vi) * inv_sqrt_bc2 + eps) + wd * pi);
    p[i] = pi;
    if (lowp) lowp[i] = __float2bfloat16_rn(pi);
  }
}
}  // namespace

absl::Status AdamWCuda(float* p, const void* g, DType gt, float* m, float* v, uint16_t* p_bf16, int64_t n,
                       const AdamWArgs& a, void* stream) {
  if (n == 0) return absl::OkStatus();
  double bc1 = 1.0 - std::pow(double(a.beta1), double(a.step));
  double bc2 = 1.0 - std::pow(double(a.beta2), double(a.step));
  auto s = static_cast<cudaStream_t>(stream);
  auto* lowp = reinterpret_cast<__nv_bfloat16*>(p_bf16);
  float ib1 = float(1.0 / bc1), isb2 = float(1.0 / std::sqrt(bc2));
  if (gt == DType::kF32)
    Step<<<GridFor(n, 256), 256, 0, s>>>(p, static_cast<const float*>(g), m, v, lowp, n, a.lr, a.beta1, a.beta2, a.eps,
                                         a.weight_decay, ib1, isb2);
  else
    Step<<<GridFor(n, 256), 256, 0, s>>>(p, static_cast<const __nv_bfloat16*>(g), m, v, lowp, n, a.lr, a.beta1, a.beta2,
                                         a.eps, a.weight_decay, ib1, isb2);
  return LaunchStatus("adamw");
}
}  // namespace tessera::kernels
