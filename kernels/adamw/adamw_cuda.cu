#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kernels/adamw/adamw.h"
#include "kernels/common/cuda_elem.cuh"

namespace tessera::kernels {
namespace {
// The update of one element; shared by the scalar and the vector kernels.
__device__ __forceinline__ float Update(float gv, float& mi, float& vi, float pi, float lr, float b1, float b2, float eps,
                                        float wd, float inv_bc1, float inv_sqrt_bc2, float gs) {
  gv *= gs;
  mi = b1 * mi + (1.f - b1) * gv;
  vi = b2 * vi + (1.f - b2) * gv * gv;
  return pi - lr * ((mi * inv_bc1) / (sqrtf(vi) * inv_sqrt_bc2 + eps) + wd * pi);
}

// 16-byte-aligned p/m/v and 8-byte-aligned bf16 grad and output: 4 elements per vector,
// kUnroll vectors per thread per pass with every load issued before the first update
// (the op is DRAM-bound: more bytes in flight per thread), streaming cache hints since
// nothing here is read again.
constexpr int kUnroll = 2;
template <typename G>
__global__ void __launch_bounds__(256) StepVec4(float4* p, const G* g, float4* m, float4* v, uint2* lowp, int64_t nvec,
                                                float lr, float b1, float b2, float eps, float wd, float inv_bc1,
                                                float inv_sqrt_bc2, float gs) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t base = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; base < nvec; base += stride * kUnroll) {
    float4 pv[kUnroll], mv[kUnroll], vv[kUnroll], gv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * stride;
      if (i >= nvec) break;
      pv[u] = __ldcs(p + i), mv[u] = __ldcs(m + i), vv[u] = __ldcs(v + i);
      if constexpr (std::is_same_v<G, float4>) {
        gv[u] = __ldcs(g + i);
      } else {
        const uint2 raw = __ldcs(g + i);
        const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x)),
                     hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
        gv[u] = make_float4(lo.x, lo.y, hi.x, hi.y);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * stride;
      if (i >= nvec) break;
      float4 q = pv[u], a = mv[u], s = vv[u];
      const float4 gr = gv[u];
      q.x = Update(gr.x, a.x, s.x, q.x, lr, b1, b2, eps, wd, inv_bc1, inv_sqrt_bc2, gs);
      q.y = Update(gr.y, a.y, s.y, q.y, lr, b1, b2, eps, wd, inv_bc1, inv_sqrt_bc2, gs);
      q.z = Update(gr.z, a.z, s.z, q.z, lr, b1, b2, eps, wd, inv_bc1, inv_sqrt_bc2, gs);
      q.w = Update(gr.w, a.w, s.w, q.w, lr, b1, b2, eps, wd, inv_bc1, inv_sqrt_bc2, gs);
      __stcs(p + i, q), __stcs(m + i, a), __stcs(v + i, s);
      if (lowp) {
        const __nv_bfloat162 lo = __floats2bfloat162_rn(q.x, q.y), hi = __floats2bfloat162_rn(q.z, q.w);
        __stcs(lowp + i, make_uint2(*reinterpret_cast<const unsigned*>(&lo), *reinterpret_cast<const unsigned*>(&hi)));
      }
    }
  }
}

template <typename G>
__global__ void Step(float* p, const G* g, float* m, float* v, __nv_bfloat16* lowp, int64_t n, float lr, float b1, float b2,
                     float eps, float wd, float inv_bc1, float inv_sqrt_bc2, float gs) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float mi = m[i], vi = v[i];
    const float pi = Update(ToF(g[i]), mi, vi, p[i], lr, b1, b2, eps, wd, inv_bc1, inv_sqrt_bc2, gs);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
    if (lowp) lowp[i] = __float2bfloat16_rn(pi);
  }
}

bool Aligned(const void* p, uintptr_t to) { return (reinterpret_cast<uintptr_t>(p) & (to - 1)) == 0; }
}  // namespace

absl::Status AdamWCuda(float* p, const void* g, DType gt, float* m, float* v, uint16_t* p_bf16, int64_t n,
                       const AdamWArgs& a, void* stream) {
  if (n == 0) return absl::OkStatus();
  double bc1 = 1.0 - std::pow(double(a.beta1), double(a.step));
  double bc2 = 1.0 - std::pow(double(a.beta2), double(a.step));
  auto s = static_cast<cudaStream_t>(stream);
  auto* lowp = reinterpret_cast<__nv_bfloat16*>(p_bf16);
  float ib1 = float(1.0 / bc1), isb2 = float(1.0 / std::sqrt(bc2));
  const bool vec = n % 4 == 0 && Aligned(p, 16) && Aligned(m, 16) && Aligned(v, 16) &&
                   Aligned(g, gt == DType::kF32 ? 16 : 8) && (lowp == nullptr || Aligned(lowp, 8));
  if (vec) {
    const int64_t nvec = n / 4;
    // A few resident waves' worth of CTAs; each thread then strides over the rest.
    const int64_t want = (nvec + 256 * kUnroll - 1) / (256 * kUnroll), cap = int64_t(SmCount()) * 8 * 4;
    const unsigned blocks = static_cast<unsigned>(want < cap ? want : cap);
    auto* lo = reinterpret_cast<uint2*>(lowp);
    if (gt == DType::kF32)
      StepVec4<<<blocks, 256, 0, s>>>(reinterpret_cast<float4*>(p), static_cast<const float4*>(g),
                                      reinterpret_cast<float4*>(m), reinterpret_cast<float4*>(v), lo, nvec, a.lr, a.beta1,
                                      a.beta2, a.eps, a.weight_decay, ib1, isb2, a.grad_scale);
    else
      StepVec4<<<blocks, 256, 0, s>>>(reinterpret_cast<float4*>(p), static_cast<const uint2*>(g),
                                      reinterpret_cast<float4*>(m), reinterpret_cast<float4*>(v), lo, nvec, a.lr, a.beta1,
                                      a.beta2, a.eps, a.weight_decay, ib1, isb2, a.grad_scale);
    return LaunchStatus("adamw");
  }
  if (gt == DType::kF32)
    Step<<<GridFor(n, 256), 256, 0, s>>>(p, static_cast<const float*>(g), m, v, lowp, n, a.lr, a.beta1, a.beta2, a.eps,
                                         a.weight_decay, ib1, isb2, a.grad_scale);
  else
    Step<<<GridFor(n, 256), 256, 0, s>>>(p, static_cast<const __nv_bfloat16*>(g), m, v, lowp, n, a.lr, a.beta1, a.beta2,
                                         a.eps, a.weight_decay, ib1, isb2, a.grad_scale);
  return LaunchStatus("adamw");
}
}  // namespace tessera::kernels
