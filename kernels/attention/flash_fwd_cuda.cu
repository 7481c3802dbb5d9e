// Flash-attention forward for sm_90a: wgmma (warpgroup MMA) on shared-memory tiles in
// the 128-byte swizzle, FlashAttention-2's online softmax in registers.
// One CTA = 2 warpgroups = 128 queries of one head (64 per warpgroup); keys stream in
// tiles of 128 through a three-stage cp.async pipeline. Per tile and warpgroup:
// S = Q K^T (wgmma, both operands in shared memory, K-major), masking only on tiles that
// cross the diagonal or the sequence end, the online softmax on the accumulators, and
// O += P V with P straight from registers (the accumulator layout is the A-fragment
// layout) and V N-major in shared memory. The P V product of tile j-1 runs on the tensor
// cores while the softmax of tile j runs on the CUDA cores (FlashAttention-3's
// intra-warpgroup overlap). Causal CTAs stop at the diagonal.
#include "kernels/attention/flash_cuda.h"
#include "kernels/common/cuda_elem.cuh"
#include "kernels/common/wgmma.cuh"

namespace tessera::kernels::flash {
namespace {
using bf16 = __nv_bfloat16;
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kWarpgroups = 2, kThreads = 128 * kWarpgroups, kBr = 64 * kWarpgroups, kBc = 128, kStages = 3;

struct FwdParams {
  const bf16 *q, *k, *v;
  bf16* out;
  float* lse;
  const int32_t* cu;
  const int2* table;
  int hq, hkv;
  float scale;
};

template <int D>
constexpr int FwdSmemBytes() {
  return wg::Sw128Tile<kBr, D>::kBytes + 2 * kStages * wg::Sw128Tile<kBc, D>::kBytes + 1024;  // + alignment slack
}

template <int D>
__device__ __forceinline__ void PvMma(float (&o)[D / 2], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (D == 128) wg::WgmmaRS_m64n128<1>(o, a, desc);
  else wg::WgmmaRS_m64n64<1>(o, a, desc);
}

template <int D, bool kCausal>
__global__ void __launch_bounds__(kThreads, 1) FwdKernel(FwdParams p) {
  using QTile = wg::Sw128Tile<kBr, D>;
  using KTile = wg::Sw128Tile<kBc, D>;
  extern __shared__ unsigned char smem_raw[];
  char* smem = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  const QTile sQ{reinterpret_cast<bf16*>(smem)};
  auto sK = [&](int st) { return KTile{reinterpret_cast<bf16*>(smem + QTile::kBytes + 2 * st * KTile::kBytes)}; };
  auto sV = [&](int st) { return KTile{reinterpret_cast<bf16*>(smem + QTile::kBytes + (2 * st + 1) * KTile::kBytes)}; };

  const int2 tile = p.table[blockIdx.x];
  if (tile.x < 0) return;
  const int h = blockIdx.y, kvh = h / (p.hq / p.hkv);
  const int start = p.cu[tile.x], len = p.cu[tile.x + 1] - start, m0 = tile.y * kBr;
  const int64_t q_stride = int64_t(p.hq) * D, kv_stride = int64_t(p.hkv) * D;
  const int tid = threadIdx.x, wgi = tid / 128, warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int row0 = m0 + wgi * 64 + warp * 16;  // sequence-local query of this thread's rows g and g + 8
  const float sl2 = p.scale * kLog2e;

  const bf16* kbase = p.k + int64_t(start) * kv_stride + kvh * D;
  const bf16* vbase = p.v + int64_t(start) * kv_stride + kvh * D;
  const int n_end = kCausal ? min(len, m0 + kBr) : len;
  const int n_tiles = (n_end + kBc - 1) / kBc;
  auto load_kv = [&](int j) {
    const int n0 = j * kBc, st = j % kStages;
    wg::LoadTileAsync<kBc, D, kThreads>(sK(st), kbase + int64_t(n0) * kv_stride, kv_stride, len - n0, tid);
    wg::LoadTileAsync<kBc, D, kThreads>(sV(st), vbase + int64_t(n0) * kv_stride, kv_stride, len - n0, tid);
    tc::CpAsyncCommit();
  };
  wg::LoadTileAsync<kBr, D, kThreads>(sQ, p.q + (int64_t(start) + m0) * q_stride + h * D, q_stride, len - m0, tid);
  load_kv(0);
  if (n_tiles > 1) load_kv(1);

  // Software pipeline per warpgroup: while the softmax of tile j runs on the CUDA cores,
  // the tensor cores do O += P(j-1) V(j-1). Tile j+2 loads into the stage of j-1.
  float o[D / 2] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  uint32_t pa[kBc / 16][4];
  for (int j = 0; j < n_tiles; ++j) {
    const int n0 = j * kBc;
    if (j + 1 < n_tiles) tc::CpAsyncWait<1>();
    else tc::CpAsyncWait<0>();
    wg::FenceProxyAsync();
    __syncthreads();  // tile j (and Q) visible to every warpgroup's wgmma

    float s[kBc / 2];
#pragma unroll
    for (int i = 0; i < kBc / 2; ++i) s[i] = 0.f;
    wg::Fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wg::WgmmaSS_m64n128(s, wg::KMajorDesc(sQ, wgi * 64, kk), wg::KMajorDesc(sK(j % kStages), 0, kk), 1);
    wg::Commit();
    if (j > 0) {
      const KTile v = sV((j - 1) % kStages);
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) PvMma<D>(o, pa[kk], wg::MnMajorDesc(v, kk));
      wg::Commit();
      wg::Wait<1>();
    } else {
      wg::Wait<0>();
    }
    wg::FenceRegs(s);

    if (n0 + kBc > len || (kCausal && n0 + kBc - 1 > row0)) {
#pragma unroll
      for (int i = 0; i < kBc / 2; ++i) {
        const int kj = n0 + 8 * (i / 4) + 2 * t + (i & 1), qi = row0 + g + 8 * ((i >> 1) & 1);
        if (kj >= len || (kCausal && kj > qi)) s[i] = -INFINITY;
      }
    }
    // Online softmax for rows g (r = 0) and g + 8 (r = 1).
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = m[r];
#pragma unroll
      for (int c = 0; c < kBc / 8; ++c) mx = fmaxf(mx, fmaxf(s[4 * c + 2 * r], s[4 * c + 2 * r + 1]));
      mx = tc::QuadMax(mx);
      const float ms = mx == -INFINITY ? 0.f : mx * sl2;
      alpha[r] = tc::Exp2(m[r] * sl2 - ms);
      m[r] = mx;
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < kBc / 8; ++c)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[4 * c + 2 * r + e];
          x = tc::Exp2(fmaf(x, sl2, -ms));
          sum += x;
        }
      l[r] = l[r] * alpha[r] + sum;
    }
    wg::Wait<0>();  // O += P(j-1) V(j-1) done: O and pa are free
    wg::FenceRegs(o);
#pragma unroll
    for (int c = 0; c < D / 8; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[4 * c + e] *= alpha[e >> 1];
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) pa[kk][e] = tc::PackBf16(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
    __syncthreads();  // every warpgroup is done with tile j-1: its stage takes tile j+2
    if (j + 2 < n_tiles) load_kv(j + 2);
  }
  if (n_tiles > 0) {
    const KTile v = sV((n_tiles - 1) % kStages);
    wg::Fence();
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) PvMma<D>(o, pa[kk], wg::MnMajorDesc(v, kk));
    wg::Commit();
    wg::Wait<0>();
    wg::FenceRegs(o);
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
    for (int c = 0; c < D / 8; ++c)
      *reinterpret_cast<uint32_t*>(orow + 8 * c) = tc::PackBf16(o[4 * c + 2 * r] * inv, o[4 * c + 2 * r + 1] * inv);
    if (t == 0) p.lse[(int64_t(start) + qi) * p.hq + h] = m[r] * p.scale + logf(sum);
  }
}

template <int D, bool kCausal>
absl::Status Launch(const FwdParams& p, const AttentionDims& d, int2* table, cudaStream_t s) {
  constexpr int kSmem = FwdSmemBytes<D>();
  auto kernel = FwdKernel<D, kCausal>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) != cudaSuccess)
    return LaunchStatus("flash_forward(smem attribute)");
  const int64_t tiles = TileCapacity(d, kBr);
  auto st = BuildTileTable(p.cu, d.batch, kBr, table, tiles, s);
  if (!st.ok()) return st;
  kernel<<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(d.q_heads)), kThreads, kSmem, s>>>(p);
  return LaunchStatus("flash_forward");
}
}  // namespace

absl::Status Forward(const void* q, const void* k, const void* v, const int32_t* cu, void* out, float* lse,
                     const AttentionDims& d, cudaStream_t s) {
  FwdParams p{static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
              static_cast<bf16*>(out), lse, cu, nullptr, static_cast<int>(d.q_heads), static_cast<int>(d.kv_heads),
              d.scale};
  int2* table = nullptr;
  if (cudaMallocAsync(&table, TileCapacity(d, kBr) * sizeof(int2), s) != cudaSuccess)
    return LaunchStatus("flash_forward(alloc)");
  p.table = table;
  auto launch = d.head_dim == 64 ? (d.causal ? Launch<64, true> : Launch<64, false>)
                                 : (d.causal ? Launch<128, true> : Launch<128, false>);
  absl::Status st = launch(p, d, table, s);
  cudaFreeAsync(table, s);
  return st;
}

}  // namespace tessera::kernels::flash
