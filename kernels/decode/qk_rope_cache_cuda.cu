// The fused q/k pass on CUDA (qk_rope_cache.h): one warp per (token, head) of the q heads
// then the kv heads, each normalized and rotated as kernels/rope/rope_head.cuh does it. A kv
// head's warp also copies that head's values into the cache. Head dims that are not a
// multiple of 32 run the three ops it fuses.
#include <algorithm>

#include "kernels/common/cuda_elem.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/decode/qk_rope_cache.h"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/rope/rope_angle.cuh"
#include "kernels/rope/rope_head.cuh"

namespace tessera::kernels {
namespace {
constexpr int kThreads = 128;

template <typename T>
struct Params {
  const T *q, *k, *v, *qn, *kn;
  const int32_t *pos, *slots;
  T *q_out, *kc, *vc, *k_out;
  int tokens, hq, hkv;
  float eps;
  InvFreq inv;
};

template <typename T, int E>
__global__ void __launch_bounds__(kThreads) QkRopeCache(const Params<T> p) {
  constexpr int D = 32 * E;
  const int warp = (blockIdx.x * kThreads + threadIdx.x) / 32, lane = threadIdx.x % 32;
  const int heads = p.hq + p.hkv;
  const bool active = warp < p.tokens * heads;
  const int tok = warp / heads, h = warp % heads;
  const bool is_q = h < p.hq;
  const int kh = h - p.hq;
  const T* nw = is_q ? p.qn : p.kn;
  float g[E];  // the head norm's weights: constants, read before the wait
  if (active && nw != nullptr)
#pragma unroll
    for (int j = 0; j < E; ++j) g[j] = ToF(nw[lane * E + j]);
  GridDependencyWait();
  GridDependentsLaunch();
  if (!active) return;
  const int32_t pos = p.pos[tok];
  const T* src = is_q ? p.q + (int64_t(tok) * p.hq + h) * D : p.k + (int64_t(tok) * p.hkv + kh) * D;
  float x[E];
#pragma unroll
  for (int j = 0; j < E; ++j) x[j] = ToF(src[lane * E + j]);
  T y[E];
  NormRopeHead<T, E>(x, g, nw != nullptr, p.eps, pos, p.inv, y);
  if (is_q) {
    T* dst = p.q_out + (int64_t(tok) * p.hq + h) * D;
#pragma unroll
    for (int j = 0; j < E; ++j) dst[lane * E + j] = y[j];
    return;
  }
  if (p.k_out != nullptr) {
    T* dst = p.k_out + (int64_t(tok) * p.hkv + kh) * D;
#pragma unroll
    for (int j = 0; j < E; ++j) dst[lane * E + j] = y[j];
  }
  const int64_t row = (int64_t(p.slots[tok]) * p.hkv + kh) * D;
  const T* vs = p.v + (int64_t(tok) * p.hkv + kh) * D;
#pragma unroll
  for (int j = 0; j < E; ++j) {
    p.kc[row + lane * E + j] = y[j];
    p.vc[row + lane * E + j] = vs[lane * E + j];
  }
}

template <typename T>
absl::Status Run(const QkRopeCacheArgs& a, cudaStream_t s) {
  Params<T> p{};
  p.q = static_cast<const T*>(a.q), p.k = static_cast<const T*>(a.k), p.v = static_cast<const T*>(a.v);
  p.qn = static_cast<const T*>(a.q_norm), p.kn = static_cast<const T*>(a.k_norm);
  p.pos = a.pos, p.slots = a.slots;
  p.q_out = static_cast<T*>(a.q_out), p.kc = static_cast<T*>(a.k_cache), p.vc = static_cast<T*>(a.v_cache);
  p.k_out = static_cast<T*>(a.k_out);
  p.tokens = int(a.tokens), p.hq = int(a.q_heads), p.hkv = int(a.kv_heads), p.eps = a.eps;
  for (int64_t i = 0; i < a.head_dim / 2; ++i) p.inv.v[i] = a.inv_freq[i];
  p.inv.scale = a.scale;
  const int64_t warps = a.tokens * (a.q_heads + a.kv_heads);
  const dim3 grid(unsigned((warps * 32 + kThreads - 1) / kThreads));
  cudaError_t e = cudaSuccess;
  switch (a.head_dim / 32) {
    case 1: e = LaunchDependent(QkRopeCache<T, 1>, grid, dim3(kThreads), 0, s, p); break;
    case 2: e = LaunchDependent(QkRopeCache<T, 2>, grid, dim3(kThreads), 0, s, p); break;
    case 3: e = LaunchDependent(QkRopeCache<T, 3>, grid, dim3(kThreads), 0, s, p); break;
    case 4: e = LaunchDependent(QkRopeCache<T, 4>, grid, dim3(kThreads), 0, s, p); break;
    case 6: e = LaunchDependent(QkRopeCache<T, 6>, grid, dim3(kThreads), 0, s, p); break;
    case 8: e = LaunchDependent(QkRopeCache<T, 8>, grid, dim3(kThreads), 0, s, p); break;
    default: return absl::InternalError("qk rope cache: head dim");
  }
  return Launched(e, "qk rope cache");
}

// Other head dims: the three ops, through temporaries.
absl::Status Unfused(const QkRopeCacheArgs& a, DType t, cudaStream_t s) {
  const int64_t d = a.head_dim, es = DTypeSize(t), qn = a.tokens * a.q_heads * d, kn = a.tokens * a.kv_heads * d;
  char* buf = nullptr;
  const int64_t norm_bytes = a.q_norm != nullptr ? (qn + kn) * es + (a.tokens * (a.q_heads + a.kv_heads)) * 4 : 0;
  if (cudaMallocAsync(&buf, kn * es + norm_bytes, s) != cudaSuccess) return LaunchStatus("qk rope cache (alloc)");
  auto run = [&]() -> absl::Status {
    const void *q = a.q, *k = a.k;
    if (a.q_norm != nullptr) {
      char* nq = buf + kn * es;
      char* nk = nq + qn * es;
      float* rstd = reinterpret_cast<float*>(nk + kn * es);
      if (auto st = RmsNormForwardCuda(a.q, a.q_norm, nq, rstd, a.tokens * a.q_heads, d, a.eps, t, s); !st.ok()) return st;
      if (auto st = RmsNormForwardCuda(a.k, a.k_norm, nk, rstd, a.tokens * a.kv_heads, d, a.eps, t, s); !st.ok()) return st;
      q = nq, k = nk;
    }
    if (auto st = RopeCuda(q, a.pos, a.q_out, a.tokens, a.q_heads, d, a.inv_freq, a.scale, 1.f, t, s, a.q_heads * d,
                           a.q_heads * d);
        !st.ok())
      return st;
    if (auto st = RopeCuda(k, a.pos, buf, a.tokens, a.kv_heads, d, a.inv_freq, a.scale, 1.f, t, s, a.kv_heads * d,
                           a.kv_heads * d);
        !st.ok())
      return st;
    if (a.k_out != nullptr && cudaMemcpyAsync(a.k_out, buf, kn * es, cudaMemcpyDeviceToDevice, s) != cudaSuccess)
      return LaunchStatus("qk rope cache (k_out)");
    return KvCacheWriteCuda(buf, a.v, a.slots, a.k_cache, a.v_cache, a.tokens, a.kv_heads * d * es, s);
  };
  const absl::Status st = run();
  cudaFreeAsync(buf, s);
  return st;
}
}  // namespace

absl::Status QkRopeCacheCuda(const QkRopeCacheArgs& a, DType t, void* stream) {
  if (a.tokens == 0) return absl::OkStatus();
  if (a.head_dim % 2 != 0 || a.head_dim > kRopeMaxHeadDim)
    return absl::InvalidArgumentError(absl::StrCat("qk rope cache: head dim ", a.head_dim, " must be even and <= ", kRopeMaxHeadDim));
  if ((a.q_norm == nullptr) != (a.k_norm == nullptr)) return absl::InvalidArgumentError("qk rope cache: q_norm and k_norm go together");
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t e = a.head_dim / 32;
  const bool fused = a.head_dim % 32 == 0 && (e <= 4 || e == 6 || e == 8) && (t == DType::kBF16 || t == DType::kF32) &&
                     a.tokens * (a.q_heads + a.kv_heads) * 32 < (int64_t(1) << 31);
  if (!fused) return Unfused(a, t, s);
  return t == DType::kF32 ? Run<float>(a, s) : Run<__nv_bfloat16>(a, s);
}

}  // namespace tessera::kernels
