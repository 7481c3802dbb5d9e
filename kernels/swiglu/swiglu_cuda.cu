#include "kernels/common/cuda_elem.cuh"
#include "kernels/swiglu/swiglu.h"

#include <algorithm>
#include <cstdint>

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
__global__ void Backward(const T* dy, const T* g, const T* u, T* dg, T* du, int64_t n, T* y) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float gv = ToF(g[i]), uv = ToF(u[i]), d = ToF(dy[i]);
    float s = 1.f / (1.f + __expf(-gv));
    dg[i] = FromF<T>(d * uv * s * (1.f + gv * (1.f - s)));
    du[i] = FromF<T>(d * gv * s);
    if (y != nullptr) y[i] = FromF<T>(gv * s * uv);  // as Forward
  }
}
// 16-byte vectors: 8 bf16 per load.
__device__ __forceinline__ float Silu(float g) { return g / (1.f + __expf(-g)); }

// Two independent vectors per thread and one pass over the grid (no grid-stride loop):
// every load is issued before any arithmetic, and all CTAs are resident-or-queued at once.
__global__ void ForwardVec(const uint4* g, const uint4* u, uint4* y, int64_t nvec) {
  constexpr int kPer = 2;
  const int64_t i0 = (blockIdx.x * int64_t(blockDim.x)) * kPer + threadIdx.x;
  uint4 gv[kPer], uv[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = i0 + k * blockDim.x;
    if (i < nvec) gv[k] = __ldcs(g + i), uv[k] = __ldcs(u + i);
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = i0 + k * blockDim.x;
    if (i >= nvec) break;
    uint4 out;
    const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gv[k]);
    const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&uv[k]);
    __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float2 gf = __bfloat1622float2(g2[e]), uf = __bfloat1622float2(u2[e]);
      o2[e] = __floats2bfloat162_rn(Silu(gf.x) * uf.x, Silu(gf.y) * uf.y);
    }
    __stcs(y + i, out);
  }
}

__global__ void BackwardVec(const uint4* dy, const uint4* g, const uint4* u, uint4* dg, uint4* du, int64_t nvec,
                            uint4* y) {
  constexpr int kPer = 2;
  const int64_t i0 = (blockIdx.x * int64_t(blockDim.x)) * kPer + threadIdx.x;
  uint4 dv[kPer], gv[kPer], uv[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = i0 + k * blockDim.x;
    if (i < nvec) dv[k] = __ldcs(dy + i), gv[k] = __ldcs(g + i), uv[k] = __ldcs(u + i);
  }
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int64_t i = i0 + k * blockDim.x;
    if (i >= nvec) break;
    uint4 og, ou, oy;
    const __nv_bfloat162 *d2 = reinterpret_cast<const __nv_bfloat162*>(&dv[k]),
                        *g2 = reinterpret_cast<const __nv_bfloat162*>(&gv[k]),
                        *u2 = reinterpret_cast<const __nv_bfloat162*>(&uv[k]);
    __nv_bfloat162 *og2 = reinterpret_cast<__nv_bfloat162*>(&og), *ou2 = reinterpret_cast<__nv_bfloat162*>(&ou),
                   *oy2 = reinterpret_cast<__nv_bfloat162*>(&oy);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 df = __bfloat1622float2(d2[e]), gf = __bfloat1622float2(g2[e]), uf = __bfloat1622float2(u2[e]);
      const float sx = 1.f / (1.f + __expf(-gf.x)), sy = 1.f / (1.f + __expf(-gf.y));
      og2[e] = __floats2bfloat162_rn(df.x * uf.x * sx * (1.f + gf.x * (1.f - sx)), df.y * uf.y * sy * (1.f + gf.y * (1.f - sy)));
      ou2[e] = __floats2bfloat162_rn(df.x * gf.x * sx, df.y * gf.y * sy);
      if (y != nullptr) oy2[e] = __floats2bfloat162_rn(Silu(gf.x) * uf.x, Silu(gf.y) * uf.y);  // as ForwardVec
    }
    __stcs(dg + i, og);
    __stcs(du + i, ou);
    if (y != nullptr) __stcs(y + i, oy);
  }
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
}  // namespace

absl::Status SwiGluForwardCuda(const void* g, const void* u, void* y, int64_t n, DType t, void* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  using bf = __nv_bfloat16;
  if (t == DType::kBF16 && n % 8 == 0 && Aligned16(g) && Aligned16(u) && Aligned16(y)) {
    const int64_t nvec = n / 8, per_block = 256 * 2;
    ForwardVec<<<static_cast<unsigned>((nvec + per_block - 1) / per_block), 256, 0, s>>>(
        static_cast<const uint4*>(g), static_cast<const uint4*>(u), static_cast<uint4*>(y), nvec);
    return LaunchStatus("swiglu_forward");
  }
  if (t == DType::kF32) Forward<<<GridFor(n, 256), 256, 0, s>>>(static_cast<const float*>(g), static_cast<const float*>(u), static_cast<float*>(y), n);
  else Forward<<<GridFor(n, 256), 256, 0, s>>>(static_cast<const bf*>(g), static_cast<const bf*>(u), static_cast<bf*>(y), n);
  return LaunchStatus("swiglu_forward");
}

absl::Status SwiGluBackwardCuda(const void* dy, const void* g, const void* u, void* dg, void* du, int64_t n, DType t,
                                void* stream, void* y) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  using bf = __nv_bfloat16;
  if (t == DType::kBF16 && n % 8 == 0 && Aligned16(dy) && Aligned16(g) && Aligned16(u) && Aligned16(dg) && Aligned16(du) &&
      Aligned16(y)) {
    const int64_t nvec = n / 8, per_block = 256 * 2;
    BackwardVec<<<static_cast<unsigned>((nvec + per_block - 1) / per_block), 256, 0, s>>>(
        static_cast<const uint4*>(dy), static_cast<const uint4*>(g), static_cast<const uint4*>(u), static_cast<uint4*>(dg),
        static_cast<uint4*>(du), nvec, static_cast<uint4*>(y));
    return LaunchStatus("swiglu_backward");
  }
  if (t == DType::kF32)
    Backward<<<GridFor(n, 256), 256, 0, s>>>(static_cast<const float*>(dy), static_cast<const float*>(g), static_cast<const float*>(u),
                                             static_cast<float*>(dg), static_cast<float*>(du), n, static_cast<float*>(y));
  else
    Backward<<<GridFor(n, 256), 256, 0, s>>>(static_cast<const bf*>(dy), static_cast<const bf*>(g), static_cast<const bf*>(u),
                                             static_cast<bf*>(dg), static_cast<bf*>(du), n, static_cast<bf*>(y));
  return LaunchStatus("swiglu_backward");
}
}  // namespace tessera::kernels
