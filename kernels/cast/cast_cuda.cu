#include "kernels/cast/cast.h"
#include "kernels/common/cuda_elem.cuh"

namespace tessera::kernels {
namespace {
template <typename I, typename O>
__global__ void CastKernel(const I* x, O* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = FromF<O>(ToF(x[i]));
}
}  // namespace

absl::Status CastCuda(const void* x, DType xt, void* y, DType yt, int64_t n, void* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  unsigned g = GridFor(n, 256);
  using bf = __nv_bfloat16;
  if (xt == DType::kF32 && yt == DType::kBF16) CastKernel<<<g, 256, 0, s>>>(static_cast<const float*>(x), static_cast<bf*>(y), n);
  else if (xt == DType::kBF16 && yt == DType::kF32) CastKernel<<<g, 256, 0, s>>>(static_cast<const bf*>(x), static_cast<float*>(y), n);
  else if (xt == DType::kF32) CastKernel<<<g, 256, 0, s>>>(static_cast<const float*>(x), static_cast<float*>(y), n);
  else CastKernel<<<g, 256, 0, s>>>(static_cast<const bf*>(x), static_cast<bf*>(y), n);
  return LaunchStatus("cast");
}
}  // namespace tessera::kernels
