// Sampling on CUDA. Rows without top-k or top-p (greedy, or temperature alone: what RL
// rollouts draw) split the vocabulary over several blocks: each reduces its segment to
// (max, argmax, sum of exp((z - max) / T)), then one block per row combines them, picks
// the segment the draw lands in by the segments' masses (one warp: each lane a run of
// segments, placed by a scan over the lanes) and scans only that segment — one read of
// the logits, spread over the GPU. Rows with top-k or top-p run one block
// per row (in the combining kernel): thresholds for top-k and top-p are found by
// bisection over the bit patterns of positive floats (31 block reductions each), so no
// sort of the vocabulary is needed; the draw is an inverse CDF in token-id order over
// per-thread contiguous chunks. Same semantics as the CPU reference (sampling.h); the
// CPU computes probabilities in double, so draws that land within rounding of a CDF
// boundary can differ between the two.
#include "absl/strings/str_cat.h"
#include "kernels/common/cuda_elem.cuh"
#include "kernels/common/scratch.cuh"
#include "kernels/sampling/sampling.h"

#include <algorithm>

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

// The inverse CDF over [b, e) in token-id order, as one block: `weight(j, &w)` says whether
// token j is kept and its weight w; each thread sums a contiguous chunk, a prefix over the
// threads places the chunks, and the token where the running sum passes `target(total)`
// (the point drawn, given the kept total) is returned to every thread — or, where
// rounding runs past the end, the last kept token.
template <typename Weight, typename Target>
__device__ int64_t InverseCdf(int64_t b0, int64_t e0, Weight weight, Target target_of) {
  const int64_t chunk = (e0 - b0 + kThreads - 1) / kThreads;
  const int64_t b = b0 + threadIdx.x * chunk, e = min(e0, b + chunk);
  float mine = 0;
  int64_t last = -1;
  for (int64_t j = b; j < e; ++j) {
    float w;
    if (weight(j, &w)) mine += w, last = j;
  }
  // Where each thread's chunk starts: a scan over the warp, then over the warps' sums. A
  // thread's chunk ends where the next one's starts (the same float), so the chunks tile
  // [0, total) without gaps or overlaps whatever the rounding.
  constexpr int kW = kThreads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float inc = mine;
  int64_t lastw = last;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float up = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += up;
    lastw = max(lastw, static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(lastw), o)));
  }
  float excl = __shfl_up_sync(0xffffffffu, inc, 1);
  if (lane == 0) excl = 0.f;
  __shared__ float wsum[kW], wstart[kW + 1];
  __shared__ int64_t wlast[kW];
  __shared__ int64_t pick;
  if (lane == 31) wsum[warp] = inc;
  if (lane == 0) wlast[warp] = lastw;
  __syncthreads();
  if (threadIdx.x == 0) {
    wstart[0] = 0.f;
    pick = -1;
    for (int w = 0; w < kW; ++w) wstart[w + 1] = wstart[w] + wsum[w], pick = max(pick, wlast[w]);
  }
  __syncthreads();
  const float before = wstart[warp] + excl;
  const float next_excl = __shfl_down_sync(0xffffffffu, excl, 1);
  const float after = lane < 31 ? wstart[warp] + next_excl : wstart[warp + 1];
  const float target = target_of(wstart[kW]);
  if (target >= before && target < after) {
    float cum = before;
    for (int64_t j = b; j < e; ++j) {
      float w;
      if (!weight(j, &w)) continue;
      cum += w;
      if (cum > target) { pick = j; break; }
    }
  }
  __syncthreads();
  const int64_t got = pick;
  __syncthreads();  // `pick` may be reused by the next call
  return got;
}

template <typename T>
__device__ void Sample(const T* logits, int64_t v, SampleArgs a, int32_t* token, float* logprob) {
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
  // Inverse CDF over the kept tokens in id order.
  const float u = static_cast<float>(SampleUniform(a.seed[row], a.offset[row]));
  const int64_t pick = InverseCdf(
      0, v,
      [&](int64_t j, float* w) {
        *w = Prob(z, j, m, inv_t, inv_sum);
        return *w >= thr;
      },
      [&](float total) { return u * total; });
  if (threadIdx.x == 0) {
    token[row] = static_cast<int32_t>(pick);
    logprob[row] = logf(Prob(z, pick, m, inv_t, inv_sum));
  }
}

// Segmented path. Partials per (row, segment): max, sum, argmax.
struct Partial {
  float max, sum;
  int32_t arg, pad;
};
constexpr int kSegThreads = kThreads;

__device__ __forceinline__ bool Plain(const SampleArgs& a, int64_t row, int64_t v) {
  return a.temperature[row] <= 0 || ((a.top_k[row] <= 0 || a.top_k[row] >= v) && a.top_p[row] >= 1.f);
}

// The block's (max, lowest argmax) and then its sum of exp((z - max) * inv_t) over [b, e).
template <typename T>
__device__ Partial SegmentStats(const T* z, int64_t b, int64_t e, float inv_t) {
  float best = -INFINITY;
  int64_t arg = e;
  for (int64_t j = b + threadIdx.x; j < e; j += kSegThreads) {
    const float x = ToF(z[j]);
    if (x > best) best = x, arg = j;
  }
  __shared__ float sv[kSegThreads / 32];
  __shared__ int64_t si[kSegThreads / 32];
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int64_t oi = __shfl_xor_sync(0xffffffffu, arg, o);
    if (ov > best || (ov == best && oi < arg)) best = ov, arg = oi;
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) sv[warp] = best, si[warp] = arg;
  __syncthreads();
  best = sv[0], arg = si[0];
  for (int w = 1; w < kSegThreads / 32; ++w)
    if (sv[w] > best || (sv[w] == best && si[w] < arg)) best = sv[w], arg = si[w];
  float part = 0.f;
  if (best != -INFINITY)
    for (int64_t j = b + threadIdx.x; j < e; j += kSegThreads) part += __expf((ToF(z[j]) - best) * inv_t);
  const float sum = BlockReduce<kSegThreads>(part, SumOp());
  return Partial{best, sum, static_cast<int32_t>(arg), 0};
}

template <typename T>
__global__ void SegmentKernel(const T* logits, int64_t v, int64_t seg_len, SampleArgs a, Partial* parts) {
  const int64_t row = blockIdx.y, seg = blockIdx.x;
  if (!Plain(a, row, v)) return;  // the row runs the one-block path
  const float temp = a.temperature[row], inv_t = temp > 0 ? 1.f / temp : 1.f;
  const int64_t b = seg * seg_len, e = min(v, b + seg_len);
  const Partial p = SegmentStats(logits + row * v, b, e, inv_t);
  if (threadIdx.x == 0) parts[row * gridDim.x + seg] = p;
}

template <typename T>
__global__ void CombineKernel(const T* logits, int64_t v, int64_t seg_len, int segs, SampleArgs a, const Partial* parts,
                              int32_t* token, float* logprob) {
  const int64_t row = blockIdx.x;
  if (!Plain(a, row, v)) return Sample<T>(logits, v, a, token, logprob);  // top-k / top-p: the one-block path
  const T* z = logits + row * v;
  const Partial* pr = parts + row * segs;
  const float temp = a.temperature[row], inv_t = temp > 0 ? 1.f / temp : 1.f;
  __shared__ float m_s, total_s, target_s;
  __shared__ int seg_s;
  __shared__ int64_t amax_s;
  if (threadIdx.x < 32) {  // up to 256 segments over one warp: lane l takes segments [l * per, (l + 1) * per)
    const int lane = threadIdx.x, per = (segs + 31) / 32, s0 = min(segs, lane * per), s1 = min(segs, s0 + per);
    float m = -INFINITY;
    int64_t amax = v;
    for (int s = s0; s < s1; ++s)
      if (pr[s].max > m || (pr[s].max == m && pr[s].arg < amax)) m = pr[s].max, amax = pr[s].arg;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float om = __shfl_xor_sync(0xffffffffu, m, o);
      const int64_t oa = __shfl_xor_sync(0xffffffffu, static_cast<long long>(amax), o);
      if (om > m || (om == m && oa < amax)) m = om, amax = oa;
    }
    auto mass = [&](int s) { return pr[s].max == -INFINITY ? 0.f : pr[s].sum * __expf((pr[s].max - m) * inv_t); };
    float mine = 0.f;
    for (int s = s0; s < s1; ++s) mine += mass(s);
    // The lanes' masses placed by a scan; a lane's range ends where the next one's starts.
    float inc = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float up = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += up;
    }
    float before = __shfl_up_sync(0xffffffffu, inc, 1);
    if (lane == 0) before = 0.f;
    const float total = __shfl_sync(0xffffffffu, inc, 31), next = __shfl_down_sync(0xffffffffu, before, 1);
    const float after = lane < 31 ? next : total;
    if (lane == 0) m_s = m, total_s = total, amax_s = amax;
    if (temp > 0) {  // the segment the draw lands in
      const float target = static_cast<float>(SampleUniform(a.seed[row], a.offset[row])) * total;
      int pick = -1;
      float cum = before;
      if (target >= before && target < after && mine > 0.f)
        for (int s = s0; s < s1; ++s) {
          const float ms = mass(s);
          if (cum + ms > target && ms > 0.f) { pick = s; break; }
          cum += ms;
        }
      const unsigned found = __ballot_sync(0xffffffffu, pick >= 0);
      if (found != 0) {
        const int src = __ffs(found) - 1;
        pick = __shfl_sync(0xffffffffu, pick, src), cum = __shfl_sync(0xffffffffu, cum, src);
      } else {  // rounding past the end: the last segment with mass
        pick = segs - 1;
        while (pick > 0 && pr[pick].max == -INFINITY) --pick;
        cum = 0.f;
        for (int s = 0; s < pick; ++s) cum += mass(s);
      }
      if (lane == 0) seg_s = pick, target_s = target - cum;
    }
  }
  __syncthreads();
  const float m = m_s, inv_sum = 1.f / total_s;
  if (temp <= 0) {
    if (threadIdx.x == 0) token[row] = static_cast<int32_t>(amax_s), logprob[row] = logf(inv_sum);
    return;
  }
  // Inverse CDF inside the segment, in units of exp((z - m) / T).
  const int64_t b = int64_t(seg_s) * seg_len, e = min(v, b + seg_len);
  const float target = target_s;
  const int64_t pick = InverseCdf(
      b, e,
      [&](int64_t j, float* w) {
        *w = __expf((ToF(z[j]) - m) * inv_t);
        return true;
      },
      [&](float) { return target; });
  if (threadIdx.x == 0) {
    token[row] = static_cast<int32_t>(pick);
    logprob[row] = logf(__expf((ToF(z[pick]) - m) * inv_t) * inv_sum);
  }
}
}  // namespace

absl::Status SampleCuda(const void* logits, int64_t n, int64_t v, DType t, const SampleArgs& a, int32_t* token,
                        float* logprob, void* stream, DeviceScratch* scratch) {
  if (n == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  // Segments of at least 2048 tokens, enough of them for about two blocks per multiprocessor.
  const int64_t want = std::max<int64_t>(1, (2 * SmCount() + n - 1) / n);
  const int64_t segs = std::max<int64_t>(1, std::min<int64_t>({want, (v + 2047) / 2048, 256}));
  const int64_t seg_len = (v + segs - 1) / segs;
  if (n > 65535) return absl::InvalidArgumentError("sample: more than 65535 rows");
  ScratchBlock block(scratch, size_t(n * segs) * sizeof(Partial), s);
  Partial* parts = static_cast<Partial*>(block.get());
  if (parts == nullptr) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat("sample: no device memory for ", n * segs, " segment partials"));
  }
  auto run = [&](auto tag) -> absl::Status {
    using T = decltype(tag);
    const T* z = static_cast<const T*>(logits);
    SegmentKernel<T><<<dim3(unsigned(segs), unsigned(n)), kSegThreads, 0, s>>>(z, v, seg_len, a, parts);
    if (auto st = LaunchStatus("sample(segments)"); !st.ok()) return st;
    CombineKernel<T><<<unsigned(n), kSegThreads, 0, s>>>(z, v, seg_len, int(segs), a, parts, token, logprob);
    return LaunchStatus("sample(combine)");
  };
  return t == DType::kF32 ? run(float()) : run(__nv_bfloat16());
}
}  // namespace tessera::kernels
