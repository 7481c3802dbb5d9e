// Casts between f32, bf16 and f16 (round to nearest even), one grid-stride kernel per pair.
#include "kernels/cast/cast.h"
#include "kernels/common/cuda_elem.cuh"

namespace tessera::kernels {
namespace {
template <typename I, typename O>
__global__ void CastKernel(const I* x, O* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = FromF<O>(ToF(x[i]));
}

template <typename I>
void CastFrom(const I* x, DType yt, void* y, int64_t n, unsigned g, cudaStream_t s) {
  if (yt == DType::kF32) CastKernel<<<g, 256, 0, s>>>(x, static_cast<float*>(y), n);
  else if (yt == DType::kF16) CastKernel<<<g, 256, 0, s>>>(x, static_cast<__half*>(y), n);
  else CastKernel<<<g, 256, 0, s>>>(x, static_cast<__nv_bfloat16*>(y), n);
}
}  // namespace

absl::Status CastCuda(const void* x, DType xt, void* y, DType yt, int64_t n, void* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  const unsigned g = GridFor(n, 256);
  if (xt == DType::kF32) CastFrom(static_cast<const float*>(x), yt, y, n, g, s);
  else if (xt == DType::kF16) CastFrom(static_cast<const __half*>(x), yt, y, n, g, s);
  else CastFrom(static_cast<const __nv_bfloat16*>(x), yt, y, n, g, s);
  return LaunchStatus("cast");
}
}  // namespace tessera::kernels
