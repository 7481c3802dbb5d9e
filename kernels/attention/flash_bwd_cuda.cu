// Flash-attention backward for sm_90a (FlashAttention-2's algorithm in FlashAttention-3's
// structure). One CTA = 3 warpgroups for a tile of 128 keys of one kv head: warpgroup 0
// is the producer (one thread loads K and V once, then Q and dO tiles of kBr queries —
// 128 at d64, 64 at d128 — with TMA, two stages deep, for every query head of the GQA
// group and every query tile that sees these keys); two consumer warpgroups own 64 keys each and keep their dK and dV
// accumulators in registers across the whole loop (so GQA needs no extra reduction).
// Per query tile, each consumer warpgroup runs on the tensor cores (wgmma):
//   S^T  = K Q^T                  dP^T = V dO^T           (shared x shared, K-major)
//   P^T  = exp2(S^T scale log2e - lse log2e), dS^T = P^T (dP^T - D)   (registers, masked)
//   dV  += P^T dO                 dK  += dS^T Q           (registers x shared, N-major)
//   dQ (half)   = dS K            (dS^T staged in shared memory, M-major), reduced into
//                                 global f32 with one bulk reduce-add per query tile
// D = rowsum(dO O) and lse log2e are prepared by a small kernel per (head, kBr-query
// slot), padded with (0, +inf) past the sequence so padded queries get P = 0; the
// producer copies each tile's 2 x 4 kBr bytes into the stage with the Q and dO tiles (the
// consumers never wait on a global load). dq_acc is scaled and cast at the end. A stage goes back to the producer through an
// "empty" mbarrier once every consumer thread's reads of it have completed.
#include <cuda.h>
#include <cudaTypedefs.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/attention/flash_cuda.h"
#include "kernels/common/cuda_elem.cuh"
#include "kernels/common/wgmma.cuh"

// Outside the 90a pass the kernels' bodies are traps: their helpers go unused there.
#if !TESSERA_SM90A
#pragma nv_diag_suppress 177
#endif

namespace tessera::kernels::flash {
namespace {
using bf16 = __nv_bfloat16;
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kConsumers = 2, kThreads = 128 * (kConsumers + 1), kBc = 64 * kConsumers;
// Queries per tile: 128 at d64 (FA3's choice: twice the tensor-core work per barrier,
// stage hand-off and bulk reduction, which d64's short k-loops cannot otherwise amortize),
// 64 at d128 (where registers and shared memory are full at 64).
template <int D>
constexpr int kBrOf = D == 64 ? 128 : 64;

struct BwdParams {
  const float *lse2, *dvec;  // [Hq][q slots][kBr]: lse * log2(e) and rowsum(dO * O), padded
  float* dq_acc;             // [Hq][q slots][kBr x D] in fragment order (see ReduceDq), unscaled dS K
  const int32_t* q_first;    // first kBr-query slot of each sequence
  int64_t q_slots;           // slots per head
  bf16 *dk, *dv;
  const int32_t* cu;
  const int2* table;
  int hq, hkv;
  int tiles;  // entries of the key-tile table
  int64_t tokens;
  float scale;
};

template <int D>
struct BwdSmem {
  static constexpr int kBr = kBrOf<D>;
  using KTile = wg::Sw128Tile<kBc, D>;    // K, V
  using QTile = wg::Sw128Tile<kBr, D>;    // Q, dO (per stage)
  using STile = wg::Sw128Tile<kBc, kBr>;  // dS^T [keys][queries] (double-buffered)
  static constexpr int kDqBytes = kBr * D * 4;  // one dQ slot, f32
  // dQ staging buffers: two at d128, where the next tile's staging must not wait for the
  // last bulk reduction's reads; one at d64 (its 128-query dS^T tiles fill the space) —
  // there the issuing thread waits for the previous reduction's reads first.
  static constexpr int kDqBuffers = D == 64 ? 1 : 2;
  static constexpr int kRowBytes = kBr * 4;     // lse2 or dvec of one tile (per stage)
  // Q/dO stages in flight. d128 has room for two only; three at d64 measured no faster
  // (H200: 0.98-1.01x).
  static constexpr int kStages = 2;
  static constexpr int kTiles =
      2 * KTile::kBytes + 2 * kStages * QTile::kBytes + 2 * STile::kBytes + kDqBuffers * kDqBytes + 2 * kStages * kRowBytes;
  static constexpr int kBarriers = 1 + 2 * kStages;  // kv_full, q_full[], q_empty[]
  static constexpr int kBytes = kTiles + kBarriers * 8 + 1024;
  static_assert(kBytes <= 227 * 1024, "backward tiles exceed the shared memory of an SM");
};

template <int D>
__device__ __forceinline__ void RsMma(float (&acc)[D / 2], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (D == 128) wg::WgmmaRS_m64n128<1>(acc, a, desc);
  else wg::WgmmaRS_m64n64<1>(acc, a, desc);
}
// S^T or dP^T (64 keys x kBr queries) over one k-step of 16 head dims.
template <int kBr>
__device__ __forceinline__ void SdpMma(float (&acc)[kBr / 2], uint64_t a, uint64_t b, int accumulate) {
  if constexpr (kBr == 128) wg::WgmmaSS_m64n128(acc, a, b, accumulate);
  else wg::WgmmaSS_m64n64(acc, a, b, accumulate);
}
__device__ __forceinline__ void ConsumerBarrier() { asm volatile("bar.sync 1, %0;\n" ::"n"(128 * kConsumers) : "memory"); }

// The CTA's shared memory: K and V, the Q/dO stages, dS^T (double-buffered), the dQ
// staging slots, each stage's lse2/dvec rows, the mbarriers.
template <int D>
struct BwdShared {
  using S = BwdSmem<D>;
  using KTile = typename S::KTile;
  using QTile = typename S::QTile;
  using STile = typename S::STile;
  static constexpr int kStages = S::kStages, kBr = S::kBr;
  char* base;  // 1024-byte aligned (128B swizzle)

  __device__ static BwdShared Make(unsigned char* raw) {
    return {reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023))};
  }
  __device__ KTile k() const { return KTile{reinterpret_cast<bf16*>(base)}; }
  __device__ KTile v() const { return KTile{reinterpret_cast<bf16*>(base + KTile::kBytes)}; }
  __device__ char* qbase() const { return base + 2 * KTile::kBytes; }
  __device__ QTile q(int st) const { return QTile{reinterpret_cast<bf16*>(qbase() + 2 * st * QTile::kBytes)}; }
  __device__ QTile dout(int st) const { return QTile{reinterpret_cast<bf16*>(qbase() + (2 * st + 1) * QTile::kBytes)}; }
  __device__ char* sbase() const { return qbase() + 2 * kStages * QTile::kBytes; }
  __device__ STile ds(int b) const { return STile{reinterpret_cast<bf16*>(sbase() + b * STile::kBytes)}; }
  __device__ float* dq() const { return reinterpret_cast<float*>(sbase() + 2 * STile::kBytes); }  // [buffers][kBr * D]
  __device__ float* rows(int st) const { return dq() + S::kDqBuffers * kBr * D + st * 2 * kBr; }  // lse2, dvec [kBr]
  __device__ uint64_t* kv_full() const { return reinterpret_cast<uint64_t*>(base + S::kTiles); }
  __device__ uint64_t* q_full(int st) const { return kv_full() + 1 + st; }
  __device__ uint64_t* q_empty(int st) const { return kv_full() + 1 + kStages + st; }

  __device__ void InitBarriers() const {
    tma::BarInit(kv_full(), 1);
    for (int i = 0; i < kStages; ++i) {
      tma::BarInit(q_full(i), 1);
      // Every consumer thread releases the stage after its own reads of the stage's
      // lse2/dvec (one arrive per warp after __syncwarp is enough by the memory model,
      // but not to compute-sanitizer's racecheck, which then reports the next bulk copy).
      tma::BarInit(q_empty(i), 128 * kConsumers);
    }
    tma::FenceBarrierInit();
  }
};

// What one CTA works on: 128 keys of one kv head, against the query tiles that see them
// for every query head of the group (iteration it = head (it / m_tiles), tile
// m_first + it % m_tiles).
struct BwdWork {
  int kvh, group, start, len, n0, m_first, m_tiles, iters, q_first;
};

// The producer (one thread): K and V once, then Q, dO and the rows' lse2/dvec per iteration.
template <int D>
__device__ __forceinline__ void ProduceBwd(const BwdShared<D>& sm, const CUtensorMap* tq, const CUtensorMap* tk,
                                           const CUtensorMap* tv, const CUtensorMap* tdo, const BwdParams& p,
                                           const BwdWork& w) {
  using KTile = typename BwdShared<D>::KTile;
  using QTile = typename BwdShared<D>::QTile;
  constexpr int kStages = BwdShared<D>::kStages, kRowBytes = BwdSmem<D>::kRowBytes, kBr = kBrOf<D>;
  tma::ArriveExpectTx(sm.kv_full(), 2 * KTile::kBytes);
  for (int b = 0; b < D / 64; ++b) {
    tma::Load3d(reinterpret_cast<char*>(sm.k().base) + b * KTile::kBlockBytes, tk, sm.kv_full(), 64 * b, w.kvh, w.start + w.n0);
    tma::Load3d(reinterpret_cast<char*>(sm.v().base) + b * KTile::kBlockBytes, tv, sm.kv_full(), 64 * b, w.kvh, w.start + w.n0);
  }
  for (int it = 0; it < w.iters; ++it) {
    const int st = it % kStages, h = w.kvh * w.group + it / w.m_tiles, mt = w.m_first + it % w.m_tiles;
    const int row = w.start + mt * kBr;
    if (it >= kStages) tma::Wait(sm.q_empty(st), ((it / kStages) & 1) ^ 1);
    tma::ArriveExpectTx(sm.q_full(st), 2 * QTile::kBytes + 2 * kRowBytes);
    const int64_t slot = (int64_t(h) * p.q_slots + w.q_first + mt) * kBr;
    tma::BulkLoad(sm.rows(st), p.lse2 + slot, kRowBytes, sm.q_full(st));
    tma::BulkLoad(sm.rows(st) + kBr, p.dvec + slot, kRowBytes, sm.q_full(st));
    for (int b = 0; b < D / 64; ++b) {
      tma::Load3d(reinterpret_cast<char*>(sm.q(st).base) + b * QTile::kBlockBytes, tq, sm.q_full(st), 64 * b, h, row);
      tma::Load3d(reinterpret_cast<char*>(sm.dout(st).base) + b * QTile::kBlockBytes, tdo, sm.q_full(st), 64 * b, h, row);
    }
  }
}

// P^T = exp2(S^T scale log2e - lse log2e) (masked to 0 past the sequence and, causal,
// above the diagonal) and dS^T = P^T (dP^T - D), packed to bf16 A fragments (ap, ads)
// as soon as each is complete, once S^T (the older of the two wgmma groups in flight) and
// then dP^T have landed. This thread holds
// keys key0 + g (+8) and queries 8 c + 2 t + e of the kBr-query tile at m0; rows holds
// the tile's lse2[kBr] then D[kBr]. At kBr = 64 they are read into registers before the
// wait (they hide under it); at 128 that would cost 64 registers at the kernel's peak,
// so they are read where used.
template <int kBr, bool kCausal>
__device__ __forceinline__ void ScoresToGrads(float (&s)[kBr / 2], float (&dp)[kBr / 2], uint32_t (&ap)[kBr / 16][4],
                                              uint32_t (&ads)[kBr / 16][4], const float* rows, float sl2, bool mask,
                                              int n0, int key0, int m0, int len, int g, int t) {
  constexpr bool kPreload = kBr == 64;
  float2 lv[kPreload ? kBr / 8 : 1], dvv[kPreload ? kBr / 8 : 1];
  if constexpr (kPreload) {
#pragma unroll
    for (int c = 0; c < kBr / 8; ++c) {
      lv[c] = tc::LdShared2(rows + 8 * c + 2 * t);
      dvv[c] = tc::LdShared2(rows + kBr + 8 * c + 2 * t);
    }
  }
  // The (lse2, D) pairs of this thread's query columns 8 c + 2 t (+1).
  auto lse2_at = [&](int c) {
    if constexpr (kPreload) return lv[c];
    else return tc::LdShared2(rows + 8 * c + 2 * t);
  };
  auto d_at = [&](int c) {
    if constexpr (kPreload) return dvv[c];
    else return tc::LdShared2(rows + kBr + 8 * c + 2 * t);
  };
  wg::Wait<1>();
  wg::FenceRegs(s);
#pragma unroll
  for (int c = 0; c < kBr / 8; ++c) {
    const float2 l2 = lse2_at(c);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 4 * c + e, col = 8 * c + 2 * t + (e & 1), kj = n0 + key0 + g + 8 * (e >> 1);
      float pv = tc::Exp2(fmaf(s[i], sl2, -((e & 1) ? l2.y : l2.x)));
      if (mask && (kj >= len || (kCausal && kj > m0 + col))) pv = 0.f;
      s[i] = pv;
    }
  }
  wg::Wait<0>();
  wg::FenceRegs(dp);
#pragma unroll
  for (int c = 0; c < kBr / 8; ++c) {
    const float2 d2 = d_at(c);
#pragma unroll
    for (int e = 0; e < 4; ++e) dp[4 * c + e] = s[4 * c + e] * (dp[4 * c + e] - ((e & 1) ? d2.y : d2.x));
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // columns 8 c .. 8 c + 7 are half of k-step c / 2's A fragment
      ap[c / 2][2 * (c & 1) + r] = tc::PackBf16(s[4 * c + 2 * r], s[4 * c + 2 * r + 1]);
      ads[c / 2][2 * (c & 1) + r] = tc::PackBf16(dp[4 * c + 2 * r], dp[4 * c + 2 * r + 1]);
    }
  }
}

// dQ goes to global memory as bulk reduce-adds, one per warpgroup (its half of the
// kBr x D slot: D/2 columns at d128, 64 queries at d64 — 32 floats per thread either way).
// Fragments are stored in fragment order (float4 k of warpgroup thread i at
// [warpgroup][k][i]): the stores are conflict-free and each warpgroup's half is
// contiguous, so only the warpgroup itself has to agree that it is complete.
// DqFromSlots undoes the order. With one staging buffer the issuing thread first waits
// until the previous reduction has read it.
template <int D>
__device__ __forceinline__ void ReduceDq(const float (&dq)[32], float* dq_smem, float* dq_acc, int64_t slot, int wgi,
                                         int wt) {
  constexpr int kBr = kBrOf<D>, kHalf = kBr * D / 2;  // floats per warpgroup
  static_assert(kHalf == 32 * 128, "a warpgroup's dQ half is 32 floats per thread");
  float* half = dq_smem + wgi * kHalf;
  float4* buf = reinterpret_cast<float4*>(half);  // shared memory
  if constexpr (BwdSmem<D>::kDqBuffers == 1) {
    if (wt == 0) tma::BulkWaitRead<0>();
    if (wgi == 0) asm volatile("bar.sync 2, 128;\n" ::: "memory");
    else asm volatile("bar.sync 3, 128;\n" ::: "memory");
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) tc::StShared(buf + k * 128 + wt, make_float4(dq[4 * k], dq[4 * k + 1], dq[4 * k + 2], dq[4 * k + 3]));
  wg::FenceProxyAsync();
  if (wgi == 0) asm volatile("bar.sync 2, 128;\n" ::: "memory");
  else asm volatile("bar.sync 3, 128;\n" ::: "memory");
  if (wt == 0) {
    tma::BulkReduceAddF32(dq_acc + slot * (kBr * D) + wgi * kHalf, half, kHalf * 4);
    tma::BulkCommit();
    if constexpr (BwdSmem<D>::kDqBuffers == 2) tma::BulkWaitRead<1>();  // the other buffer is free for the next tile
  }
}

// dK (scaled) and dV of this thread's keys n0 + key0 + g (+8), as bf16 pairs.
template <int D>
__device__ __forceinline__ void WriteDkDv(const float (&dk)[D / 2], const float (&dv)[D / 2], const BwdParams& p,
                                          const BwdWork& w, int key0, int g, int t) {
  const int64_t kv_stride = int64_t(p.hkv) * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int kj = w.n0 + key0 + g + 8 * r;
    if (kj >= w.len) continue;
    const int64_t off = (int64_t(w.start) + kj) * kv_stride + w.kvh * D + 2 * t;
#pragma unroll
    for (int c = 0; c < D / 8; ++c) {
      *reinterpret_cast<uint32_t*>(p.dk + off + 8 * c) =
          tc::PackBf16(dk[4 * c + 2 * r] * p.scale, dk[4 * c + 2 * r + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(p.dv + off + 8 * c) = tc::PackBf16(dv[4 * c + 2 * r], dv[4 * c + 2 * r + 1]);
    }
  }
}

// One consumer warpgroup (64 keys): the whole loop over the group's heads and query tiles.
template <int D, bool kCausal>
__device__ __forceinline__ void ConsumeBwd(const BwdShared<D>& sm, const BwdParams& p, const BwdWork& w, int wgi) {
  constexpr int kStages = BwdShared<D>::kStages, kBr = kBrOf<D>;
  const int tid = threadIdx.x, warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int key0 = 64 * wgi + 16 * warp;  // tile-local key of this thread's rows g and g + 8
  const float sl2 = p.scale * kLog2e;
  const bool key_mask = w.n0 + kBc > w.len;
  tma::Wait(sm.kv_full(), 0);
  float dk[D / 2] = {}, dv[D / 2] = {};
  for (int it = 0; it < w.iters; ++it) {
    const int st = it % kStages, h = w.kvh * w.group + it / w.m_tiles, m0 = (w.m_first + it % w.m_tiles) * kBr;
    tma::Wait(sm.q_full(st), (it / kStages) & 1);
    // Accumulators start from the first product (scale-d = 0), so they need no zeroing:
    // non-wgmma writes to them inside the pipeline would serialize the wgmmas.
    float s[kBr / 2], dp[kBr / 2];
    wg::Fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      SdpMma<kBr>(s, wg::KMajorDesc(sm.k(), 64 * wgi, kk), wg::KMajorDesc(sm.q(st), 0, kk), kk > 0);
    wg::Commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      SdpMma<kBr>(dp, wg::KMajorDesc(sm.v(), 64 * wgi, kk), wg::KMajorDesc(sm.dout(st), 0, kk), kk > 0);
    wg::Commit();
    // lse2 and D are padded with +inf and 0 past the sequence.
    const bool mask = key_mask || (kCausal && w.n0 + key0 + 15 > m0);
    uint32_t ap[kBr / 16][4], ads[kBr / 16][4];
    ScoresToGrads<kBr, kCausal>(s, dp, ap, ads, sm.rows(st), sl2, mask, w.n0, key0, m0, w.len, g, t);
    // Stage dS^T (keys x queries) for dQ; every consumer warpgroup reads all 128 keys.
    const auto ds = sm.ds(it & 1);
#pragma unroll
    for (int c = 0; c < kBr / 8; ++c)
#pragma unroll
      for (int r = 0; r < 2; ++r)
        tc::StShared(ds.Chunk(key0 + g + 8 * r, c) + 2 * t, ads[c / 2][2 * (c & 1) + r]);
    wg::FenceProxyAsync();
    ConsumerBarrier();  // dS^T of both warpgroups written
    // This warpgroup's half of dQ = dS K (A = dS M-major from dS^T, B = K N-major): at
    // d128 all 64 queries x its 64 of the head dims, at d64 its 64 of the 128 queries x
    // all 64 head dims. Then dV and dK; the dQ reduction below overlaps the dV/dK
    // product on the tensor cores.
    float dq[32];
    wg::Fence();
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk)
      wg::WgmmaSS_m64n64<1, 1>(dq, wg::MnMajorDesc(ds, kk, D == 64 ? wgi : 0),
                               wg::MnMajorDesc(sm.k(), kk, D == 128 ? wgi : 0), kk > 0);
    wg::Commit();
#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) RsMma<D>(dv, ap[kk], wg::MnMajorDesc(sm.dout(st), kk));
#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) RsMma<D>(dk, ads[kk], wg::MnMajorDesc(sm.q(st), kk));
    wg::Commit();
    wg::Wait<1>();
    wg::FenceRegs(dq);
    ReduceDq<D>(dq, sm.dq() + (BwdSmem<D>::kDqBuffers == 2 ? it & 1 : 0) * kBr * D, p.dq_acc, int64_t(h) * p.q_slots + w.q_first + m0 / kBr, wgi,
                tid % 128);
    // dV/dK retire before the loop carries their registers (an in-flight accumulator
    // across the back edge would serialize every wgmma); the stage goes back.
    wg::Wait<0>();
    wg::FenceRegs(dk);
    wg::FenceRegs(dv);
    tma::Arrive(sm.q_empty(st));
  }
  if (tid % 128 == 0) tma::BulkWait<0>();
  WriteDkDv<D>(dk, dv, p, w, key0, g, t);
}

template <int D, bool kCausal>
__global__ void __launch_bounds__(kThreads, 1)
    BwdKernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
              const __grid_constant__ CUtensorMap tv, const __grid_constant__ CUtensorMap tdo, BwdParams p) {
#if TESSERA_SM90A
  constexpr int kBr = kBrOf<D>;
  extern __shared__ unsigned char smem_raw[];
  const BwdShared<D> sm = BwdShared<D>::Make(smem_raw);
  // CTA = (table entry, kv head): causal, the heads of an entry side by side (the table's
  // heaviest key tiles first); full attention, a head's entries side by side (they share
  // its Q and dO in L2). Launch says why.
  const int entry = kCausal ? blockIdx.x / p.hkv : blockIdx.x % p.tiles;
  const int2 tile = p.table[entry];
  if (tile.x < 0) return;
  BwdWork w;
  w.kvh = kCausal ? blockIdx.x % p.hkv : blockIdx.x / p.tiles, w.group = p.hq / p.hkv;
  w.start = p.cu[tile.x], w.len = p.cu[tile.x + 1] - w.start, w.n0 = tile.y * kBc;
  w.m_first = kCausal ? w.n0 / kBr : 0, w.m_tiles = (w.len + kBr - 1) / kBr - w.m_first;
  w.iters = w.group * w.m_tiles, w.q_first = p.q_first[tile.x];
  const int tid = threadIdx.x, wgi = tid / 128 - 1;
  if (tid == 0) sm.InitBarriers();
  __syncthreads();
  if (wgi < 0) {  // producer warpgroup
    tma::RegDealloc<24>();
    if (tid == 0) ProduceBwd<D>(sm, &tq, &tk, &tv, &tdo, p, w);
    return;
  }
  tma::RegAlloc<240>();
  ConsumeBwd<D, kCausal>(sm, p, w, wgi);
#else
  __trap();  // Hopper only: launched where HopperPaths()
#endif
}

// lse2 and dvec of one kBr-query slot of one head: lse * log2(e) and
// sum_c dout[i][h][c] * out[i][h][c], one warp per query, (+inf, 0) past the sequence.
template <int kBr>
__global__ void __launch_bounds__(256) Prepare(const bf16* dout, const bf16* out, const float* lse, const int2* slots,
                                               const int32_t* q_first, const int32_t* cu, int64_t q_slots, int hq,
                                               int dim, float* lse2, float* dvec) {
  const int2 sl = slots[blockIdx.x];
  if (sl.x < 0) return;
  const int h = blockIdx.y, lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int start = cu[sl.x], len = cu[sl.x + 1] - start;
  const int m0 = (static_cast<int>(blockIdx.x) - q_first[sl.x]) * kBr;
  const int64_t base = (int64_t(h) * q_slots + blockIdx.x) * kBr;
  for (int r = warp; r < kBr; r += 8) {
    const int qi = m0 + r;
    float s = 0.f;
    if (qi < len) {
      const int64_t row = (int64_t(start) + qi) * hq + h;
      for (int c = 2 * lane; c < dim; c += 64) {
        const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(dout + row * dim + c));
        const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(out + row * dim + c));
        s += a.x * b.x + a.y * b.y;
      }
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
    }
    if (lane == 0) {
      dvec[base + r] = s;
      lse2[base + r] = qi < len ? lse[(int64_t(start) + qi) * hq + h] * kLog2e : INFINITY;
    }
  }
}

// dq = scale * dq_acc, undoing the fragment order of the slots: one CTA per (slot, head),
// each of its 256 threads reads back what consumer thread `ct` stored (coalesced float4s,
// [warpgroup][k][thread of the warpgroup]) and writes bf16 pairs of rows
// q0 + 16 warp + g + 8 r, columns c0 + 8 c + 2 t, where the warpgroup's half starts at
// query q0 = 64 wgi (d64) or column c0 = 64 wgi (d128).
template <int D>
__global__ void __launch_bounds__(256) DqFromSlots(const float* acc, const int2* slots, const int32_t* q_first,
                                                   const int32_t* cu, int64_t q_slots, int hq, float scale, bf16* dq) {
  constexpr int kBr = kBrOf<D>;
  const int2 sl = slots[blockIdx.x];
  if (sl.x < 0) return;
  const int h = blockIdx.y, ct = threadIdx.x, wgi = ct / 128, warp = (ct / 32) % 4, lane = ct % 32, g = lane / 4,
            t = lane % 4;
  const int start = cu[sl.x], len = cu[sl.x + 1] - start;
  const int m0 = (static_cast<int>(blockIdx.x) - q_first[sl.x]) * kBr;  // slot = first slot of the sequence + tile
  const int q0 = D == 64 ? 64 * wgi : 0, c0 = D == 128 ? 64 * wgi : 0;
  const float4* src = reinterpret_cast<const float4*>(acc + (int64_t(h) * q_slots + blockIdx.x) * (kBr * D));
  float v[32];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float4 x = src[(wgi * 8 + k) * 128 + ct % 128];
    v[4 * k] = x.x, v[4 * k + 1] = x.y, v[4 * k + 2] = x.z, v[4 * k + 3] = x.w;
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = m0 + q0 + 16 * warp + g + 8 * r;
    if (qi >= len) continue;
    bf16* row = dq + ((int64_t(start) + qi) * hq + h) * D + c0 + 2 * t;
#pragma unroll
    for (int c = 0; c < 8; ++c)
      *reinterpret_cast<uint32_t*>(row + 8 * c) = tc::PackBf16(v[4 * c + 2 * r] * scale, v[4 * c + 2 * r + 1] * scale);
  }
}

template <int D, bool kCausal>
absl::Status Launch(const void* q, const void* k, const void* v, const void* dout, const BwdParams& p,
                    const AttentionDims& d, cudaStream_t s) {
  constexpr int kSmem = BwdSmem<D>::kBytes, kBr = kBrOf<D>;
  CUtensorMap tq, tk, tv, tdo;
  TESSERA_RETURN_IF_ERROR(TokenTensorMap(&tq, q, d.tokens, d.q_heads, D, kBr, "q"));
  TESSERA_RETURN_IF_ERROR(TokenTensorMap(&tdo, dout, d.tokens, d.q_heads, D, kBr, "dout"));
  TESSERA_RETURN_IF_ERROR(TokenTensorMap(&tk, k, d.tokens, d.kv_heads, D, kBc, "k"));
  TESSERA_RETURN_IF_ERROR(TokenTensorMap(&tv, v, d.tokens, d.kv_heads, D, kBc, "v"));
  auto kernel = BwdKernel<D, kCausal>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) != cudaSuccess)
    return LaunchStatus("flash_backward(smem attribute)");
  // Causal key tiles differ in cost (tile j of a sequence is seen by its query tiles from
  // j on) and the hardware starts CTAs in grid order, so the causal grid runs through the
  // table (key tile 0 of a sequence first, TileOrder::kFirstFirst) with every kv head of
  // an entry side by side: the heaviest CTAs start first and the light ones fill in
  // behind. Light-first with heads outermost (the order before) left one ~1B-Llama
  // layer's backward (one 4096-token sequence, 8 kv heads: 256 CTAs on 132 SMs) waiting
  // for the last heads' heavy tiles, started late: the 1B step went 288.7 -> 278.0 ms
  // (H100, same call). Full attention keeps heads outermost (equal CTAs; a head's key
  // tiles share its Q and dO in L2).
  const int64_t ctas = int64_t(p.tiles) * d.kv_heads;
  if (ctas > INT32_MAX) return absl::InvalidArgumentError(absl::StrCat("flash_backward: ", ctas, " CTAs"));
  kernel<<<static_cast<unsigned>(ctas), kThreads, kSmem, s>>>(tq, tk, tv, tdo, p);
  return LaunchStatus("flash_backward");
}
}  // namespace

absl::Status Backward(const void* q, const void* k, const void* v, const int32_t* cu, const void* out, const void* dout,
                      const float* lse, void* dq, void* dk, void* dv, const AttentionDims& d, cudaStream_t s) {
  const int kBr = d.head_dim == 64 ? kBrOf<64> : kBrOf<128>;
  const int64_t tiles = TileCapacity(d, kBc), q_slots = TileCapacity(d, kBr), rows = d.q_heads * q_slots * kBr;
  const int64_t acc_n = d.q_heads * q_slots * kBr * d.head_dim;
  // Scratch: dq_acc f32, lse2 and dvec [Hq][q slots][kBr] f32, the key-tile table, the query-slot table
  // and each sequence's first query slot.
  char* scratch = nullptr;
  const size_t bytes =
      (acc_n + 2 * rows) * sizeof(float) + (tiles + q_slots) * sizeof(int2) + d.batch * sizeof(int32_t);
  if (cudaMallocAsync(&scratch, bytes, s) != cudaSuccess) return LaunchStatus("flash_backward(alloc)");
  float* dq_acc = reinterpret_cast<float*>(scratch);
  float* lse2 = dq_acc + acc_n;
  float* dvec = lse2 + rows;
  int2* table = reinterpret_cast<int2*>(dvec + rows);
  int2* slots = table + tiles;
  int32_t* q_first = reinterpret_cast<int32_t*>(slots + q_slots);
  BwdParams p{lse2, dvec, dq_acc, q_first, q_slots, static_cast<bf16*>(dk), static_cast<bf16*>(dv), cu, table,
              static_cast<int>(d.q_heads), static_cast<int>(d.kv_heads), static_cast<int>(tiles), d.tokens, d.scale};
  auto launch = d.head_dim == 64 ? (d.causal ? Launch<64, true> : Launch<64, false>)
                                 : (d.causal ? Launch<128, true> : Launch<128, false>);
  auto run = [&]() -> absl::Status {
    if (cudaMemsetAsync(dq_acc, 0, acc_n * sizeof(float), s) != cudaSuccess) return LaunchStatus("flash_backward(memset)");
    TESSERA_RETURN_IF_ERROR(BuildTileTable(cu, d.batch, kBc, table, tiles, s, nullptr,
                                           d.causal ? TileOrder::kFirstFirst : TileOrder::kLastFirst));
    TESSERA_RETURN_IF_ERROR(BuildTileTable(cu, d.batch, kBr, slots, q_slots, s, q_first));
    const dim3 grid(static_cast<unsigned>(q_slots), static_cast<unsigned>(d.q_heads));
    (kBr == 128 ? Prepare<128> : Prepare<64>)<<<grid, 256, 0, s>>>(static_cast<const bf16*>(dout), static_cast<const bf16*>(out), lse, slots, q_first, cu,
                                 q_slots, static_cast<int>(d.q_heads), static_cast<int>(d.head_dim), lse2, dvec);
    TESSERA_RETURN_IF_ERROR(LaunchStatus("flash_backward(prepare)"));
    TESSERA_RETURN_IF_ERROR(launch(q, k, v, dout, p, d, s));
    if (d.head_dim == 64)
      DqFromSlots<64><<<grid, 256, 0, s>>>(dq_acc, slots, q_first, cu, q_slots, static_cast<int>(d.q_heads), d.scale, static_cast<bf16*>(dq));
    else
      DqFromSlots<128><<<grid, 256, 0, s>>>(dq_acc, slots, q_first, cu, q_slots, static_cast<int>(d.q_heads), d.scale, static_cast<bf16*>(dq));
    return LaunchStatus("flash_backward(dq)");
  };
  const absl::Status st = run();
  cudaFreeAsync(scratch, s);
  return st;
}

}  // namespace tessera::kernels::flash
