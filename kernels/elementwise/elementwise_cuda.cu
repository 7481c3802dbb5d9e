// y = alpha * x + beta * y on CUDA: grid-stride, f32 arithmetic, one rounding into y.
#include "kernels/common/cuda_elem.cuh"
#include "kernels/elementwise/elementwise.h"

namespace tessera::kernels {
namespace {
template <typename Tx, typename Ty>
__global__ void Axpby(float alpha, const Tx* x, float beta, Ty* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float yv = beta == 0.f ? 0.f : beta * ToF(y[i]);  // beta == 0 never reads y
    y[i] = FromF<Ty>(alpha * ToF(x[i]) + yv);
  }
}
template <typename Tx>
absl::Status Launch(float alpha, const Tx* x, float beta, void* y, DType ty, int64_t n, cudaStream_t s) {
  if (ty == DType::kF32) Axpby<<<GridFor(n, 256), 256, 0, s>>>(alpha, x, beta, static_cast<float*>(y), n);
  else Axpby<<<GridFor(n, 256), 256, 0, s>>>(alpha, x, beta, static_cast<__nv_bfloat16*>(y), n);
  return LaunchStatus("axpby");
}
__global__ void Select(const int32_t* src, const int32_t* from, const int32_t* values, int32_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = src[i] >= 0 ? from[src[i]] : values[i];
}
}  // namespace

absl::Status SelectCuda(const int32_t* src, const int32_t* from, const int32_t* values, int32_t* out, int64_t n,
                        void* stream) {
  if (n == 0) return absl::OkStatus();
  Select<<<GridFor(n, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(src, from, values, out, n);
  return LaunchStatus("select");
}

absl::Status AxpbyCuda(float alpha, const void* x, DType tx, float beta, void* y, DType ty, int64_t n, void* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  if (tx == DType::kF32) return Launch(alpha, static_cast<const float*>(x), beta, y, ty, n, s);
  return Launch(alpha, static_cast<const __nv_bfloat16*>(x), beta, y, ty, n, s);
}

}  // namespace tessera::kernels
