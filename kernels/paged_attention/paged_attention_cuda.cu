// Paged decode attention on CUDA. bf16 with head_dim 64/128 runs the split-KV tensor-core
// kernel (paged_split_cuda.cu); other cases run this generic one: one warp per (sequence,
// query head), cached tokens in order through the block table, online softmax.
#include "absl/strings/str_cat.h"
#include "kernels/common/cuda_elem.cuh"
#include "kernels/common/warp_attention.cuh"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/paged_attention/paged_split.h"

namespace tessera::kernels {
namespace {
constexpr int kMaxPerLane = 8;

template <typename T>
__global__ void Decode(const T* q, const T* kc, const T* vc, const int32_t* tables, const int32_t* lens, T* out,
                       float* lse, PagedDims d) {
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  if (warp >= d.batch * d.q_heads) return;
  const int64_t b = warp / d.q_heads, h = warp % d.q_heads, g = h / (d.q_heads / d.kv_heads);
  WarpAttentionRow<T, kMaxPerLane> row(q + (b * d.q_heads + h) * d.head_dim, d.head_dim);
  const int64_t n = lens[b];
  for (int64_t tok = 0; tok < n; ++tok) {
    const int64_t blk = tables[b * d.max_blocks + tok / d.block_size];
    const int64_t base = ((blk * d.block_size + tok % d.block_size) * d.kv_heads + g) * d.head_dim;
    row.Visit(kc + base, vc + base, d.scale);
  }
  row.Finish(out + (b * d.q_heads + h) * d.head_dim, lse + b * d.q_heads + h);
}
}  // namespace

absl::Status PagedAttentionCuda(const void* q, const void* kc, const void* vc, const int32_t* tables, const int32_t* lens,
                                void* out, float* lse, const PagedDims& d, DType t, void* stream, DeviceScratch* scratch) {
  if (d.batch == 0) return absl::OkStatus();
  if (d.head_dim > 32 * kMaxPerLane) return absl::UnimplementedError("paged attention (cuda): head_dim > 256");
  auto s = static_cast<cudaStream_t>(stream);
  if (paged::Supported(d, t)) return paged::Decode(q, kc, vc, tables, lens, out, lse, d, s, scratch);
  unsigned blocks = static_cast<unsigned>((d.batch * d.q_heads * 32 + 255) / 256);
  if (t == DType::kF32)
    Decode<<<blocks, 256, 0, s>>>(static_cast<const float*>(q), static_cast<const float*>(kc), static_cast<const float*>(vc),
                                  tables, lens, static_cast<float*>(out), lse, d);
  else
    Decode<<<blocks, 256, 0, s>>>(static_cast<const __nv_bfloat16*>(q), static_cast<const __nv_bfloat16*>(kc),
                                  static_cast<const __nv_bfloat16*>(vc), tables, lens, static_cast<__nv_bfloat16*>(out), lse, d);
  return LaunchStatus("paged_attention");
}
bool PagedAttentionRopeCudaSupported(const PagedDims& d, DType t) { return paged::Supported(d, t); }

absl::Status PagedAttentionRopeCuda(const void* q, const PagedRopeArgs& rope, void* k_cache, void* v_cache,
                                    const int32_t* tables, const int32_t* lens, void* out, float* lse, const PagedDims& d,
                                    DType t, void* stream, DeviceScratch* scratch) {
  if (!PagedAttentionRopeCudaSupported(d, t))
    return absl::InvalidArgumentError(absl::StrCat("paged attention with rope (cuda): bf16 with head dim 64 or 128 and at most 16 "
                                                   "query heads per kv head; got head dim ", d.head_dim));
  if ((rope.q_norm == nullptr) != (rope.k_norm == nullptr))
    return absl::InvalidArgumentError("paged attention with rope: q_norm and k_norm go together");
  if (d.batch == 0) return absl::OkStatus();
  return paged::DecodeRope(q, rope, k_cache, v_cache, tables, lens, out, lse, d, static_cast<cudaStream_t>(stream), scratch);
}

namespace {
// One block per token; 4-byte words when rows allow (bf16/f32 rows of even length), else bytes.
template <typename W>
__global__ void KvCacheWriteKernel(const W* k, const W* v, const int32_t* slots, W* kc, W* vc, int64_t words) {
  const int64_t i = blockIdx.x, dst = int64_t(slots[i]) * words;
  for (int64_t j = threadIdx.x; j < words; j += blockDim.x) {
    kc[dst + j] = k[i * words + j];
    vc[dst + j] = v[i * words + j];
  }
}
}  // namespace

absl::Status KvCacheWriteCuda(const void* k, const void* v, const int32_t* slots, void* k_cache, void* v_cache,
                              int64_t tokens, int64_t row_bytes, void* stream) {
  if (tokens == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = static_cast<unsigned>(tokens);
  if (row_bytes % 4 == 0)
    KvCacheWriteKernel<<<blocks, 128, 0, s>>>(static_cast<const uint32_t*>(k), static_cast<const uint32_t*>(v), slots,
                                              static_cast<uint32_t*>(k_cache), static_cast<uint32_t*>(v_cache), row_bytes / 4);
  else
    KvCacheWriteKernel<<<blocks, 128, 0, s>>>(static_cast<const uint8_t*>(k), static_cast<const uint8_t*>(v), slots,
                                              static_cast<uint8_t*>(k_cache), static_cast<uint8_t*>(v_cache), row_bytes);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? absl::OkStatus() : absl::InternalError(absl::StrCat("kv_cache_write: ", cudaGetErrorString(e)));
}

}  // namespace tessera::kernels
