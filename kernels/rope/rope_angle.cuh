// RoPE's angles on CUDA, shared by kernels/rope and the decode step's fused q/k pass
// (kernels/decode): the host's table of frequencies travels by value, and every kernel
// forms sin and cos the same way, so a fused rotation equals the plain one.
#pragma once
#include <cstdint>

#include "kernels/rope/rope.h"

namespace tessera::kernels {

struct InvFreq {  // the host's table of frequencies (rope.h), passed by value
  float v[kRopeMaxHeadDim / 2];
  float scale;
};

// sin and cos of the f32 angle f32(p) * inv, reduced to [-pi, pi] in double, times scale.
__device__ __forceinline__ void SinCos(int32_t p, float inv, float scale, float sign, float* s, float* c) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  const double ang = __fmul_rn(static_cast<float>(p), inv);
  sincosf(static_cast<float>(ang - kTwoPi * rint(ang / kTwoPi)), s, c);
  *s *= sign * scale;
  *c *= scale;
}

}  // namespace tessera::kernels
