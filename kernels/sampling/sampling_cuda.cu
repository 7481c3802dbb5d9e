// Sampling on CUDA: one block per row. Thresholds for top-k and top-p are found by
// bisection over the bit patterns of positive floats (31 block reductions each), so no
// sort of the vocabulary is needed; the draw is an inverse CDF in token-id order over
// per-thread contiguous chunks. Same semantics as the CPU reference (sampling.h); the
// CPU computes probabilities in double, so draws that land within rounding of a CDF
// boundary can differ between the two.
#include "kernels/common/cuda_elem.cuh"
#include "kernels/sampling/sampling.h"

namespace tessera::kernels {
namespace {
constexpr int kThreads = 256;

template <typename T>
__device__ __forceinline__ float Prob(const T* z, int64_t j, float m, float inv_t, float inv_sum) {
  return __expf((ToF(z[j]) - m) * inv_t) * inv_sum;
}

// Largest threshold (as positive-float bits) with f(threshold) >= goal, where f is
// non-increasing in the threshold. f(x) = block reduction computed by `measure`.
template <typename F>
__device__ float Bisect(float goal, F measure) {
  uint32_t lo = 0, hi = 0x3f800001u;  // [0, just above 1.0]
  while (hi - lo > 1) {
    uint32_t mid = lo + (hi - lo) / 2;
    if (measure(__uint_as_float(mid)) >= goal) lo = mid;
    else hi = mid;
  }
  return __uint_as_float(lo);
}

template <typename T>
__global__ void Sample(const T* logits, int64_t v, SampleArgs a, int32_t* token, float* logprob) {
  const int64_t row = blockIdx.x;
  const T* z = logits + row * v;
  const float temp = a.temperature[row];
  const float inv_t = temp > 0 ? 1.f / temp : 1.f;
  // Max and argmax (lowest index on ties).
  float best = -INFINITY;
  int64_t arg = v;
  for (int64_t j = threadIdx.x; j < v; j += kThreads) {
    float x = ToF(z[j]);
    if (x > best) best = x, arg = j;
  }
  __shared__ float sv[kThreads];
  __shared__ int64_t si[kThreads];
  sv[threadIdx.x] = best;
  si[threadIdx.x] = arg;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      float ov = sv[threadIdx.x + s];
      int64_t oi = si[threadIdx.x + s];
      if (ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < si[threadIdx.x])) sv[threadIdx.x] = ov, si[threadIdx.x] = oi;
    }
    __syncthreads();
  }
  const float m = sv[0];
  const int64_t amax = si[0];
  __syncthreads();
  float part = 0;
  for (int64_t j = threadIdx.x; j < v; j += kThreads) part += __expf((ToF(z[j]) - m) * inv_t);
  const float inv_sum = 1.f / BlockReduce<kThreads>(part, SumOp());
  if (temp <= 0) {
    if (threadIdx.x == 0) {
      token[row] = static_cast<int32_t>(amax);
      logprob[row] = logf(inv_sum);
    }
    return;
  }
  auto count_ge = [&](float thr) {
    float c = 0;
    for (int64_t j = threadIdx.x; j < v; j += kThreads) c += Prob(z, j, m, inv_t, inv_sum) >= thr ? 1.f : 0.f;
    return BlockReduce<kThreads>(c, SumOp());
  };
  auto mass_ge = [&](float thr) {
    float c = 0;
    for (int64_t j = threadIdx.x; j < v; j += kThreads) {
      float p = Prob(z, j, m, inv_t, inv_sum);
      c += p >= thr ? p : 0.f;
    }
    return BlockReduce<kThreads>(c, SumOp());
  };
  float thr = 0.f;
  const int32_t k = a.top_k[row];
  if (k > 0 && k < v) thr = Bisect(static_cast<float>(k), count_ge);
  const float top_p = a.top_p[row];
  if (top_p < 1.f) {
    float kept = mass_ge(thr);
    float t2 = Bisect(top_p * kept, mass_ge);
    thr = fmaxf(thr, t2);
  }
  // Inverse CDF over kept tokens in id order: contiguous chunks per thread.
  const int64_t chunk = (v + kThreads - 1) / kThreads;
  const int64_t b = threadIdx.x * chunk, e = min(v, b + chunk);
  float mine = 0;
  int64_t last = -1;
  for (int64_t j = b; j < e; ++j) {
    float p = Prob(z, j, m, inv_t, inv_sum);
    if (p >= thr) mine += p, last = j;
  }
  __shared__ float prefix[kThreads + 1];
  __shared__ int64_t lastk[kThreads];
  prefix[threadIdx.x + 1] = mine;
  lastk[threadIdx.x] = last;
  __syncthreads();
  if (threadIdx.x == 0) {
    prefix[0] = 0;
    for (int t = 1; t <= kThreads; ++t) prefix[t] += prefix[t - 1];
  }
  __syncthreads();
  const float target = static_cast<float>(SampleUniform(a.seed[row], a.offset[row])) * prefix[kThreads];
  __shared__ int64_t pick;
  if (threadIdx.x == 0) {
    pick = -1;
    for (int t = kThreads - 1; t >= 0; --t) if (lastk[t] >= 0) { pick = lastk[t]; break; }  // fallback: last kept
  }
  __syncthreads();
  if (target >= prefix[threadIdx.x] && target < prefix[threadIdx.x + 1]) {
    float cum = prefix[threadIdx.x];
    for (int64_t j = b; j < e; ++j) {
      float p = Prob(z, j, m, inv_t, inv_sum);
      if (p < thr) continue;
      cum += p;
      if (cum > target) { pick = j; break; }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    token[row] = static_cast<int32_t>(pick);
    logprob[row] = logf(Prob(z, pick, m, inv_t, inv_sum));
  }
}
}  // namespace

absl::Status SampleCuda(const void* logits, int64_t n, int64_t v, DType t, const SampleArgs& a, int32_t* token,
                        float* logprob, void* stream) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  if (t == DType::kF32) Sample<<<n, kThreads, 0, s>>>(static_cast<const float*>(logits), v, a, token, logprob);
  else Sample<<<n, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(logits), v, a, token, logprob);
  return LaunchStatus("sample");
}
}  // namespace tessera::kernels
