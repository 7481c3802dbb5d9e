// One warp's online-softmax attention for a single query row: lanes hold head_dim/32
// elements of q and of the output accumulator; keys are visited one at a time.
// Shared by the varlen attention forward and the paged decode kernel. Loops run to the
// compile-time kMaxPerLane so that q and acc stay in registers.
#pragma once
#include "kernels/common/cuda_elem.cuh"

namespace tessera::kernels {

template <typename T, int kMaxPerLane = 8>  // head_dim <= 32 * kMaxPerLane
struct WarpAttentionRow {
  float q[kMaxPerLane], acc[kMaxPerLane];
  float m = -INFINITY, l = 0.f;
  int64_t dim;
  int lane, per;

  __device__ WarpAttentionRow(const T* qrow, int64_t head_dim) : dim(head_dim), lane(threadIdx.x & 31) {
    per = static_cast<int>((dim + 31) / 32);
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      int64_t c = lane + 32 * e;
      q[e] = e < per && c < dim ? ToF(qrow[c]) : 0.f;
      acc[e] = 0.f;
    }
  }
  // Adds key/value row (k, v) with score scale `scale`.
  __device__ void Visit(const T* k, const T* v, float scale) {
    float s = 0.f;
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      int64_t c = lane + 32 * e;
      if (e < per && c < dim) s += q[e] * ToF(k[c]);
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    s *= scale;
    float mn = fmaxf(m, s), corr = __expf(m - mn), p = __expf(s - mn);
    l = l * corr + p;
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      int64_t c = lane + 32 * e;
      acc[e] = acc[e] * corr + (e < per && c < dim ? p * ToF(v[c]) : 0.f);
    }
    m = mn;
  }
  __device__ void Finish(T* out, float* lse) const {
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      int64_t c = lane + 32 * e;
      if (e < per && c < dim) out[c] = FromF<T>(acc[e] / l);
    }
    if (lane == 0) *lse = m + logf(l);
  }
};

}  // namespace tessera::kernels
