// RMSNorm on CUDA: one block per row, f32 accumulation, warp-shuffle reductions.
// Backward: bf16 rows of up to 2048 (multiple of 256) run a warp per row for dx and
// per-CTA column partials for dw (deterministic); others accumulate dw with atomics.
#include "common/status.h"
#include "kernels/common/cuda_elem.cuh"
#include "kernels/rmsnorm/rmsnorm.h"

#include <algorithm>
#include <cstdint>

namespace tessera::kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float BlockSum(float v) { return BlockReduce<kThreads>(v, SumOp()); }

template <typename T>
__global__ void Forward(const T* x, const T* w, T* y, float* rstd, int64_t cols, float eps) {
  const T* xr = x + blockIdx.x * cols;
  float ss = 0;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    float v = ToF(xr[c]);
    ss += v * v;
  }
  float rs = rsqrtf(BlockSum(ss) / cols + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = rs;
  T* yr = y + blockIdx.x * cols;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) yr[c] = FromF<T>(ToF(xr[c]) * rs * ToF(w[c]));
}

template <typename T>
__global__ void Backward(const T* dy, const T* x, const T* w, const float* rstd, T* dx, float* dw, int64_t cols) {
  const int64_t off = blockIdx.x * cols;
  const float rs = rstd[blockIdx.x];
  float dot = 0;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) dot += ToF(dy[off + c]) * ToF(w[c]) * ToF(x[off + c]);
  float coef = rs * rs * rs * BlockSum(dot) / cols;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    float g = ToF(dy[off + c]), xv = ToF(x[off + c]);
    dx[off + c] = FromF<T>(rs * g * ToF(w[c]) - xv * coef);
    atomicAdd(&dw[c], g * xv * rs);
  }
}

// 8 bf16 values in one 16-byte vector.
__device__ __forceinline__ float SumSqBf16x8(const uint4& x) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&x);
  float ss = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float2 f = __bfloat1622float2(h[j]);
    ss += f.x * f.x + f.y * f.y;
  }
  return ss;
}
__device__ __forceinline__ uint4 NormalizeBf16x8(const uint4& x, const uint4& w, float rs) {
  uint4 out;
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&x);
  const __nv_bfloat162* wh = reinterpret_cast<const __nv_bfloat162*>(&w);
  __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float2 f = __bfloat1622float2(h[j]), g = __bfloat1622float2(wh[j]);
    o[j] = __floats2bfloat162_rn(f.x * rs * g.x, f.y * rs * g.y);
  }
  return out;
}

// bf16 rows with cols % 8 == 0 and cols <= 256 * 8 * kMaxVec: each thread loads its
// 16-byte vectors once, keeps them in registers for the second pass, writes 16 bytes.
constexpr int kMaxVec = 4;
__global__ void ForwardVecBf16(const uint4* x, const uint4* w, uint4* y, float* rstd, int64_t cols, float eps) {
  const int64_t nvec = cols / 8;
  const uint4* xr = x + blockIdx.x * nvec;
  uint4 v[kMaxVec];
  float ss = 0;
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
    int64_t i = threadIdx.x + int64_t(k) * kThreads;
    if (i < nvec) {
      v[k] = xr[i];
      ss += SumSqBf16x8(v[k]);
    }
  }
  float rs = rsqrtf(BlockSum(ss) / cols + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = rs;
  uint4* yr = y + blockIdx.x * nvec;
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
    int64_t i = threadIdx.x + int64_t(k) * kThreads;
    if (i < nvec) {
      yr[i] = NormalizeBf16x8(v[k], w[i], rs);
    }
  }
}

// bf16 rows with cols % 256 == 0 and cols <= 32 * 8 * kWarpVec: one warp per row, 8
// rows per block, each lane issues all its 16-byte loads before the first use and the
// reduction is warp shuffles only (no block barriers between load and store).
constexpr int kWarpVec = 16;
template <int kVec>
__global__ void ForwardWarpRowBf16(const uint4* x, const uint4* w, uint4* y, float* rstd, int64_t rows, int64_t cols,
                                   float eps) {
  const int64_t row = blockIdx.x * int64_t(kThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int64_t nvec = cols / 8;
  const uint4* xr = x + row * nvec;
  uint4 v[kVec];
  float ss = 0;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    int64_t i = lane + 32 * k;
    if (i < nvec) v[k] = xr[i];
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    int64_t i = lane + 32 * k;
    if (i < nvec) {
      ss += SumSqBf16x8(v[k]);
    }
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffff, ss, o);
  const float rs = rsqrtf(ss / cols + eps);
  if (lane == 0) rstd[row] = rs;
  uint4* yr = y + row * nvec;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    int64_t i = lane + 32 * k;
    if (i < nvec) {
      yr[i] = NormalizeBf16x8(v[k], w[i], rs);
    }
  }
}

// Backward, bf16 rows with cols % 256 == 0 and cols <= 32 * 8 * kBwdVec. A CTA owns
// kBwdRows consecutive rows. Phase 1: a warp per row, dx from the row's dot(dy w, x) by
// warp shuffles. Phase 2: each thread owns 8 columns and sums dy x rstd over the CTA's
// rows (a second read of rows it just read, from L2) into the CTA's dw partial; DwReduce
// adds the partials (no global atomics, the same order every run).
constexpr int kBwdVec = 8, kBwdRows = 64;
__global__ void __launch_bounds__(kThreads) BackwardWarpRowBf16(const uint4* dy, const uint4* x, const uint4* w,
                                                                const float* rstd, uint4* dx, float* partial,
                                                                int64_t rows, int64_t cols) {
  const int lane = threadIdx.x & 31, nvec = static_cast<int>(cols / 8);
  const int64_t row0 = blockIdx.x * int64_t(kBwdRows), row_end = (rows < row0 + kBwdRows ? rows : row0 + kBwdRows);
  for (int64_t row = row0 + threadIdx.x / 32; row < row_end; row += kThreads / 32) {
    uint4 xv[kBwdVec], gv[kBwdVec], wv[kBwdVec];
#pragma unroll
    for (int k = 0; k < kBwdVec; ++k) {
      const int i = lane + 32 * k;
      if (i < nvec) xv[k] = x[row * nvec + i], gv[k] = dy[row * nvec + i], wv[k] = w[i];
    }
    const float rs = rstd[row];
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < kBwdVec; ++k) {
      if (lane + 32 * k >= nvec) break;
      const __nv_bfloat162 *x2 = reinterpret_cast<const __nv_bfloat162*>(&xv[k]),
                          *g2 = reinterpret_cast<const __nv_bfloat162*>(&gv[k]),
                          *w2 = reinterpret_cast<const __nv_bfloat162*>(&wv[k]);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 xf = __bfloat1622float2(x2[j]), gf = __bfloat1622float2(g2[j]), wf = __bfloat1622float2(w2[j]);
        dot += gf.x * wf.x * xf.x + gf.y * wf.y * xf.y;
      }
    }
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffff, dot, o);
    const float coef = rs * rs * rs * dot / cols;
#pragma unroll
    for (int k = 0; k < kBwdVec; ++k) {
      const int i = lane + 32 * k;
      if (i >= nvec) break;
      const __nv_bfloat162 *x2 = reinterpret_cast<const __nv_bfloat162*>(&xv[k]),
                          *g2 = reinterpret_cast<const __nv_bfloat162*>(&gv[k]),
                          *w2 = reinterpret_cast<const __nv_bfloat162*>(&wv[k]);
      uint4 out;
      __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 xf = __bfloat1622float2(x2[j]), gf = __bfloat1622float2(g2[j]), wf = __bfloat1622float2(w2[j]);
        o2[j] = __floats2bfloat162_rn(rs * gf.x * wf.x - xf.x * coef, rs * gf.y * wf.y - xf.y * coef);
      }
      __stcs(dx + row * nvec + i, out);
    }
  }
  // Phase 2: column partials of dw over this CTA's rows.
  for (int i = threadIdx.x; i < nvec; i += kThreads) {
    float acc[8] = {};
    for (int64_t row = row0; row < row_end; ++row) {
      const uint4 xq = x[row * nvec + i], gq = dy[row * nvec + i];
      const float rs = rstd[row];
      const __nv_bfloat162 *x2 = reinterpret_cast<const __nv_bfloat162*>(&xq),
                          *g2 = reinterpret_cast<const __nv_bfloat162*>(&gq);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 xf = __bfloat1622float2(x2[j]), gf = __bfloat1622float2(g2[j]);
        acc[2 * j] += gf.x * xf.x * rs;
        acc[2 * j + 1] += gf.y * xf.y * rs;
      }
    }
    float4* dst = reinterpret_cast<float4*>(partial + blockIdx.x * cols + i * 8);
    dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
  }
}

// dw[c] = sum over the CTAs' partials; a CTA per 32 columns, 8 rows of threads splitting
// the partials (coalesced 128-byte rows), combined in shared memory.
__global__ void __launch_bounds__(256) DwReduce(const float* partial, int blocks, int64_t cols, float* dw) {
  __shared__ float acc[8][33];
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  const int64_t c = blockIdx.x * int64_t(32) + tx;
  float s = 0.f;
  if (c < cols)
    for (int b = ty; b < blocks; b += 8) s += partial[b * cols + c];
  acc[ty][tx] = s;
  __syncthreads();
  if (ty == 0 && c < cols) {
    float t = 0.f;
#pragma unroll
    for (int k = 0; k < 8; ++k) t += acc[k][tx];
    dw[c] = t;
  }
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

absl::Status RmsNormForwardCuda(const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t cols, float eps,
                                DType t, void* stream) {
  if (rows == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  if (t == DType::kBF16 && cols % 256 == 0 && cols <= 32 * 8 * kWarpVec && Aligned16(x) && Aligned16(w) && Aligned16(y)) {
    const unsigned blocks = static_cast<unsigned>((rows + kThreads / 32 - 1) / (kThreads / 32));
    auto xv = static_cast<const uint4*>(x);
    auto wv = static_cast<const uint4*>(w);
    auto yv = static_cast<uint4*>(y);
    if (cols <= 32 * 8 * 8) ForwardWarpRowBf16<8><<<blocks, kThreads, 0, s>>>(xv, wv, yv, rstd, rows, cols, eps);
    else ForwardWarpRowBf16<kWarpVec><<<blocks, kThreads, 0, s>>>(xv, wv, yv, rstd, rows, cols, eps);
    return LaunchStatus("rmsnorm_forward");
  }
  if (t == DType::kBF16 && cols % 8 == 0 && cols <= int64_t(kThreads) * 8 * kMaxVec && Aligned16(x) && Aligned16(w) &&
      Aligned16(y)) {
    ForwardVecBf16<<<rows, kThreads, 0, s>>>(static_cast<const uint4*>(x), static_cast<const uint4*>(w),
                                             static_cast<uint4*>(y), rstd, cols, eps);
    return LaunchStatus("rmsnorm_forward");
  }
  if (t == DType::kF32)
    Forward<<<rows, kThreads, 0, s>>>(static_cast<const float*>(x), static_cast<const float*>(w), static_cast<float*>(y), rstd, cols, eps);
  else
    Forward<<<rows, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(w),
                                      static_cast<__nv_bfloat16*>(y), rstd, cols, eps);
  return LaunchStatus("rmsnorm_forward");
}

absl::Status RmsNormBackwardCuda(const void* dy, const void* x, const void* w, const float* rstd, void* dx, float* dw,
                                 int64_t rows, int64_t cols, DType t, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  if (cudaMemsetAsync(dw, 0, cols * sizeof(float), s) != cudaSuccess) return LaunchStatus("rmsnorm_backward(memset)");
  if (rows == 0) return absl::OkStatus();
  using bf = __nv_bfloat16;
  if (t == DType::kBF16 && cols % 256 == 0 && cols <= 32 * 8 * kBwdVec && Aligned16(dy) && Aligned16(x) && Aligned16(w) &&
      Aligned16(dx)) {
    const int blocks = static_cast<int>((rows + kBwdRows - 1) / kBwdRows);
    float* partial = nullptr;
    if (cudaMallocAsync(&partial, blocks * cols * sizeof(float), s) != cudaSuccess) return LaunchStatus("rmsnorm_backward(alloc)");
    BackwardWarpRowBf16<<<blocks, kThreads, 0, s>>>(
        static_cast<const uint4*>(dy), static_cast<const uint4*>(x), static_cast<const uint4*>(w), rstd,
        static_cast<uint4*>(dx), partial, rows, cols);
    auto reduce = [&]() -> absl::Status {
      TESSERA_RETURN_IF_ERROR(LaunchStatus("rmsnorm_backward"));
      DwReduce<<<static_cast<unsigned>((cols + 31) / 32), 256, 0, s>>>(partial, blocks, cols, dw);
      return LaunchStatus("rmsnorm_backward(dw)");
    };
    const absl::Status st = reduce();
    cudaFreeAsync(partial, s);
    return st;
  }
  if (t == DType::kF32)
    Backward<<<rows, kThreads, 0, s>>>(static_cast<const float*>(dy), static_cast<const float*>(x), static_cast<const float*>(w),
                                       rstd, static_cast<float*>(dx), dw, cols);
  else
    Backward<<<rows, kThreads, 0, s>>>(static_cast<const bf*>(dy), static_cast<const bf*>(x), static_cast<const bf*>(w), rstd,
                                       static_cast<bf*>(dx), dw, cols);
  return LaunchStatus("rmsnorm_backward");
}

}  // namespace tessera::kernels
