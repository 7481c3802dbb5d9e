// RoPE on CUDA. Angles are computed in double (pos * base^(-2i/d) reaches 10^4 rad at
// long context, where f32 sin/cos would lose ~1e-3), the rotation in f32.
#include "kernels/common/cuda_elem.cuh"
#include "kernels/rope/rope.h"

#include <cmath>

namespace tessera::kernels {
namespace {
template <typename T>
__global__ void Rope(const T* x, const int32_t* pos, T* y, int64_t tokens, int64_t heads, int64_t dim, double log_base,
                     float sign) {
  const int64_t half = dim / 2, total = tokens * heads * half;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    int64_t i = k % half, th = k / half, tok = th / heads;
    double ang = pos[tok] * exp(-2.0 * i / dim * log_base);
    double sd, cd;
    sincos(ang, &sd, &cd);
    float c = float(cd), s = sign * float(sd);
    int64_t o = th * dim;
    float a = ToF(x[o + i]), b = ToF(x[o + i + half]);
    y[o + i] = FromF<T>(a * c - b * s);
    y[o + i + half] = FromF<T>(b * c + a * s);
  }
}
}  // namespace

absl::Status RopeCuda(const void* x, const int32_t* pos, void* y, int64_t tokens, int64_t heads, int64_t dim, float base,
                      float sign, DType t, void* stream) {
  int64_t total = tokens * heads * (dim / 2);
  if (total == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  double lb = std::log(static_cast<double>(base));
  if (t == DType::kF32)
    Rope<<<GridFor(total, 256), 256, 0, s>>>(static_cast<const float*>(x), pos, static_cast<float*>(y), tokens, heads, dim, lb, sign);
  else
    Rope<<<GridFor(total, 256), 256, 0, s>>>(static_cast<const __nv_bfloat16*>(x), pos, static_cast<__nv_bfloat16*>(y), tokens,
                                             heads, dim, lb, sign);
  return LaunchStatus("rope");
}
}  // namespace tessera::kernels
