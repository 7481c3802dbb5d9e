// Attention on CUDA: bf16 with head_dim 64/128 runs the flash kernels (flash_*_cuda.cu);
// everything else (f32, other head dims) runs the generic kernels here, one warp per
// row with an online softmax — correct for any shape, O(T^2 D) with no tiling.
#include <cub/block/block_scan.cuh>

#include <algorithm>

#include "kernels/attention/attention.h"
#include "kernels/attention/cudnn_attention.h"
#include "kernels/attention/flash_cuda.h"
#include "kernels/common/cuda_elem.cuh"
#include "kernels/common/warp_attention.cuh"

namespace tessera::kernels {
namespace {
constexpr int kMaxPerLane = 8;  // head_dim <= 256 on the generic path

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}

template <typename T>
__global__ void GenericForward(const T* q, const T* k, const T* v, const int32_t* cu, T* out, float* lse,
                               AttentionDims d, const int32_t* seq_of_token) {
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

// Loads one head_dim row into per-lane registers (lane + 32 e).
template <typename T>
__device__ __forceinline__ void LoadRow(const T* p, int64_t dim, float (&x)[kMaxPerLane]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) x[e] = lane + 32 * e < dim ? ToF(p[lane + 32 * e]) : 0.f;
}
__device__ __forceinline__ float Dot(const float (&a)[kMaxPerLane], const float (&b)[kMaxPerLane]) {
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) s += a[e] * b[e];
  return WarpSum(s);
}

// D[i, h] = sum_c dout * out (f32), one warp per row.
template <typename T>
__global__ void RowDot(const T* dout, const T* out, float* dvec, int64_t rows, int64_t dim) {
  const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  if (row >= rows) return;
  float s = 0.f;
  for (int64_t c = threadIdx.x & 31; c < dim; c += 32) s += ToF(dout[row * dim + c]) * ToF(out[row * dim + c]);
  s = WarpSum(s);
  if ((threadIdx.x & 31) == 0) dvec[row] = s;
}

// dq[i, h] = scale * sum_j P_ij (dP_ij - D_i) k_j, one warp per (query, head).
template <typename T>
__global__ void GenericBackwardDq(const T* q, const T* k, const T* v, const int32_t* cu, const T* dout,
                                  const float* lse, const float* dvec, T* dq, AttentionDims d, const int32_t* seq_of_token) {
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  if (warp >= d.tokens * d.q_heads) return;
  const int64_t i = warp / d.q_heads, h = warp % d.q_heads, kvh = h / (d.q_heads / d.kv_heads), D = d.head_dim;
  const int b = seq_of_token[i];
  const int64_t start = cu[b], last = d.causal ? i : cu[b + 1] - 1, row = i * d.q_heads + h;
  float qr[kMaxPerLane], gr[kMaxPerLane], kr[kMaxPerLane], vr[kMaxPerLane], acc[kMaxPerLane] = {};
  LoadRow(q + row * D, D, qr);
  LoadRow(dout + row * D, D, gr);
  for (int64_t j = start; j <= last; ++j) {
    LoadRow(k + (j * d.kv_heads + kvh) * D, D, kr);
    LoadRow(v + (j * d.kv_heads + kvh) * D, D, vr);
    const float p = __expf(Dot(qr, kr) * d.scale - lse[row]), ds = p * (Dot(gr, vr) - dvec[row]);
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) acc[e] += ds * kr[e];
  }
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e)
    if (lane + 32 * e < D) dq[row * D + lane + 32 * e] = FromF<T>(acc[e] * d.scale);
}

// dk[j, g], dv[j, g] summed over the group's query heads and the queries that see key j;
// one warp per (key, kv head).
template <typename T>
__global__ void GenericBackwardDkv(const T* q, const T* k, const T* v, const int32_t* cu, const T* dout,
                                   const float* lse, const float* dvec, T* dk, T* dv, AttentionDims d,
                                   const int32_t* seq_of_token) {
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  if (warp >= d.tokens * d.kv_heads) return;
  const int64_t j = warp / d.kv_heads, kvh = warp % d.kv_heads, group = d.q_heads / d.kv_heads, D = d.head_dim;
  const int b = seq_of_token[j];
  const int64_t first = d.causal ? j : cu[b], end = cu[b + 1];
  float kr[kMaxPerLane], vr[kMaxPerLane], qr[kMaxPerLane], gr[kMaxPerLane], ak[kMaxPerLane] = {}, av[kMaxPerLane] = {};
  LoadRow(k + warp * D, D, kr);
  LoadRow(v + warp * D, D, vr);
  for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h)
    for (int64_t i = first; i < end; ++i) {
      const int64_t row = i * d.q_heads + h;
      LoadRow(q + row * D, D, qr);
      LoadRow(dout + row * D, D, gr);
      const float p = __expf(Dot(qr, kr) * d.scale - lse[row]), ds = p * (Dot(gr, vr) - dvec[row]);
#pragma unroll
      for (int e = 0; e < kMaxPerLane; ++e) av[e] += p * gr[e], ak[e] += ds * qr[e];
    }
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e)
    if (lane + 32 * e < D) {
      dk[warp * D + lane + 32 * e] = FromF<T>(ak[e] * d.scale);
      dv[warp * D + lane + 32 * e] = FromF<T>(av[e]);
    }
}

__global__ void SeqOfToken(const int32_t* cu, int64_t batch, int32_t* seq) {
  for (int64_t b = blockIdx.x; b < batch; b += gridDim.x)
    for (int64_t t = cu[b] + threadIdx.x; t < cu[b + 1]; t += blockDim.x) seq[t] = static_cast<int32_t>(b);
}

constexpr int kTableThreads = 1024;
__global__ void __launch_bounds__(kTableThreads) TileTable(const int32_t* cu, int64_t batch, int tile, int2* table,
                                                          int64_t capacity, int32_t* first_tile, flash::TileOrder order) {
  using Scan = cub::BlockScan<int64_t, kTableThreads>;
  __shared__ typename Scan::TempStorage tmp;
  int64_t carry = 0;
  for (int64_t base = 0; base < batch; base += kTableThreads) {
    const int64_t b = base + threadIdx.x;
    const int64_t n = b < batch ? (cu[b + 1] - cu[b] + tile - 1) / tile : 0;
    int64_t off, total;
    Scan(tmp).ExclusiveSum(n, off, total);
    if (first_tile != nullptr && b < batch) first_tile[b] = static_cast<int32_t>(carry + off);
    if (table != nullptr)
      for (int64_t j = 0; j < n; ++j) {  // flash::TileOrder
        const int64_t tile_j = order == flash::TileOrder::kFirstFirst ? j
                               : order == flash::TileOrder::kLastFirst ? n - 1 - j
                                                                       : (j % 2 == 0 ? n - 1 - j / 2 : j / 2);
        table[carry + off + j] = make_int2(static_cast<int>(b), static_cast<int>(tile_j));
      }
    carry += total;
    __syncthreads();  // tmp is reused
  }
  if (table != nullptr)
    for (int64_t i = carry + threadIdx.x; i < capacity; i += kTableThreads) table[i] = make_int2(-1, 0);
}

template <typename T>
const T* C(const void* p) { return static_cast<const T*>(p); }
template <typename T>
T* M(void* p) { return static_cast<T*>(p); }

// Stream-ordered scratch from the pool, freed (stream-ordered) on scope exit.
struct Scratch {
  void* p = nullptr;
  cudaStream_t s;
  explicit Scratch(cudaStream_t st) : s(st) {}
  ~Scratch() { if (p) cudaFreeAsync(p, s); }
  bool Alloc(size_t bytes) { return cudaMallocAsync(&p, bytes ? bytes : 1, s) == cudaSuccess; }
};

unsigned WarpBlocks(int64_t warps) { return static_cast<unsigned>((warps * 32 + 255) / 256); }
}  // namespace

namespace flash {
absl::Status BuildTileTable(const int32_t* cu, int64_t batch, int tile, int2* table, int64_t capacity, cudaStream_t s,
                            int32_t* first_tile, TileOrder order) {
  TileTable<<<1, kTableThreads, 0, s>>>(cu, batch, tile, table, capacity, first_tile, order);
  return LaunchStatus("attention(tile table)");
}
}  // namespace flash

namespace cudnn_attention {
namespace {
__global__ void StatsKernel(const float* in, float* out, int64_t heads, int64_t seq, int64_t total) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / heads, h = i % heads, b = t / seq, s = t % seq;
    out[i] = in[(b * heads + h) * seq + s];
  }
}
}  // namespace
absl::Status StatsToTokenMajor(const float* stats, float* lse, int64_t heads, int64_t seq, int64_t rows, cudaStream_t s) {
  StatsKernel<<<static_cast<unsigned>(std::min<int64_t>((rows * heads + 255) / 256, 4096)), 256, 0, s>>>(stats, lse, heads, seq,
                                                                                                   rows * heads);
  return LaunchStatus("attention(cudnn stats)");
}
}  // namespace cudnn_attention

namespace {
// Whether the forward takes cuDNN's path (the forward and Prepare decide alike): forced
// (kCudnn; what it cannot serve is an error), tried (kAuto over sequences of one length up
// to kCudnnMaxAutoSeq whose plan Prepare built: the flash kernels if it did not, if cuDNN
// is missing or has no engine), or not.
enum class CudnnRoute { kNo, kForced, kTry };
absl::Status RouteToCudnn(const AttentionDims& d, DType t, CudnnRoute* route) {
  *route = CudnnRoute::kNo;
  const bool served = flash::ShapeServed(d, t);  // bf16, head_dim 64 / 128: cuDNN's shapes too
  if (d.engine == AttentionEngine::kCudnn) {
    if (!served) return absl::InvalidArgumentError("attention (cuda): the cuDNN engine serves bf16 with head_dim 64 or 128 only");
    if (d.uniform_len == 0)
      return absl::InvalidArgumentError("attention (cuda): the cuDNN engine needs sequences of one length (host cu_seqlens)");
    *route = CudnnRoute::kForced;
  } else if (d.engine == AttentionEngine::kAuto && served && d.uniform_len > 0 && d.uniform_len <= kCudnnMaxAutoSeq) {
    *route = CudnnRoute::kTry;
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status AttentionForwardCuda(const void* q, const void* k, const void* v, const int32_t* cu, void* out, float* lse,
                                  const AttentionDims& d, DType t, void* stream) {
  if (d.tokens == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  CudnnRoute route;
  if (absl::Status st = RouteToCudnn(d, t, &route); !st.ok()) return st;
  if (route == CudnnRoute::kForced) return cudnn_attention::Forward(q, k, v, out, lse, d, d.uniform_len, s);
  // Tried, never built here (a shape not prepared runs the flash kernels), and a failure's
  // reason is cached: falling back costs one failed lookup per call.
  if (route == CudnnRoute::kTry && cudnn_attention::Forward(q, k, v, out, lse, d, d.uniform_len, s, /*build=*/false).ok())
    return absl::OkStatus();
  if (flash::Supported(d, t)) return flash::Forward(q, k, v, cu, out, lse, d, s);
  if (d.head_dim > 32 * kMaxPerLane) return absl::UnimplementedError("attention (cuda): head_dim > 256");
  Scratch seq(s);
  if (!seq.Alloc(d.tokens * sizeof(int32_t))) return LaunchStatus("attention(alloc)");
  SeqOfToken<<<std::min<int64_t>(d.batch, 65535), 256, 0, s>>>(cu, d.batch, M<int32_t>(seq.p));
  const unsigned blocks = WarpBlocks(d.tokens * d.q_heads);
  if (t == DType::kF32)
    GenericForward<<<blocks, 256, 0, s>>>(C<float>(q), C<float>(k), C<float>(v), cu, M<float>(out), lse, d, M<int32_t>(seq.p));
  else
    GenericForward<<<blocks, 256, 0, s>>>(C<__nv_bfloat16>(q), C<__nv_bfloat16>(k), C<__nv_bfloat16>(v), cu,
                                          M<__nv_bfloat16>(out), lse, d, M<int32_t>(seq.p));
  return LaunchStatus("attention_forward");
}

absl::Status AttentionPrepareCuda(const AttentionDims& d, DType t, void* stream) {
  if (d.tokens == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  CudnnRoute route;
  if (absl::Status st = RouteToCudnn(d, t, &route); !st.ok()) return st;
  if (route == CudnnRoute::kForced) return cudnn_attention::Prepare(d, d.uniform_len, s);
  if (route == CudnnRoute::kTry) cudnn_attention::Prepare(d, d.uniform_len, s, /*bounded=*/true).IgnoreError();
  return absl::OkStatus();
}

absl::Status AttentionBackwardCuda(const void* q, const void* k, const void* v, const int32_t* cu, const void* out,
                                   const void* dout, const float* lse, void* dq, void* dk, void* dv,
                                   const AttentionDims& d, DType t, void* stream) {
  if (d.tokens == 0) return absl::OkStatus();
  if (d.head_dim > 32 * kMaxPerLane) return absl::UnimplementedError("attention backward (cuda): head_dim > 256");
  auto s = static_cast<cudaStream_t>(stream);
  if (flash::Supported(d, t)) return flash::Backward(q, k, v, cu, out, dout, lse, dq, dk, dv, d, s);
  const int64_t rows = d.tokens * d.q_heads;
  Scratch dvec(s);
  if (!dvec.Alloc(rows * sizeof(float))) return LaunchStatus("attention_backward(alloc)");
  float* D = M<float>(dvec.p);
  if (t == DType::kF32)
    RowDot<<<WarpBlocks(rows), 256, 0, s>>>(C<float>(dout), C<float>(out), D, rows, d.head_dim);
  else
    RowDot<<<WarpBlocks(rows), 256, 0, s>>>(C<__nv_bfloat16>(dout), C<__nv_bfloat16>(out), D, rows, d.head_dim);
  Scratch seq(s);
  if (!seq.Alloc(d.tokens * sizeof(int32_t))) return LaunchStatus("attention_backward(alloc)");
  const int32_t* sot = M<int32_t>(seq.p);
  SeqOfToken<<<std::min<int64_t>(d.batch, 65535), 256, 0, s>>>(cu, d.batch, M<int32_t>(seq.p));
  if (t == DType::kF32) {
    GenericBackwardDq<<<WarpBlocks(rows), 256, 0, s>>>(C<float>(q), C<float>(k), C<float>(v), cu, C<float>(dout), lse, D,
                                                       M<float>(dq), d, sot);
    GenericBackwardDkv<<<WarpBlocks(d.tokens * d.kv_heads), 256, 0, s>>>(C<float>(q), C<float>(k), C<float>(v), cu,
                                                                          C<float>(dout), lse, D, M<float>(dk), M<float>(dv), d, sot);
  } else {
    using B = __nv_bfloat16;
    GenericBackwardDq<<<WarpBlocks(rows), 256, 0, s>>>(C<B>(q), C<B>(k), C<B>(v), cu, C<B>(dout), lse, D, M<B>(dq), d, sot);
    GenericBackwardDkv<<<WarpBlocks(d.tokens * d.kv_heads), 256, 0, s>>>(C<B>(q), C<B>(k), C<B>(v), cu, C<B>(dout), lse, D,
                                                                          M<B>(dk), M<B>(dv), d, sot);
  }
  return LaunchStatus("attention_backward");
}
namespace {
// One warp per row: the weights from the two log-sum-exps, then the row blended.
template <typename T>
__global__ void AttentionMergeKernel(T* out, float* lse, const T* out_b, const float* lse_b, int64_t rows, int64_t dim) {
  const int64_t row = blockIdx.x * int64_t(blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const float a = lse[row], b = lse_b[row];
  if (b == -INFINITY) return;
  const float m = fmaxf(a, b), l = m + logf(expf(a - m) + expf(b - m));
  const float wa = expf(a - l), wb = expf(b - l);
  for (int64_t i = threadIdx.x % 32; i < dim; i += 32)
    out[row * dim + i] = FromF<T>(wa * ToF(out[row * dim + i]) + wb * ToF(out_b[row * dim + i]));
  __syncwarp();
  if (threadIdx.x % 32 == 0) lse[row] = l;
}
}  // namespace

absl::Status AttentionMergeCuda(void* out, float* lse, const void* out_b, const float* lse_b, int64_t rows, int64_t dim,
                                DType t, void* stream) {
  if (rows == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  const unsigned blocks = static_cast<unsigned>((rows + 7) / 8);
  if (t == DType::kF32)
    AttentionMergeKernel<<<blocks, 256, 0, s>>>(static_cast<float*>(out), lse, static_cast<const float*>(out_b), lse_b, rows, dim);
  else if (t == DType::kBF16)
    AttentionMergeKernel<<<blocks, 256, 0, s>>>(static_cast<__nv_bfloat16*>(out), lse,
                                                static_cast<const __nv_bfloat16*>(out_b), lse_b, rows, dim);
  else
    AttentionMergeKernel<<<blocks, 256, 0, s>>>(static_cast<__half*>(out), lse, static_cast<const __half*>(out_b), lse_b,
                                                rows, dim);
  return LaunchStatus("attention_merge");
}

}  // namespace tessera::kernels
