// RoPE on CUDA. The angle is f32(pos) * inv_freq rounded to f32 (rope.h); it reaches 10^5
// rad at long context, so it is range-reduced in double before sin/cos run in f32.
#include "kernels/common/cuda_elem.cuh"
#include "kernels/rope/rope.h"
#include "kernels/rope/rope_angle.cuh"

#include <cmath>
#include <cstdint>

namespace tessera::kernels {
namespace {
// One thread per (token, frequency): sin/cos once, reused for every head.
template <typename T>
__global__ void Rope(const T* x, const int32_t* pos, T* y, int64_t tokens, int64_t heads, int64_t dim, InvFreq inv,
                     float sign, int64_t x_row, int64_t y_row) {
  const int64_t half = dim / 2, total = tokens * half;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < total; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = k % half, tok = k / half;
    float sf, cf;
    SinCos(pos[tok], inv.v[i], inv.scale, sign, &sf, &cf);
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t ox = tok * x_row + h * dim, oy = tok * y_row + h * dim;
      const float a = ToF(x[ox + i]), b = ToF(x[ox + i + half]);
      y[oy + i] = FromF<T>(a * cf - b * sf);
      y[oy + i + half] = FromF<T>(b * cf + a * sf);
    }
  }
}

// bf16 with dim % 16 == 0: one thread per (token, 8 consecutive frequencies, group of
// kRopeHeads heads) rotates its heads with 16-byte loads and stores of both halves. All of
// its loads are issued before the angles are formed (SinCos), which hides under the
// latency.
template <int kRopeHeads>
__global__ void RopeBf16Vec(const __nv_bfloat16* x, const int32_t* pos, __nv_bfloat16* y, int64_t tokens, int heads,
                            int dim, InvFreq inv, float sign, int64_t x_row, int64_t y_row) {
  const int half = dim / 2, chunks = half / 8, groups = (heads + kRopeHeads - 1) / kRopeHeads;
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < tokens * chunks * groups;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(k % chunks), h0 = static_cast<int>(k / chunks % groups) * kRopeHeads;
    const int64_t tok = k / chunks / groups;
    const int64_t xb = tok * x_row + c * 8, yb0 = tok * y_row + c * 8;
    uint4 a[kRopeHeads], b[kRopeHeads];
#pragma unroll
    for (int u = 0; u < kRopeHeads; ++u)
      if (h0 + u < heads) {
        a[u] = __ldcs(reinterpret_cast<const uint4*>(x + xb + int64_t(h0 + u) * dim));
        b[u] = __ldcs(reinterpret_cast<const uint4*>(x + xb + int64_t(h0 + u) * dim + half));
      }
    const int32_t p = pos[tok];
    float cs[8], sn[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) SinCos(p, inv.v[c * 8 + e], inv.scale, sign, &sn[e], &cs[e]);
#pragma unroll
    for (int u = 0; u < kRopeHeads; ++u) {
      if (h0 + u >= heads) break;
      const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a[u]);
      const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&b[u]);
      uint4 ya, yb;
      __nv_bfloat162* ya2 = reinterpret_cast<__nv_bfloat162*>(&ya);
      __nv_bfloat162* yb2 = reinterpret_cast<__nv_bfloat162*>(&yb);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 av = __bfloat1622float2(a2[e]), bv = __bfloat1622float2(b2[e]);
        const float c0 = cs[2 * e], c1 = cs[2 * e + 1], s0 = sn[2 * e], s1 = sn[2 * e + 1];
        ya2[e] = __floats2bfloat162_rn(av.x * c0 - bv.x * s0, av.y * c1 - bv.y * s1);
        yb2[e] = __floats2bfloat162_rn(bv.x * c0 + av.x * s0, bv.y * c1 + av.y * s1);
      }
      __stcs(reinterpret_cast<uint4*>(y + yb0 + int64_t(h0 + u) * dim), ya);
      __stcs(reinterpret_cast<uint4*>(y + yb0 + int64_t(h0 + u) * dim + half), yb);
    }
  }
}

// Heads per thread and block size of RopeBf16Vec. The defaults are the fastest of a sweep
// (bench/variants, H200, 16384 x 32 x 64): 2 heads 3.82 TB/s, 4: 3.77, 8: 3.63, 16: 3.55
// (fewer heads per thread: more threads, a shorter tail). Overridable for such sweeps.
#ifndef TESSERA_ROPE_HEADS
#define TESSERA_ROPE_HEADS 2
#endif
#ifndef TESSERA_ROPE_BLOCK
#define TESSERA_ROPE_BLOCK 128
#endif
bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }
}  // namespace

absl::Status RopeCuda(const void* x, const int32_t* pos, void* y, int64_t tokens, int64_t heads, int64_t dim,
                      const float* inv_freq, float scale, float sign, DType t, void* stream, int64_t x_row, int64_t y_row) {
  int64_t total = tokens * (dim / 2);
  if (total == 0) return absl::OkStatus();
  if (dim > kRopeMaxHeadDim) return absl::InvalidArgumentError("rope: head dim above kRopeMaxHeadDim");
  auto s = static_cast<cudaStream_t>(stream);
  InvFreq inv{};
  for (int64_t i = 0; i < dim / 2; ++i) inv.v[i] = inv_freq[i];
  inv.scale = scale;
  if (t == DType::kBF16 && dim % 16 == 0 && Aligned16(x) && Aligned16(y) && heads < (1 << 30) &&
      x_row % 8 == 0 && y_row % 8 == 0) {  // 16-byte rows
    constexpr int kRopeHeads = TESSERA_ROPE_HEADS, kBlock = TESSERA_ROPE_BLOCK;
    const int64_t threads = tokens * (dim / 16) * ((heads + kRopeHeads - 1) / kRopeHeads);
    RopeBf16Vec<kRopeHeads><<<GridFor(threads, kBlock), kBlock, 0, s>>>(static_cast<const __nv_bfloat16*>(x), pos,
                                                      static_cast<__nv_bfloat16*>(y), tokens, static_cast<int>(heads),
                                                      static_cast<int>(dim), inv, sign, x_row, y_row);
    return LaunchStatus("rope");
  }
  if (t == DType::kF32)
    Rope<<<GridFor(total, 256), 256, 0, s>>>(static_cast<const float*>(x), pos, static_cast<float*>(y), tokens, heads, dim, inv,
                                             sign, x_row, y_row);
  else
    Rope<<<GridFor(total, 256), 256, 0, s>>>(static_cast<const __nv_bfloat16*>(x), pos, static_cast<__nv_bfloat16*>(y), tokens,
                                             heads, dim, inv, sign, x_row, y_row);
  return LaunchStatus("rope");
}
}  // namespace tessera::kernels
