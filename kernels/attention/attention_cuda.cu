// Attention forward on CUDA, one warp per (query token, head): keys are visited in
// order with an online softmax; each lane holds head_dim/32 output elements. Correct
// for any length; O(T^2 D) with no tiling — a placeholder until the flash kernel.
#include "kernels/attention/attention.h"
#include "kernels/common/cuda_elem.cuh"
#include "kernels/common/warp_attention.cuh"

#include <algorithm>

namespace tessera::kernels {
namespace {
constexpr int kMaxPerLane = 8;  // head_dim <= 256

template <typename T>
__global__ void Forward(const T* q, const T* k, const T* v, const int32_t* cu, T* out, float* lse, AttentionDims d,
                        const int32_t* seq_of_token) {
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  if (warp >= d.tokens * d.q_heads) return;
  const int64_t i = warp / d.q_heads, h = warp % d.q_heads, kvh = h / (d.q_heads / d.kv_heads);
  const int b = seq_of_token[i];
  const int64_t start = cu[b], last = d.causal ? i : cu[b + 1] - 1;
  WarpAttentionRow<T, kMaxPerLane> row(q + (i * d.q_heads + h) * d.head_dim, d.head_dim);
  for (int64_t j = start; j <= last; ++j) {
    const int64_t kb = (j * d.kv_heads + kvh) * d.head_dim;
    row.Visit(k + kb, v + kb, d.scale);
  }
  row.Finish(out + (i * d.q_heads + h) * d.head_dim, lse + i * d.q_heads + h);
}

__global__ void SeqOfToken(const int32_t* cu, int64_t batch, int32_t* seq) {
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x)
    for (int64_t t = cu[b] + threadIdx.x; t < cu[b + 1]; t += blockDim.x) seq[t] = static_cast<int32_t>(b);
}
}  // namespace

absl::Status AttentionForwardCuda(const void* q, const void* k, const void* v, const int32_t* cu, void* out, float* lse,
                                  const AttentionDims& d, DType t, void* stream) {
  if (d.tokens == 0) return absl::OkStatus();
  if (d.head_dim > 32 * kMaxPerLane) return absl::UnimplementedError("attention (cuda): head_dim > 256");
  auto s = static_cast<cudaStream_t>(stream);
  int32_t* seq = nullptr;
  if (cudaMallocAsync(&seq, d.tokens * sizeof(int32_t), s) != cudaSuccess) return LaunchStatus("attention(alloc)");
  SeqOfToken<<<std::min<int64_t>(d.batch, 65535), 256, 0, s>>>(cu, d.batch, seq);
  int64_t warps = d.tokens * d.q_heads;
  unsigned blocks = static_cast<unsigned>((warps * 32 + 255) / 256);
  if (t == DType::kF32)
    Forward<<<blocks, 256, 0, s>>>(static_cast<const float*>(q), static_cast<const float*>(k), static_cast<const float*>(v),
                                   cu, static_cast<float*>(out), lse, d, seq);
  else
    Forward<<<blocks, 256, 0, s>>>(static_cast<const __nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(k),
                                   static_cast<const __nv_bfloat16*>(v), cu, static_cast<__nv_bfloat16*>(out), lse, d, seq);
  auto st = LaunchStatus("attention_forward");
  cudaFreeAsync(seq, s);
  return st;
}
}  // namespace tessera::kernels
