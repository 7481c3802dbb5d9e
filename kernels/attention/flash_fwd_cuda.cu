// Flash-attention forward (FlashAttention-2 scheme) with bf16 mma.sync tensor cores.
// One CTA = kWarps warps = a tile of 16*kWarps queries of one head; each warp owns 16
// query rows and keeps its Q fragments, the online-softmax state and the output
// accumulator in registers. K and V tiles of kBc keys are streamed through shared
// memory with cp.async: V(j) loads while S = Q K(j)^T is computed, K(j+1) while
// O += P V(j) is. The probabilities go from the S accumulator straight into the A
// operand of the second MMA. Causal CTAs stop at the diagonal; only tiles that cross it
// (or the sequence end) pay for masking.
#include "kernels/attention/flash_cuda.h"
#include "kernels/common/cuda_elem.cuh"
#include "kernels/common/tensor_core.cuh"

namespace tessera::kernels::flash {
namespace {
using bf16 = __nv_bfloat16;
constexpr float kLog2e = 1.4426950408889634f;

struct FwdParams {
  const bf16 *q, *k, *v;
  bf16* out;
  float* lse;
  const int32_t* cu;
  const int2* table;
  int hq, hkv;
  float scale;
};

template <int D, int kWarps, int kBc>
constexpr int FwdSmemBytes() {
  return (kWarps * 16 + 2 * kBc) * D * 2;
}

template <int D, int kWarps, int kBc, bool kCausal>
__global__ void __launch_bounds__(kWarps * 32) FwdKernel(FwdParams p) {
  constexpr int kBr = kWarps * 16, kThreads = kWarps * 32, kKSteps = D / 16, kNTiles = kBc / 8, kDTiles = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const tc::SwizzledTile<D> sQ{reinterpret_cast<bf16*>(smem)}, sK{sQ.base + kBr * D}, sV{sK.base + kBc * D};

  const int2 tile = p.table[blockIdx.x];
  if (tile.x < 0) return;
  const int h = blockIdx.y, kvh = h / (p.hq / p.hkv);
  const int start = p.cu[tile.x], len = p.cu[tile.x + 1] - start, m0 = tile.y * kBr;
  const int64_t q_stride = int64_t(p.hq) * D, kv_stride = int64_t(p.hkv) * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int mi = lane / 8, mr = lane % 8;  // which 8x8 matrix of an x4 ldmatrix this lane addresses, and its row
  const int row0 = m0 + warp * 16;         // first query (sequence-local) of this warp
  const float sl2 = p.scale * kLog2e;

  const bf16* kbase = p.k + int64_t(start) * kv_stride + kvh * D;
  const bf16* vbase = p.v + int64_t(start) * kv_stride + kvh * D;
  tc::LoadTileAsync<kBr, D, kThreads>(sQ, p.q + (int64_t(start) + m0) * q_stride + h * D, q_stride, len - m0);
  tc::LoadTileAsync<kBc, D, kThreads>(sK, kbase, kv_stride, len);
  tc::CpAsyncCommit();

  const int n_end = kCausal ? min(len, m0 + kBr) : len;
  const int n_tiles = (n_end + kBc - 1) / kBc;
  float o[kDTiles][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  uint32_t qf[kKSteps][4];

  for (int j = 0; j < n_tiles; ++j) {
    const int n0 = j * kBc;
    tc::CpAsyncWait<0>();
    __syncthreads();  // K(j) (and Q) landed; every warp is done with V(j-1)
    tc::LoadTileAsync<kBc, D, kThreads>(sV, vbase + int64_t(n0) * kv_stride, kv_stride, len - n0);
    tc::CpAsyncCommit();
    if (j == 0) {
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) tc::Ldmatrix4(qf[kk], sQ.Chunk(warp * 16 + (mi & 1) * 8 + mr, kk * 2 + (mi >> 1)));
    }
    float s[kNTiles][4] = {};
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t kf[4];
        tc::Ldmatrix4(kf, sK.Chunk(np * 16 + (mi >> 1) * 8 + mr, kk * 2 + (mi & 1)));
        tc::Mma(s[2 * np], qf[kk], kf[0], kf[1]);
        tc::Mma(s[2 * np + 1], qf[kk], kf[2], kf[3]);
      }
    }
    if (n0 + kBc > len || (kCausal && n0 + kBc - 1 > row0)) {
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int kj = n0 + nt * 8 + 2 * t + (e & 1), qi = row0 + g + (e >> 1) * 8;
          if (kj >= len || (kCausal && kj > qi)) s[nt][e] = -INFINITY;
        }
    }
    // Online softmax; rows g (r = 0) and g + 8 (r = 1) of this warp's 16.
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = m[r];
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      mx = tc::QuadMax(mx);
      const float ms = mx == -INFINITY ? 0.f : mx * sl2;
      const float alpha = tc::Exp2(m[r] * sl2 - ms);
      m[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) {
          s[nt][e] = tc::Exp2(fmaf(s[nt][e], sl2, -ms));
          sum += s[nt][e];
        }
      l[r] = l[r] * alpha + sum;
#pragma unroll
      for (int dt = 0; dt < kDTiles; ++dt) o[dt][2 * r] *= alpha, o[dt][2 * r + 1] *= alpha;
    }
    tc::CpAsyncWait<0>();
    __syncthreads();  // V(j) landed; every warp is done with K(j)
    if (j + 1 < n_tiles) {
      tc::LoadTileAsync<kBc, D, kThreads>(sK, kbase + int64_t(n0 + kBc) * kv_stride, kv_stride, len - n0 - kBc);
      tc::CpAsyncCommit();
    }
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) {
      const uint32_t a[4] = {tc::PackBf16(s[2 * kk][0], s[2 * kk][1]), tc::PackBf16(s[2 * kk][2], s[2 * kk][3]),
                             tc::PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             tc::PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vf[4];
        tc::Ldmatrix4T(vf, sV.Chunk(kk * 16 + (mi & 1) * 8 + mr, dp * 2 + (mi >> 1)));
        tc::Mma(o[2 * dp], a, vf[0], vf[1]);
        tc::Mma(o[2 * dp + 1], a, vf[2], vf[3]);
      }
    }
  }
  // Epilogue: normalize, write bf16 pairs and the log-sum-exp.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = tc::QuadSum(l[r]);
    const int qi = row0 + g + 8 * r;
    if (qi >= len) continue;
    const float inv = 1.f / sum;
    bf16* orow = p.out + (int64_t(start) + qi) * q_stride + h * D + 2 * t;
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt)
      *reinterpret_cast<uint32_t*>(orow + dt * 8) = tc::PackBf16(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    if (t == 0) p.lse[(int64_t(start) + qi) * p.hq + h] = m[r] * p.scale + logf(sum);
  }
}

template <int D, int kWarps, int kBc, bool kCausal>
absl::Status Launch(const FwdParams& p, const AttentionDims& d, int2* table, cudaStream_t s) {
  constexpr int kBr = kWarps * 16, kSmem = FwdSmemBytes<D, kWarps, kBc>();
  auto kernel = FwdKernel<D, kWarps, kBc, kCausal>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) != cudaSuccess)
    return LaunchStatus("flash_forward(smem attribute)");
  const int64_t tiles = TileCapacity(d, kBr);
  auto st = BuildTileTable(p.cu, d.batch, kBr, table, tiles, s);
  if (!st.ok()) return st;
  kernel<<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(d.q_heads)), kWarps * 32, kSmem, s>>>(p);
  return LaunchStatus("flash_forward");
}
}  // namespace

absl::Status Forward(const void* q, const void* k, const void* v, const int32_t* cu, void* out, float* lse,
                     const AttentionDims& d, cudaStream_t s) {
  FwdParams p{static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
              static_cast<bf16*>(out), lse, cu, nullptr, static_cast<int>(d.q_heads), static_cast<int>(d.kv_heads),
              d.scale};
  constexpr int kWarps = 8, kBr = kWarps * 16;
  int2* table = nullptr;
  if (cudaMallocAsync(&table, TileCapacity(d, kBr) * sizeof(int2), s) != cudaSuccess)
    return LaunchStatus("flash_forward(alloc)");
  p.table = table;
  auto launch = d.head_dim == 64 ? (d.causal ? Launch<64, kWarps, 64, true> : Launch<64, kWarps, 64, false>)
                                 : (d.causal ? Launch<128, kWarps, 64, true> : Launch<128, kWarps, 64, false>);
  absl::Status st = launch(p, d, table, s);
  cudaFreeAsync(table, s);
  return st;
}

}  // namespace tessera::kernels::flash
