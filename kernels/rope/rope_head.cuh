// One attention head's q/k pass on CUDA, a warp per head: Qwen3's per-head RMSNorm (when
// given) then RoPE, each rounded to T, exactly as kernels/rmsnorm and kernels/rope round
// them. Lane l holds elements [l * E, (l + 1) * E) of the head (D = 32 * E), so a RoPE
// pair (i, i + D/2) sits in lanes l and l ^ 16. Shared by the fused q/k pass
// (kernels/decode) and the paged decode attention that rotates its own queries and key
// (kernels/paged_attention), so both round alike.
#pragma once
#include <cstdint>

#include "kernels/common/cuda_elem.cuh"
#include "kernels/rope/rope_angle.cuh"

namespace tessera::kernels {

// The sines and cosines of the lane's E RoPE angles at position pos: the same for every
// head of a token, so a kernel that rotates several heads of one token (or reads pos
// before its inputs are ready) forms them once.
template <int E>
struct LaneAngles {
  float s[E], c[E];
};
template <int E>
__device__ __forceinline__ LaneAngles<E> RopeLaneAngles(int32_t pos, const InvFreq& inv) {
  const int lane = threadIdx.x % 32;
  LaneAngles<E> a;
#pragma unroll
  for (int j = 0; j < E; ++j) SinCos(pos, inv.v[(lane & 15) * E + j], inv.scale, 1.f, &a.s[j], &a.c[j]);
  return a;
}

// x: the lane's raw elements (f32 values of T); g: the lane's norm weights (norm only);
// a: the lane's angles (RopeLaneAngles) at the token's position.
template <typename T, int E>
__device__ __forceinline__ void NormRopeHead(float (&x)[E], const float (&g)[E], bool norm, float eps, const LaneAngles<E>& a,
                                             T (&y)[E]) {
  constexpr int D = 32 * E;
  const int lane = threadIdx.x % 32;
  if (norm) {  // as kernels/rmsnorm: y = round(x * rstd * w)
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < E; ++j) ss += x[j] * x[j];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float rs = rsqrtf(ss / D + eps);
#pragma unroll
    for (int j = 0; j < E; ++j) x[j] = ToF(FromF<T>(x[j] * rs * g[j]));
  }
  const bool second = lane >= 16;
#pragma unroll
  for (int j = 0; j < E; ++j) {
    const float partner = __shfl_xor_sync(0xffffffffu, x[j], 16);
    // First half: x_i c - x_{i+d/2} s; second half: x_{i+d/2} c + x_i s (kernels/rope).
    y[j] = FromF<T>(second ? x[j] * a.c[j] + partner * a.s[j] : x[j] * a.c[j] - partner * a.s[j]);
  }
}
template <typename T, int E>
__device__ __forceinline__ void NormRopeHead(float (&x)[E], const float (&g)[E], bool norm, float eps, int32_t pos,
                                             const InvFreq& inv, T (&y)[E]) {
  NormRopeHead<T, E>(x, g, norm, eps, RopeLaneAngles<E>(pos, inv), y);
}

}  // namespace tessera::kernels
