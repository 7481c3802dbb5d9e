// Cross-entropy partials and backward on CUDA: one block per token row.
#include "kernels/common/cuda_elem.cuh"
#include "kernels/cross_entropy/cross_entropy.h"

#include <cstdint>

namespace tessera::kernels {
namespace {
constexpr int kThreads = 256;

template <typename T>
__global__ void Partials(const T* logits, const int32_t* targets, float* max, float* sum, float* dot, float* tgt,
                         int64_t v, int64_t start) {
  const T* z = logits + blockIdx.x * v;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < v; j += kThreads) m = fmaxf(m, ToF(z[j]));
  m = BlockReduce<kThreads>(m, MaxOp());
  float s = 0, d = 0;
  for (int64_t j = threadIdx.x; j < v; j += kThreads) {
    float zj = ToF(z[j]), e = __expf(zj - m);
    s += e;
    d += e * zj;
  }
  s = BlockReduce<kThreads>(s, SumOp());
  d = BlockReduce<kThreads>(d, SumOp());
  if (threadIdx.x == 0) {
    int64_t local = targets[blockIdx.x] - start;
    max[blockIdx.x] = m;
    sum[blockIdx.x] = s;
    dot[blockIdx.x] = d;
    tgt[blockIdx.x] = (local >= 0 && local < v) ? ToF(z[local]) : 0.f;
  }
}

// One pass: each thread keeps an online (max, sum, dot) over its elements, read as 16-byte
// vectors of 8 bf16; the triples are merged across the warp and then across the block.
struct Online {
  float m = -INFINITY, s = 0.f, d = 0.f;
  __device__ void Merge(float om, float os, float od) {
    float nm = fmaxf(m, om);
    if (nm == -INFINITY) return;
    float a = __expf(m - nm), b = __expf(om - nm);
    s = s * a + os * b;
    d = d * a + od * b;
    m = nm;
  }
};

// Issues the kLoads 16-byte loads of row vectors i, i + kThreads, ... (those below nvec)
// before any is used, so they are in flight together.
template <int kLoads>
__device__ __forceinline__ void LoadRow(const uint4* z, int64_t i, int64_t nvec, uint4 (&u)[kLoads]) {
#pragma unroll
  for (int k = 0; k < kLoads; ++k)
    if (i + k * kThreads < nvec) u[k] = __ldcs(z + i + k * kThreads);
}

__global__ void PartialsVecBf16(const uint4* logits, const int32_t* targets, float* max, float* sum, float* dot, float* tgt,
                                int64_t v, int64_t start) {
  const int64_t nvec = v / 8;
  const uint4* z = logits + blockIdx.x * nvec;
  // Four 16-byte loads in flight per thread; each vector of 8 logits is folded in with one
  // rescale (when its max is new) and 8 exponentials.
  Online o;
  constexpr int kLoads = 4;
  for (int64_t i = threadIdx.x; i < nvec; i += kThreads * kLoads) {
    uint4 u[kLoads];
    LoadRow<kLoads>(z, i, nvec, u);
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      if (i + k * kThreads >= nvec) break;
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u[k]);
      float f[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 v2 = __bfloat1622float2(h[j]);
        f[2 * j] = v2.x, f[2 * j + 1] = v2.y;
      }
      float m8 = f[0];
#pragma unroll
      for (int j = 1; j < 8; ++j) m8 = fmaxf(m8, f[j]);
      if (m8 == -INFINITY) continue;  // all masked: contributes nothing
      if (m8 > o.m) {
        const float c = __expf(o.m - m8);  // 0 while o is empty
        o.s *= c, o.d *= c, o.m = m8;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float e = __expf(f[j] - o.m);
        o.s += e, o.d += e * f[j];
      }
    }
  }
  for (int off = 16; off > 0; off >>= 1)
    o.Merge(__shfl_xor_sync(0xffffffff, o.m, off), __shfl_xor_sync(0xffffffff, o.s, off),
            __shfl_xor_sync(0xffffffff, o.d, off));
  __shared__ float wm[kThreads / 32], ws[kThreads / 32], wd[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) wm[warp] = o.m, ws[warp] = o.s, wd[warp] = o.d;
  __syncthreads();
  if (threadIdx.x == 0) {
    Online t;
    for (int w = 0; w < kThreads / 32; ++w) t.Merge(wm[w], ws[w], wd[w]);
    const int64_t local = targets[blockIdx.x] - start;
    const __nv_bfloat16* zr = reinterpret_cast<const __nv_bfloat16*>(z);
    max[blockIdx.x] = t.m;
    sum[blockIdx.x] = t.s;
    dot[blockIdx.x] = t.d;
    tgt[blockIdx.x] = (local >= 0 && local < v) ? __bfloat162float(zr[local]) : 0.f;
  }
}

template <typename T>
__global__ void Backward(const T* logits, const int32_t* targets, const float* lse, const float* dloss, T* dlogits,
                         int64_t v, int64_t start, const float* dent, const float* ent) {
  const int64_t off = blockIdx.x * v, local = targets[blockIdx.x] - start;
  const float l = lse[blockIdx.x], g = dloss[blockIdx.x];
  // Without an entropy term dh = 0: the extra term is an exact 0 (z - l + h is finite).
  const float dh = dent != nullptr ? dent[blockIdx.x] : 0.f, h = ent != nullptr ? ent[blockIdx.x] : 0.f;
  for (int64_t j = threadIdx.x; j < v; j += kThreads) {
    const float logp = ToF(logits[off + j]) - l, p = __expf(logp);
    dlogits[off + j] = FromF<T>(g * (p - (j == local ? 1.f : 0.f)) - dh * p * (logp + h));
  }
}
// bf16, v % 8 == 0: 16-byte vectors, four loads in flight per thread.
__global__ void BackwardVecBf16(const uint4* logits, const int32_t* targets, const float* lse, const float* dloss,
                                uint4* dlogits, int64_t v, int64_t start, const float* dent, const float* ent) {
  const int64_t nvec = v / 8, local = targets[blockIdx.x] - start;
  const uint4* z = logits + blockIdx.x * nvec;
  uint4* out = dlogits + blockIdx.x * nvec;
  const float l = lse[blockIdx.x], g = dloss[blockIdx.x];
  const float dh = dent != nullptr ? dent[blockIdx.x] : 0.f, hh = ent != nullptr ? ent[blockIdx.x] : 0.f;
  constexpr int kLoads = 4;
  for (int64_t i = threadIdx.x; i < nvec; i += kThreads * kLoads) {
    uint4 u[kLoads];
    LoadRow<kLoads>(z, i, nvec, u);
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
      const int64_t vi = i + k * kThreads;
      if (vi >= nvec) break;
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u[k]);
      uint4 o;
      __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __bfloat1622float2(h[j]);
        const int64_t c = vi * 8 + 2 * j;
        const float lx = f.x - l, ly = f.y - l, px = __expf(lx), py = __expf(ly);
        o2[j] = __floats2bfloat162_rn(g * (px - (c == local ? 1.f : 0.f)) - dh * px * (lx + hh),
                                      g * (py - (c + 1 == local ? 1.f : 0.f)) - dh * py * (ly + hh));
      }
      __stcs(out + vi, o);
    }
  }
}
}  // namespace

namespace {
constexpr int kLossThreads = 1024;
// One block: each thread a strided set of rows, summed in double; then a fixed-shape tree.
__global__ void Loss(const float* max, const float* sum, const float* tgt, const int32_t* targets, float scale,
                     float* lse, float* dloss, float* loss_sum, int64_t n) {
  __shared__ double part[kLossThreads];
  double total = 0;
  for (int64_t i = threadIdx.x; i < n; i += kLossThreads) {
    const bool counted = targets[i] >= 0;
    const float l = counted ? max[i] + logf(sum[i]) : 0.f;
    lse[i] = l;
    dloss[i] = counted ? scale : 0.f;
    if (counted) total += static_cast<double>(l) - tgt[i];
  }
  part[threadIdx.x] = total;
  __syncthreads();
  for (int w = kLossThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) loss_sum[0] = static_cast<float>(loss_sum[0] + part[0]);
}
__global__ void Rescale(const float* max, const float* global_max, float* sum, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) sum[i] *= expf(max[i] - global_max[i]);
}
}  // namespace

absl::Status CrossEntropyRescaleCuda(const float* max, const float* global_max, float* sum, int64_t n, void* stream) {
  if (n == 0) return absl::OkStatus();
  Rescale<<<(n + 255) / 256, 256, 0, static_cast<cudaStream_t>(stream)>>>(max, global_max, sum, n);
  return LaunchStatus("cross_entropy_rescale");
}

absl::Status CrossEntropyLossCuda(const float* max, const float* sum, const float* tgt, const int32_t* targets,
                                  float scale, float* lse, float* dloss, float* loss_sum, int64_t n, void* stream) {
  Loss<<<1, kLossThreads, 0, static_cast<cudaStream_t>(stream)>>>(max, sum, tgt, targets, scale, lse, dloss, loss_sum, n);
  return LaunchStatus("cross_entropy_loss");
}

absl::Status CrossEntropyPartialsCuda(const void* logits, const int32_t* targets, float* max, float* sum, float* dot,
                                      float* tgt, int64_t n, int64_t v, int64_t start, DType t, void* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  if (t == DType::kBF16 && v % 8 == 0 && (reinterpret_cast<uintptr_t>(logits) & 15) == 0) {
    PartialsVecBf16<<<n, kThreads, 0, s>>>(static_cast<const uint4*>(logits), targets, max, sum, dot, tgt, v, start);
    return LaunchStatus("cross_entropy_partials");
  }
  if (t == DType::kF32) Partials<<<n, kThreads, 0, s>>>(static_cast<const float*>(logits), targets, max, sum, dot, tgt, v, start);
  else Partials<<<n, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(logits), targets, max, sum, dot, tgt, v, start);
  return LaunchStatus("cross_entropy_partials");
}

absl::Status CrossEntropyBackwardCuda(const void* logits, const int32_t* targets, const float* lse, const float* dloss,
                                      void* dlogits, int64_t n, int64_t v, int64_t start, DType t, void* stream,
                                      const float* dent, const float* ent) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  if (t == DType::kBF16 && v % 8 == 0 && (reinterpret_cast<uintptr_t>(logits) & 15) == 0 &&
      (reinterpret_cast<uintptr_t>(dlogits) & 15) == 0) {
    BackwardVecBf16<<<n, kThreads, 0, s>>>(static_cast<const uint4*>(logits), targets, lse, dloss,
                                           static_cast<uint4*>(dlogits), v, start, dent, ent);
    return LaunchStatus("cross_entropy_backward");
  }
  if (t == DType::kF32)
    Backward<<<n, kThreads, 0, s>>>(static_cast<const float*>(logits), targets, lse, dloss, static_cast<float*>(dlogits), v, start,
                                    dent, ent);
  else
    Backward<<<n, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(logits), targets, lse, dloss,
                                    static_cast<__nv_bfloat16*>(dlogits), v, start, dent, ent);
  return LaunchStatus("cross_entropy_backward");
}
}  // namespace tessera::kernels
