// Paged decode attention, bf16 with head_dim 64/128 (FlashDecoding-style): one CTA per
// (sequence, kv head, split of the context). All query heads of the GQA group share one
// tensor-core tile — its 8 columns where the group has at most 8 heads, else its 16 rows
// (heads past the group are zero) — so every K/V byte is read once per kv head. Tokens
// stream through shared memory in tiles of 64 (cp.async, a ring of two or three stages —
// two where that lets more CTAs share a multiprocessor and the grid needs them, see Run —
// rows gathered through the block table, 16-byte chunks swizzled); each of the 4 warps
// owns 16 tokens of a tile and keeps its own online-softmax state (S^T = K Q^T and
// O^T += V^T P^T, or S = Q K^T and O += P V, with mma.sync), merged across warps at the
// end. With several splits the splits' (max, sum, O) are merged into out and lse: by the
// CTAs of a thread-block cluster that holds a (sequence, kv head)'s splits (up to 8),
// reading each other's shared memory, or, past 8 splits, by a second kernel.
// With the q/k pass fused in (PagedAttentionRopeCuda), q is the raw projection: each CTA
// normalizes and rotates its group's query heads into its Q tile itself (one warp per
// head, kernels/rope/rope_head.cuh), and the CTA whose split holds a sequence's new token
// (the context's last) rotates that token's key, writes key and value to the cache and
// puts them into its tile in shared memory over whatever the cache slot held when the
// tile was loaded — so no kernel before it has to write the cache, and its first tiles
// load before it waits for the kernel that wrote q (programmatic dependent launch). After
// that wait its threads also prefetch the ranges of PagedRopeArgs::warm into L2 (in 16 KB
// pieces spread over the grid), while the bus is otherwise idle.
#include <algorithm>

#include <cooperative_groups.h>

#include "absl/strings/str_cat.h"
#include "kernels/common/cuda_elem.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/common/phase_probe.cuh"
#include "kernels/common/scratch.cuh"
#include "kernels/common/tensor_core.cuh"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/paged_attention/paged_split.h"
#include "kernels/rope/rope_head.cuh"

PHASE_PROBE_TU(paged_split)

namespace tessera::kernels::paged {
namespace {
using bf16 = __nv_bfloat16;
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kWarps = 4, kThreads = 32 * kWarps, kTile = 16 * kWarps, kRows = 16;
// CTAs per multiprocessor the registers are held to, by head dim and stages of the K/V
// ring: head dim 64, three stages (51 KB): four (128 registers a thread); two stages
// (35 KB): five (96); head dim 128, three stages (101 KB): two (no register bound); two
// stages (70 KB): three (168).
template <int D, int S>
__host__ __device__ constexpr int MinCtas() { return D == 64 ? (S == 2 ? 5 : 4) : (S == 2 ? 3 : 2); }
constexpr int64_t kMaxCluster = 8;  // the portable cluster size

struct Params {
  const bf16 *q, *kc, *vc;
  const int32_t *tables, *lens;
  bf16* out;
  float* lse;
  float *part_o, *part_ml;  // [B, Hq, splits, D] and [B, Hq, splits, 2] when splits > 1
  int hq, hkv, block_size, max_blocks, splits, chunk;
  float scale;
  int cluster;  // the splits of a (sequence, kv head) are one thread-block cluster, merged in shared memory
  // The fused q/k pass: the new tokens' raw keys and values [B, Hkv, D], their RoPE
  // positions and cache slots [B], the q/k norms' weights (or null).
  const bf16 *k_new = nullptr, *v_new = nullptr, *q_norm = nullptr, *k_norm = nullptr;
  const int32_t *pos = nullptr, *slots = nullptr;
  float eps = 0.f;
  InvFreq inv = {};
  // Ranges to prefetch into L2 after the wait: their starts, and their ends counted in
  // 16 KB pieces over all the ranges before them.
  const char* warm[kMaxL2Warm] = {};
  int64_t warm_bytes[kMaxL2Warm] = {};
  int warm_end[kMaxL2Warm] = {};
};
constexpr int64_t kWarmPiece = 16 << 10;

// This thread's share of the warm ranges (piece i of all of them for i = its index in the
// grid, stepping by the grid's threads), prefetched into L2.
__device__ void WarmL2(const Params& p) {
  const int total = p.warm_end[kMaxL2Warm - 1];
  if (total == 0) return;
  const int64_t cta = (int64_t(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
  const int64_t step = int64_t(gridDim.x) * gridDim.y * gridDim.z * kThreads;
  int r = 0;
  for (int64_t i = cta * kThreads + threadIdx.x; i < total; i += step) {
    while (i >= p.warm_end[r]) ++r;
    const int64_t at = (i - (r == 0 ? 0 : p.warm_end[r - 1])) * kWarmPiece;
    PrefetchL2(p.warm[r] + at, unsigned(min(kWarmPiece, p.warm_bytes[r] - at)));
  }
}

template <int D, int S>
__host__ __device__ constexpr int SmemBytes() {
  // q tile, K and V tiles x stages (the merge reuses them), the new token's key and value
  return (kRows + 2 * S * kTile + 2) * D * 2;
}

// A lane's E consecutive bf16 elements (4 or 8 bytes, aligned: E = D / 32) as f32.
template <int E>
__device__ __forceinline__ void LoadLane(const bf16* src, float (&x)[E]) {
  static_assert(E == 2 || E == 4, "head dim 64 or 128");
  uint32_t w[E / 2];
  if constexpr (E == 2) {
    w[0] = *reinterpret_cast<const uint32_t*>(src);
  } else {
    const uint2 v = *reinterpret_cast<const uint2*>(src);
    w[0] = v.x, w[1] = v.y;
  }
#pragma unroll
  for (int j = 0; j < E / 2; ++j) {
    const __nv_bfloat162 h = *reinterpret_cast<const __nv_bfloat162*>(&w[j]);
    x[2 * j] = __low2float(h), x[2 * j + 1] = __high2float(h);
  }
}

// The fused q/k pass of one CTA (see the top): the group's query heads normalized, rotated
// and rounded into sQ (zero rows past the group); where this split holds the new token
// (context position `last`), its key likewise and its value into the cache and into
// new_kv (key then value, D each). g: the lane's q and k norm weights; ang: the lane's
// RoPE angles at the new token's position; slot: its cache slot — all formed before the wait.
template <int D>
__device__ void RopeInto(const Params& p, tc::SwizzledTile<D> sQ, bf16* new_kv, bool has_new, const float (&gq)[D / 32],
                         const float (&gk)[D / 32], const LaneAngles<D / 32>& ang, int32_t slot) {
  constexpr int E = D / 32, kPerWarp = kRows / kWarps;
  const int kvh = blockIdx.y, b = blockIdx.z, group = p.hq / p.hkv, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const bool norm = p.q_norm != nullptr, k_warp = has_new && warp == kWarps - 1;
  float xq[kPerWarp][E], xk[E];
  uint32_t vv[E / 2];
  const int64_t kv_at = (int64_t(b) * p.hkv + kvh) * D + lane * E;
#pragma unroll
  for (int i = 0; i < kPerWarp; ++i) {  // every load first, then the arithmetic
    const int r = warp + i * kWarps;
    if (r < group) LoadLane<E>(p.q + (int64_t(b) * p.hq + kvh * group + r) * D + lane * E, xq[i]);
  }
  if (k_warp) {
    LoadLane<E>(p.k_new + kv_at, xk);
#pragma unroll
    for (int j = 0; j < E / 2; ++j) vv[j] = reinterpret_cast<const uint32_t*>(p.v_new + kv_at)[j];
  }
#pragma unroll
  for (int i = 0; i < kPerWarp; ++i) {
    const int r = warp + i * kWarps;
    bf16 y[E];
    if (r < group) {
      NormRopeHead<bf16, E>(xq[i], gq, norm, p.eps, ang, y);
    } else {
#pragma unroll
      for (int j = 0; j < E; ++j) y[j] = __float2bfloat16_rn(0.f);
    }
#pragma unroll
    for (int j = 0; j < E; j += 2) *reinterpret_cast<__nv_bfloat162*>(sQ.At(r, lane * E + j)) = __halves2bfloat162(y[j], y[j + 1]);
  }
  if (!k_warp) return;
  bf16 y[E];
  NormRopeHead<bf16, E>(xk, gk, norm, p.eps, ang, y);
  const int64_t row = (int64_t(slot) * p.hkv + kvh) * D + lane * E;
  bf16* kc = const_cast<bf16*>(p.kc) + row;
  bf16* vc = const_cast<bf16*>(p.vc) + row;
#pragma unroll
  for (int j = 0; j < E; j += 2) {
    const __nv_bfloat162 k2 = __halves2bfloat162(y[j], y[j + 1]);
    *reinterpret_cast<__nv_bfloat162*>(kc + j) = k2;
    *reinterpret_cast<__nv_bfloat162*>(new_kv + lane * E + j) = k2;
    reinterpret_cast<uint32_t*>(vc)[j / 2] = vv[j / 2];
    reinterpret_cast<uint32_t*>(new_kv + D + lane * E)[j / 2] = vv[j / 2];
  }
}

// out = sum_s e^(m_s - M) O_s / sum_s e^(m_s - M) l_s: the merge of the splits over the
// cluster's shared memory (as Merge computes it, in split order), its outputs spread over
// every CTA of the cluster, each thread's reads of all splits issued together.
template <int D>
__device__ void ClusterMerge(const Params& p, float* co, float* cm, float* cl) {
#if TESSERA_SM90A
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every split's state is in its shared memory
  const int kvh = blockIdx.y, b = blockIdx.z, group = p.hq / p.hkv, splits = p.splits;
  for (int i = int(cluster.block_rank()) * kThreads + threadIdx.x; i < group * D; i += splits * kThreads) {
    const int row = i / D, c = i % D;
    float ms[kMaxCluster], ls[kMaxCluster], os[kMaxCluster];
#pragma unroll
    for (int s = 0; s < kMaxCluster; ++s)
      if (s < splits) {
        ms[s] = cluster.map_shared_rank(cm, s)[row];
        ls[s] = cluster.map_shared_rank(cl, s)[row];
        os[s] = cluster.map_shared_rank(co, s)[row * D + c];
      }
    float mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxCluster; ++s)
      if (s < splits) mx = fmaxf(mx, ms[s]);
    float sum = 0.f, acc = 0.f;
#pragma unroll
    for (int s = 0; s < kMaxCluster; ++s)
      if (s < splits && ms[s] != -INFINITY) {
        const float f = __expf(ms[s] - mx);
        sum += ls[s] * f;
        acc += os[s] * f;
      }
    const int64_t hrow = int64_t(b) * p.hq + kvh * group + row;
    p.out[hrow * D + c] = __float2bfloat16_rn(acc / sum);
    if (c == 0) p.lse[hrow] = mx + logf(sum);
  }
  cluster.sync();  // the others' shared memory stays until the merge has read it
#else
  __trap();  // clusters: Hopper only, launched where HopperPaths()
#endif
}

// kSwap (GQA groups of at most 8 heads): the tensor-core tiles hold the heads as their 8
// columns instead of 16 rows — S^T = K Q^T (16 tokens x 8 heads a warp) and O^T = V^T P^T
// (16 dims x 8 heads per tile), P^T turned into the B operand by movmatrix — so a group of
// 2 or 4 heads wastes 6 or 4 of 8 columns instead of 14 or 12 of 16 rows, with half the
// MMAs and half the O accumulators (D / 4 floats a lane instead of D / 2).
template <int D, bool kRope, int kStages, bool kSwap>
__global__ void __launch_bounds__(kThreads, MinCtas<D, kStages>()) SplitKernel(Params p) {
  constexpr int kChunks = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  PHASE_DECL
  PHASE(0);
  const tc::SwizzledTile<D> sQ{reinterpret_cast<bf16*>(smem)};
  auto sK = [&](int st) { return tc::SwizzledTile<D>{sQ.base + kRows * D + 2 * st * kTile * D}; };
  auto sV = [&](int st) { return tc::SwizzledTile<D>{sQ.base + kRows * D + (2 * st + 1) * kTile * D}; };
  // One cp.async group per tile slot (empty past the end), so "tile j landed" is always
  // "at most kStages - 1 newer groups pending".
  float gq[D / 32], gk[D / 32];  // the q/k norms' weights (the fused q/k pass): constants, before the wait
  if (kRope && p.q_norm != nullptr)
#pragma unroll
    for (int j = 0; j < D / 32; ++j)
      gq[j] = __bfloat162float(p.q_norm[threadIdx.x % 32 * (D / 32) + j]), gk[j] = __bfloat162float(p.k_norm[threadIdx.x % 32 * (D / 32) + j]);
  // A programmatic dependent of the kernel that wrote q (and, without the q/k pass, the
  // cache). With the q/k pass nothing before this kernel writes the cache rows it reads —
  // the new token's row is put into the tile from its own key and value — and the tables,
  // lengths, positions and slots come from the step's upload, so the first tiles load
  // before the wait.
  if (!kRope) GridDependencyWait(), GridDependentsLaunch();
  const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z, group = p.hq / p.hkv;
  const int32_t pos = kRope ? p.pos[b] : 0, slot = kRope ? p.slots[b] : 0;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4, mi = lane / 8, mr = lane % 8;
  const int len = p.lens[b], c0 = split * p.chunk, c1 = min(len, c0 + p.chunk);
  const int n_tiles = c1 > c0 ? (c1 - c0 + kTile - 1) / kTile : 0;
  const int64_t kv_row = int64_t(p.hkv) * D;  // elements between consecutive slots of a block
  const int32_t* table = p.tables + int64_t(b) * p.max_blocks;

  // Q rows: the group's heads, zero past the group.
  if (!kRope)
    for (int i = tid; i < kRows * kChunks; i += kThreads) {
      const int r = i / kChunks, c = i % kChunks;
      const bool ok = r < group;
      tc::CpAsync16(sQ.Chunk(r, c), p.q + (int64_t(b) * p.hq + kvh * group + (ok ? r : 0)) * D + c * 8, ok);
    }
  auto load = [&](int j) {
    if (j >= n_tiles) return tc::CpAsyncCommit();
    const int st = j % kStages, tok0 = c0 + j * kTile;
#pragma unroll
    for (int it = 0; it < kTile * kChunks / kThreads; ++it) {
      const int i = it * kThreads + tid, r = i / kChunks, c = i % kChunks, tok = tok0 + r;
      const bool ok = tok < c1;
      const int64_t slot = ok ? int64_t(table[tok / p.block_size]) * p.block_size + tok % p.block_size : 0;
      const int64_t off = slot * kv_row + kvh * D + c * 8;
      tc::CpAsync16(sK(st).Chunk(r, c), p.kc + off, ok);
      tc::CpAsync16(sV(st).Chunk(r, c), p.vc + off, ok);
    }
    tc::CpAsyncCommit();
  };
  for (int j = 0; j < kStages - 1; ++j) load(j);
  // The new token's RoPE angles (its position is the step's upload), while the tiles load
  // and before the wait: the same for all the CTA's heads and the key.
  LaneAngles<D / 32> ang;
  if (kRope) ang = RopeLaneAngles<D / 32>(pos, p.inv);
  PHASE(1);
  if (kRope) GridDependencyWait(), GridDependentsLaunch(), WarmL2(p);
  PHASE(2);
  // The fused q/k pass, while the first tiles load; the new token's tile and row.
  bf16* new_kv = sQ.base + (kRows + 2 * kStages * kTile) * D;
  const int last = len - 1, new_tile = kRope && last >= c0 && last < c1 ? (last - c0) / kTile : -1;
  if (kRope) RopeInto<D>(p, sQ, new_kv, new_tile >= 0, gq, gk, ang, slot);
  PHASE(3);

  const float sl2 = p.scale * kLog2e;
  // o: O (rows g, g + 8 = heads; columns 8 dt + 2 t, + 1 = dims), or with kSwap O^T (tile dp:
  // rows 16 dp + g, + 8 = dims; columns 2 t, 2 t + 1 = heads). m, l: the online softmax of
  // rows g, g + 8, or with kSwap of heads 2 t, 2 t + 1 (l a partial sum over this lane's
  // tokens until the end).
  float o[kSwap ? D / 16 : D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  uint32_t qf[D / 16][kSwap ? 2 : 4];  // Q as the A operand, or Q^T as the B operand (kSwap)
  for (int j = 0; j < n_tiles; ++j) {
    const int st = j % kStages;
    load(j + kStages - 1);  // into the stage read in iteration j - 1 (free since its last barrier)
    tc::CpAsyncWait<kStages - 1>();
    __syncthreads();
    if (j == new_tile) {  // the new token's key and value over what its cache slot held at the load
      const int r = (last - c0) % kTile;
      if (tid < 2 * kChunks) {
        const uint4 v = reinterpret_cast<const uint4*>(new_kv)[tid];
        *reinterpret_cast<uint4*>(tid < kChunks ? sK(st).Chunk(r, tid) : sV(st).Chunk(r, tid - kChunks)) = v;
      }
      __syncthreads();
    }
    if constexpr (kSwap) {
      if (j == 0) {  // B[k][n] = Q[head n][dim k]: heads 0-7 as an 8-row matrix, two k-steps a load
#pragma unroll
        for (int kk = 0; kk < D / 16; kk += 2) {
          uint32_t r[4];
          tc::Ldmatrix4(r, sQ.Chunk(mr, kk * 2 + mi));
          qf[kk][0] = r[0], qf[kk][1] = r[1], qf[kk + 1][0] = r[2], qf[kk + 1][1] = r[3];
        }
      }
      // S^T (this warp's 16 tokens x 8 heads): lane's s[e] token g (e < 2) or g + 8, head 2 t + e % 2.
      float s[4] = {};
      const int key0 = warp * 16;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t kf[4];  // A[m][k] = K[token m][dim k]
        tc::Ldmatrix4(kf, sK(st).Chunk(key0 + (mi & 1) * 8 + mr, kk * 2 + (mi >> 1)));
        tc::Mma(s, kf, qf[kk][0], qf[kk][1]);
      }
      const int tok0 = c0 + j * kTile + key0;
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (tok0 + g + (e >= 2 ? 8 : 0) >= c1) s[e] = -INFINITY;
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // head 2 t + h: its 16 tokens are this lane's 2 and the 7 other g's
        float mx = fmaxf(m[h], fmaxf(s[h], s[2 + h]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
        const float ms = mx == -INFINITY ? 0.f : mx * sl2;
        const float alpha = tc::Exp2(m[h] * sl2 - ms);
        m[h] = mx;
        s[h] = tc::Exp2(fmaf(s[h], sl2, -ms));
        s[2 + h] = tc::Exp2(fmaf(s[2 + h], sl2, -ms));
        l[h] = l[h] * alpha + s[h] + s[2 + h];
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) o[dp][h] *= alpha, o[dp][2 + h] *= alpha;
      }
      // P^T (tokens x heads) as the B operand (B[k = token][n = head]: lane holds tokens
      // 2 t, 2 t + 1 (and + 8) of head g): each 8x8 block of the accumulator transposed.
      const uint32_t b0 = tc::Transpose8x8(tc::PackBf16(s[0], s[1])), b1 = tc::Transpose8x8(tc::PackBf16(s[2], s[3]));
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vf[4];  // A[m][k] = V[token k][dim m], from V's rows transposed
        tc::Ldmatrix4T(vf, sV(st).Chunk(key0 + (mi >> 1) * 8 + mr, dp * 2 + (mi & 1)));
        tc::Mma(o[dp], vf, b0, b1);
      }
    } else {
      if (j == 0) {
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) tc::Ldmatrix4(qf[kk], sQ.Chunk((mi & 1) * 8 + mr, kk * 2 + (mi >> 1)));
      }
      // S (16 heads x this warp's 16 tokens).
      float s[2][4] = {};
      const int key0 = warp * 16;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t kf[4];
        tc::Ldmatrix4(kf, sK(st).Chunk(key0 + (mi >> 1) * 8 + mr, kk * 2 + (mi & 1)));
        tc::Mma(s[0], qf[kk], kf[0], kf[1]);
        tc::Mma(s[1], qf[kk], kf[2], kf[3]);
      }
      const int tok0 = c0 + j * kTile + key0;
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (tok0 + nt * 8 + 2 * t + (e & 1) >= c1) s[nt][e] = -INFINITY;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float mx = tc::QuadMax(fmaxf(fmaxf(m[r], fmaxf(s[0][2 * r], s[0][2 * r + 1])), fmaxf(s[1][2 * r], s[1][2 * r + 1])));
        const float ms = mx == -INFINITY ? 0.f : mx * sl2;
        const float alpha = tc::Exp2(m[r] * sl2 - ms);
        m[r] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 2 * r; e < 2 * r + 2; ++e) {
            s[nt][e] = tc::Exp2(fmaf(s[nt][e], sl2, -ms));
            sum += s[nt][e];
          }
        l[r] = l[r] * alpha + sum;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) o[dt][2 * r] *= alpha, o[dt][2 * r + 1] *= alpha;
      }
      const uint32_t a[4] = {tc::PackBf16(s[0][0], s[0][1]), tc::PackBf16(s[0][2], s[0][3]), tc::PackBf16(s[1][0], s[1][1]),
                             tc::PackBf16(s[1][2], s[1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t vf[4];
        tc::Ldmatrix4T(vf, sV(st).Chunk(key0 + (mi & 1) * 8 + mr, dp * 2 + (mi >> 1)));
        tc::Mma(o[2 * dp], a, vf[0], vf[1]);
        tc::Mma(o[2 * dp + 1], a, vf[2], vf[3]);
      }
    }
    __syncthreads();  // stage st is reloaded next iteration
  }
  PHASE(4);
  // Merge the 4 warps' states (rows g, g + 8 = heads) through shared memory, which the
  // tiles no longer use (nothing may still be in flight when no tile was loaded).
  tc::CpAsyncWait<0>();
  __syncthreads();
  // O's rows padded to D + 8 floats: the 8 rows g of a warp's float2 stores fall on distinct
  // banks (a row of D floats puts them all on the same ones).
  constexpr int kOStride = D + 8;
  static_assert((2 * kWarps * kRows + kWarps * kRows * kOStride + kRows * D + 2 * kRows) * 4 <= SmemBytes<D, kStages>(),
                "the merge's scratch fits in the tiles' shared memory");
  float* sm = reinterpret_cast<float*>(smem);  // [warps][16] max, [warps][16] sum, [warps][16][kOStride] O
  float* sl = sm + kWarps * kRows;
  float* so = sl + kWarps * kRows;
  float* co = so + kWarps * kRows * kOStride;  // in a cluster: this CTA's [16][D] O, [16] max, [16] sum
  float* cm = co + kRows * D;
  float* cl = cm + kRows;
  if constexpr (kSwap) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float lsum = l[h];
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 4);
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 8);
      lsum += __shfl_xor_sync(0xffffffffu, lsum, 16);
      const int row = 2 * t + h;
      if (g == 0) sm[warp * kRows + row] = m[h], sl[warp * kRows + row] = lsum;
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        so[(warp * kRows + row) * kOStride + dp * 16 + g] = o[dp][h];
        so[(warp * kRows + row) * kOStride + dp * 16 + g + 8] = o[dp][2 + h];
      }
    }
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float lsum = tc::QuadSum(l[r]);
      const int row = g + 8 * r;
      if (t == 0) sm[warp * kRows + row] = m[r], sl[warp * kRows + row] = lsum;
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt)
        *reinterpret_cast<float2*>(so + (warp * kRows + row) * kOStride + dt * 8 + 2 * t) = make_float2(o[dt][2 * r], o[dt][2 * r + 1]);
    }
  }
  __syncthreads();
  for (int i = tid; i < group * D; i += kThreads) {
    const int row = i / D, c = i % D;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm[w * kRows + row]);
    const float ms = mx == -INFINITY ? 0.f : mx * sl2;
    float sum = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float f = tc::Exp2(sm[w * kRows + row] * sl2 - ms);
      sum += sl[w * kRows + row] * f;
      acc += so[(w * kRows + row) * kOStride + c] * f;
    }
    const int64_t hrow = int64_t(b) * p.hq + kvh * group + row;
    if (p.splits == 1) {
      p.out[hrow * D + c] = __float2bfloat16_rn(acc / sum);
      if (c == 0) p.lse[hrow] = mx * p.scale + logf(sum);
    } else if (p.cluster) {  // the same, for the cluster's merge
      co[row * D + c] = acc;
      if (c == 0) cm[row] = mx == -INFINITY ? -INFINITY : mx * p.scale, cl[row] = sum;
    } else {  // unnormalized O with its max (natural-log units) and sum
      p.part_o[(hrow * p.splits + split) * D + c] = acc;
      if (c == 0) {
        p.part_ml[(hrow * p.splits + split) * 2] = mx == -INFINITY ? -INFINITY : mx * p.scale;
        p.part_ml[(hrow * p.splits + split) * 2 + 1] = sum;
      }
    }
  }
  PHASE(5);
  if (p.cluster) ClusterMerge<D>(p, co, cm, cl);
  PHASE_END(100 + D);
}

// out = sum_s e^(m_s - M) O_s / sum_s e^(m_s - M) l_s; one warp per (sequence, head).
__global__ void Merge(const float* part_o, const float* part_ml, int64_t rows, int splits, int dim, bf16* out, float* lse) {
  GridDependencyWait();
  GridDependentsLaunch();
  const int64_t row = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  float mx = -INFINITY;
  for (int s = 0; s < splits; ++s) mx = fmaxf(mx, part_ml[(row * splits + s) * 2]);
  float sum = 0.f;
  for (int s = 0; s < splits; ++s) {
    const float ms = part_ml[(row * splits + s) * 2];
    if (ms != -INFINITY) sum += part_ml[(row * splits + s) * 2 + 1] * __expf(ms - mx);
  }
  for (int c = lane; c < dim; c += 32) {
    float acc = 0.f;
    for (int s = 0; s < splits; ++s) {
      const float ms = part_ml[(row * splits + s) * 2];
      if (ms != -INFINITY) acc += part_o[(row * splits + s) * dim + c] * __expf(ms - mx);
    }
    out[row * dim + c] = __float2bfloat16_rn(acc / sum);
  }
  if (lane == 0) lse[row] = mx + logf(sum);
}

// The launch of a (head dim, q/k pass, stages, tile layout) instance over p as Run set it up.
template <int D, bool kRope, int S, bool kSwap>
absl::Status Go(Params& p, const PagedDims& d, cudaStream_t s, DeviceScratch* scratch);

template <int D, bool kRope>
absl::Status Run(const Params& base, const PagedDims& d, int sms, cudaStream_t s, DeviceScratch* scratch) {
  Params p = base;
  const int64_t max_ctx = d.max_blocks * d.block_size;
  // Split the context only until there are two CTAs per multiprocessor, in chunks of at
  // least 256 tokens: each split costs a pipeline fill and the merge (H200, 64 x 4096
  // tokens: 1 split 0.296 ms, 4 splits 0.321 ms, 8 splits 0.341 ms). Where that leaves
  // at most 8 splits and the grid is small (few sequences: a latency-bound step), the
  // context is split finer — down to one tile of tokens per CTA — and each (sequence, kv
  // head)'s splits run as one thread-block cluster that merges in shared memory, with no
  // second kernel.
  const int64_t ctas = d.batch * d.kv_heads;
  int splits = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((2 * sms + ctas - 1) / ctas, (max_ctx + 255) / 256)));
  const int fine = static_cast<int>(std::min<int64_t>({kMaxCluster, (2 * sms + ctas - 1) / ctas, (max_ctx + kTile - 1) / kTile}));
  p.cluster = HopperPaths() && splits <= kMaxCluster && fine >= 2 ? 1 : 0;
  if (p.cluster) splits = fine;
  p.chunk = static_cast<int>((max_ctx + splits - 1) / splits);
  p.chunk = (p.chunk + kTile - 1) / kTile * kTile;
  splits = static_cast<int>((max_ctx + p.chunk - 1) / p.chunk);
  if (splits < 2) p.cluster = 0;
  p.splits = splits;
  // Three stages keep more of a CTA's tiles in flight, two let more CTAs share a
  // multiprocessor. H200, decode steps at contexts of 128-256, heads as the tiles' columns:
  // head dim 64 (the ~1B Llama shape) with two stages and five CTAs against three and four:
  // 0.811 / 1.383 / 2.34 ms a step at batch 1 / 64 / 256 against 0.827 / 1.394 / 2.372; head
  // dim 128 (Qwen3-1.7B): 512 CTAs (batch 64, two waves either way) 2.563 ms with three
  // stages, 2.637 with two; 2048 CTAs (batch 256: 7.8 waves against 5.2) 4.85 against 4.60.
  // So head dim 64 takes two stages where the heads are the columns (the other layout,
  // at 96 registers, spills), head dim 128 two where the grid is more than 4 waves deep at
  // two CTAs per multiprocessor.
  const bool swap = d.q_heads / d.kv_heads <= 8;
  if constexpr (D == 64) {
    return swap ? Go<D, kRope, 2, true>(p, d, s, scratch) : Go<D, kRope, 3, false>(p, d, s, scratch);
  } else {
    const bool two = int64_t(splits) * ctas > 8 * int64_t(sms);
    if (swap) return two ? Go<D, kRope, 2, true>(p, d, s, scratch) : Go<D, kRope, 3, true>(p, d, s, scratch);
    return two ? Go<D, kRope, 2, false>(p, d, s, scratch) : Go<D, kRope, 3, false>(p, d, s, scratch);
  }
}

template <int D, bool kRope, int S, bool kSwap>
absl::Status Go(Params& p, const PagedDims& d, cudaStream_t s, DeviceScratch* scratch) {
  const int splits = p.splits;
  constexpr int kSmem = SmemBytes<D, S>();
  if (cudaFuncSetAttribute(SplitKernel<D, kRope, S, kSwap>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) != cudaSuccess)
    return LaunchStatus("paged_attention(smem attribute)");
  const int64_t rows = d.batch * d.q_heads;
  const bool merged_apart = splits > 1 && !p.cluster;
  ScratchBlock part(scratch, merged_apart ? size_t(rows * splits * (D + 2)) * sizeof(float) : 0, s);
  if (merged_apart) {
    if (part.get() == nullptr) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat("paged attention: no device memory for ", rows * splits, " split partials"));
    }
    p.part_o = static_cast<float*>(part.get());
    p.part_ml = p.part_o + rows * splits * D;
  }
  auto launch = [&]() -> absl::Status {
    const dim3 grid(splits, static_cast<unsigned>(d.kv_heads), static_cast<unsigned>(d.batch));
    if (p.cluster)
      return Launched(LaunchDependentCluster(SplitKernel<D, kRope, S, kSwap>, grid, dim3(kThreads), kSmem, s, dim3(splits, 1, 1), p),
                      "paged_attention(split, cluster)");
    if (auto st = Launched(LaunchDependent(SplitKernel<D, kRope, S, kSwap>, grid, dim3(kThreads), kSmem, s, p), "paged_attention(split)");
        !st.ok() || splits == 1)
      return st;
    return Launched(LaunchDependent(Merge, dim3(static_cast<unsigned>((rows * 32 + 255) / 256)), dim3(256), 0, s, p.part_o,
                                    p.part_ml, rows, splits, D, p.out, p.lse),
                    "paged_attention(merge)");
  };
  return launch();
}
}  // namespace

// Where the GPU lets a block have the shared memory (head dim 128 wants 101 KB: more than
// Ada's and Ampere's consumer parts allow).
bool Supported(const PagedDims& d, DType t) {
  if (t != DType::kBF16 || (d.head_dim != 64 && d.head_dim != 128) || d.q_heads / d.kv_heads > kRows) return false;
  return (d.head_dim == 64 ? SmemBytes<64, 3>() : SmemBytes<128, 3>()) <= OptinSharedMemory();
}

namespace {
Params BaseParams(const void* q, const void* kc, const void* vc, const int32_t* tables, const int32_t* lens, void* out,
                  float* lse, const PagedDims& d) {
  Params p;
  p.q = static_cast<const bf16*>(q), p.kc = static_cast<const bf16*>(kc), p.vc = static_cast<const bf16*>(vc);
  p.tables = tables, p.lens = lens, p.out = static_cast<bf16*>(out), p.lse = lse, p.part_o = p.part_ml = nullptr;
  p.hq = int(d.q_heads), p.hkv = int(d.kv_heads), p.block_size = int(d.block_size), p.max_blocks = int(d.max_blocks);
  p.splits = 1, p.chunk = 0, p.scale = d.scale, p.cluster = 0;
  return p;
}
}  // namespace

absl::Status Decode(const void* q, const void* kc, const void* vc, const int32_t* tables, const int32_t* lens, void* out,
                    float* lse, const PagedDims& d, cudaStream_t s, DeviceScratch* scratch) {
  const int sms = SmCount();
  const Params p = BaseParams(q, kc, vc, tables, lens, out, lse, d);
  return d.head_dim == 64 ? Run<64, false>(p, d, sms, s, scratch) : Run<128, false>(p, d, sms, s, scratch);
}

absl::Status DecodeRope(const void* q, const PagedRopeArgs& r, void* kc, void* vc, const int32_t* tables, const int32_t* lens,
                        void* out, float* lse, const PagedDims& d, cudaStream_t s, DeviceScratch* scratch) {
  const int sms = SmCount();
  Params p = BaseParams(q, kc, vc, tables, lens, out, lse, d);
  p.k_new = static_cast<const bf16*>(r.k_new), p.v_new = static_cast<const bf16*>(r.v_new);
  p.q_norm = static_cast<const bf16*>(r.q_norm), p.k_norm = static_cast<const bf16*>(r.k_norm);
  p.pos = r.pos, p.slots = r.slots, p.eps = r.eps;
  for (int64_t i = 0; i < d.head_dim / 2; ++i) p.inv.v[i] = r.inv_freq[i];
  p.inv.scale = r.scale;
  for (int i = 0, end = 0; i < kMaxL2Warm; ++i) {
    const int64_t bytes = r.warm[i].p != nullptr ? std::max<int64_t>(0, r.warm[i].bytes) / 16 * 16 : 0;
    p.warm[i] = static_cast<const char*>(r.warm[i].p), p.warm_bytes[i] = bytes;
    p.warm_end[i] = end += int((bytes + kWarmPiece - 1) / kWarmPiece);
  }
  return d.head_dim == 64 ? Run<64, true>(p, d, sms, s, scratch) : Run<128, true>(p, d, sms, s, scratch);
}

}  // namespace tessera::kernels::paged
