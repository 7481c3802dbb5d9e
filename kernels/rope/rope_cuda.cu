// RoPE on CUDA. Angles reach 10^4 rad at long context, where forming them in f32 would
// lose ~1e-3: they are formed and range-reduced in double, then sin/cos run in f32.
#include "kernels/common/cuda_elem.cuh"
#include "kernels/rope/rope.h"

#include <cmath>

namespace tessera::kernels {
namespace {
// One thread per (token, frequency): the angle pos * base^(-2i/d) is formed and reduced to
// [-pi, pi] in double (exact enough at positions of 10^5), then sin/cos in f32 once and
// reused for every head.
template <typename T>
__global__ void Rope(const T* x, const int32_t* pos, T* y, int64_t tokens, int64_t heads, int64_t dim, double log_base,
                     float sign) {
  const int64_t half = dim / 2, total = tokens * half;
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = k % half, tok = k / half;
    const double ang = pos[tok] * exp(-2.0 * i / dim * log_base);
    const float r = static_cast<float>(ang - kTwoPi * rint(ang / kTwoPi));
    float sf, cf;
    sincosf(r, &sf, &cf);
    sf *= sign;
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t o = (tok * heads + h) * dim;
      const float a = ToF(x[o + i]), b = ToF(x[o + i + half]);
      y[o + i] = FromF<T>(a * cf - b * sf);
      y[o + i + half] = FromF<T>(b * cf + a * sf);
    }
  }
}
}  // namespace

absl::Status RopeCuda(const void* x, const int32_t* pos, void* y, int64_t tokens, int64_t heads, int64_t dim, float base,
                      float sign, DType t, void* stream) {
  int64_t total = tokens * (dim / 2);
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
