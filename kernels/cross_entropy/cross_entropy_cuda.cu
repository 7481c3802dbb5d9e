// Cross-entropy partials and backward on CUDA: one block per token row.
#include "kernels/common/cuda_elem.cuh"
#include "kernels/cross_entropy/cross_entropy.h"

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

template <typename T>
__global__ void Backward(const T* logits, const int32_t* targets, const float* lse, const float* dloss, T* dlogits,
                         int64_t v, int64_t start) {
  const int64_t off = blockIdx.x * v, local = targets[blockIdx.x] - start;
  const float l = lse[blockIdx.x], g = dloss[blockIdx.x];
  for (int64_t j = threadIdx.x; j < v; j += kThreads) {
    float p = __expf(ToF(logits[off + j]) - l);
    dlogits[off + j] = FromF<T>(g * (p - (j == local ? 1.f : 0.f)));
  }
}
}  // namespace

absl::Status CrossEntropyPartialsCuda(const void* logits, const int32_t* targets, float* max, float* sum, float* dot,
                                      float* tgt, int64_t n, int64_t v, int64_t start, DType t, void* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  if (t == DType::kF32) Partials<<<n, kThreads, 0, s>>>(static_cast<const float*>(logits), targets, max, sum, dot, tgt, v, start);
  else Partials<<<n, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(logits), targets, max, sum, dot, tgt, v, start);
  return LaunchStatus("cross_entropy_partials");
}

absl::Status CrossEntropyBackwardCuda(const void* logits, const int32_t* targets, const float* lse, const float* dloss,
                                      void* dlogits, int64_t n, int64_t v, int64_t start, DType t, void* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  if (t == DType::kF32)
    Backward<<<n, kThreads, 0, s>>>(static_cast<const float*>(logits), targets, lse, dloss, static_cast<float*>(dlogits), v, start);
  else
    Backward<<<n, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(logits), targets, lse, dloss,
                                    static_cast<__nv_bfloat16*>(dlogits), v, start);
  return LaunchStatus("cross_entropy_backward");
}
}  // namespace tessera::kernels
