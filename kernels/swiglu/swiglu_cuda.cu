#include "kernels/common/cuda_elem.cuh"
#include "kernels/swiglu/swiglu.h"

namespace tessera::kernels {
namespace {
template <typename T>
__global__ void Forward(const T* g, const T* u, T* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float gv = ToF(g[i]);
    float s = 1.f / (1.f + __expf(-gv));
    y[i] = FromF<T>(gv * s * ToF(u[i]));
  }
}
template <typename T>
__global__ void Backward(const T* dy, const T* g, const T* u, T* dg, T* du, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float gv = ToF(g[i]), uv = ToF(u[i]), d = ToF(dy[i]);
    float s = 1.f / (1.f + __expf(-gv));
    dg[i] = FromF<T>(d * uv * s * (1.f + gv * (1.f - s)));
    du[i] = FromF<T>(d * gv * s);
  }
}
}  // namespace

absl::Status SwiGluForwardCuda(const void* g, const void* u, void* y, int64_t n, DType t, void* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  using bf = __nv_bfloat16;
  if (t == DType::kF32) Forward<<<GridFor(n, 256), 256, 0, s>>>(static_cast<const float*>(g), static_cast<const float*>(u), static_cast<float*>(y), n);
  else Forward<<<GridFor(n, 256), 256, 0, s>>>(static_cast<const bf*>(g), static_cast<const bf*>(u), static_cast<bf*>(y), n);
  return LaunchStatus("swiglu_forward");
}

absl::Status SwiGluBackwardCuda(const void* dy, const void* g, const void* u, void* dg, void* du, int64_t n, DType t,
                                void* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  using bf = __nv_bfloat16;
  if (t == DType::kF32)
    Backward<<<GridFor(n, 256), 256, 0, s>>>(static_cast<const float*>(dy), static_cast<const float*>(g), static_cast<const float*>(u),
                                             static_cast<float*>(dg), static_cast<float*>(du), n);
  else
    Backward<<<GridFor(n, 256), 256, 0, s>>>(static_cast<const bf*>(dy), static_cast<const bf*>(g), static_cast<const bf*>(u),
                                             static_cast<bf*>(dg), static_cast<bf*>(du), n);
  return LaunchStatus("swiglu_backward");
}
}  // namespace tessera::kernels
