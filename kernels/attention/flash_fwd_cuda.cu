// Flash-attention forward for sm_90a, in the structure of FlashAttention-3:
// one CTA = 3 warpgroups for 128 queries of one head (or 2 for 64, see kThreadsOf).
// Warpgroup 0 is the producer: one
// thread streams Q and the K/V tiles (128 keys) into shared memory with TMA (bulk tensor
// copies, 128-byte swizzle, completion on mbarriers), two stages deep; it gives up its
// registers (setmaxnreg) to the two consumer warpgroups of 64 queries each. Consumers
// compute S = Q K^T with wgmma (both operands in shared memory, K-major), the online
// softmax on the accumulators, and O += P V with P straight from registers (the
// accumulator layout is the A-fragment layout) and V N-major in shared memory; the P V
// product of tile j-1 runs on the tensor cores while the softmax of tile j runs on the
// CUDA cores. Stages are handed back to the producer through "empty" mbarriers, so the
// warpgroups never wait on each other; the consumers take turns (ping-pong) issuing
// their products. Masking only on tiles that cross the diagonal or the sequence end (TMA
// reads past a sequence end come from the next sequence or are zero past the tensor:
// masked keys get P = 0, extra query rows are never written). Causal items stop at the
// diagonal. Full attention runs persistent CTAs, causal one heavy-light pair of query
// tiles per CTA (see Launch).
#include <algorithm>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/attention/flash_cuda.h"
#include "kernels/common/cuda_elem.cuh"
#include "kernels/common/tensor_map.h"
#include "kernels/common/wgmma.cuh"

// Outside the 90a pass the kernels' bodies are traps: their helpers go unused there.
#if !TESSERA_SM90A
#pragma nv_diag_suppress 177
#endif

namespace tessera::kernels::flash {
namespace {
using bf16 = __nv_bfloat16;
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kBc = 128, kStages = 2;
// C consumer warpgroups of 64 queries each: C = 2 (one CTA per SM, the two taking turns on
// the tensor cores), or C = 1 for causal d64 over short sequences (two CTAs per SM, whose
// starts and tails overlap — see Forward).
template <int C>
constexpr int kThreadsOf = 128 * (C + 1);
template <int C>
constexpr int kBrOf = 64 * C;

struct FwdParams {
  bf16* out;
  float* lse;
  const int32_t* cu;
  const int2* table;
  int64_t tiles;  // table entries (query tiles, some unused)
  int hq, hkv;
  float scale;
};

// One work item (a query tile of one head) as the producer hands it to the consumers.
struct FwdItem {
  int h, start, len, m0, n_tiles;  // h < 0: no more items
};

template <int D, int C>
struct FwdSmem {
  using QTile = wg::Sw128Tile<kBrOf<C>, D>;
  using KTile = wg::Sw128Tile<kBc, D>;
  static constexpr int kTiles = QTile::kBytes + 2 * kStages * KTile::kBytes;
  static constexpr int kBarriers = 2 + 4 * kStages;  // q_full, q_empty, k_full[], v_full[], k_empty[], v_empty[]
  static constexpr int kBytes = kTiles + kBarriers * 8 + 32 + 1024;  // + the item slot, alignment slack
};

template <int D>
__device__ __forceinline__ void PvMma(float (&o)[D / 2], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (D == 128) wg::WgmmaRS_m64n128<1>(o, a, desc);
  else wg::WgmmaRS_m64n64<1>(o, a, desc);
}

// The CTA's shared memory: Q, the K/V ring, the mbarriers and the item slot.
template <int D, int C>
struct FwdShared {
  using QTile = typename FwdSmem<D, C>::QTile;
  using KTile = typename FwdSmem<D, C>::KTile;
  char* base;  // 1024-byte aligned (128B swizzle)
  uint64_t* bars;

  __device__ static FwdShared Make(unsigned char* raw) {
    char* b = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
    return {b, reinterpret_cast<uint64_t*>(b + FwdSmem<D, C>::kTiles)};
  }
  __device__ QTile q() const { return QTile{reinterpret_cast<bf16*>(base)}; }
  __device__ KTile k(int st) const { return KTile{reinterpret_cast<bf16*>(base + QTile::kBytes + 2 * st * KTile::kBytes)}; }
  __device__ KTile v(int st) const {
    return KTile{reinterpret_cast<bf16*>(base + QTile::kBytes + (2 * st + 1) * KTile::kBytes)};
  }
  __device__ uint64_t* q_full() const { return bars; }
  __device__ uint64_t* q_empty() const { return bars + 1; }
  __device__ uint64_t* k_full(int st) const { return bars + 2 + st; }
  __device__ uint64_t* v_full(int st) const { return bars + 2 + kStages + st; }
  __device__ uint64_t* k_empty(int st) const { return bars + 2 + 2 * kStages + st; }
  __device__ uint64_t* v_empty(int st) const { return bars + 2 + 3 * kStages + st; }
  __device__ FwdItem* slot() const { return reinterpret_cast<FwdItem*>(bars + 2 + 4 * kStages); }

  __device__ void InitBarriers() const {
    tma::BarInit(q_full(), 1);
    // Every consumer thread: each read the item slot itself (one arrive per warp would do
    // by the memory model, but racecheck then reports the producer's next slot write).
    tma::BarInit(q_empty(), 128 * C);
    for (int i = 0; i < kStages; ++i) {
      tma::BarInit(k_full(i), 1);
      tma::BarInit(v_full(i), 1);
      tma::BarInit(k_empty(i), 4 * C);
      tma::BarInit(v_empty(i), 4 * C);
    }
    tma::FenceBarrierInit();
  }
};

// Work item w = (query tile w % tiles, head w / tiles). Full attention: a CTA takes items
// blockIdx.x, blockIdx.x + gridDim.x, ...; causal: items 2 blockIdx.x and 2 blockIdx.x + 1,
// a heavy and a light tile of one sequence (the table alternates them). Only
// the producer reads the tile table and cu_seqlens (a chain of dependent global loads),
// one item ahead of its use; it hands each item to the consumers in a shared slot
// published by the Q barrier, and ends the list with h = -1. The K/V ring's stage and
// phase run on across items (`kv` counts tiles), so the next item's Q and K/V load while
// the consumers finish the last one (its P V products and its epilogue).
// Returns the first valid item w, w + stride, ... before `end` (filling `it`), or `end`.
template <bool kCausal, int C>
__device__ __forceinline__ int64_t NextItem(const FwdParams& p, int64_t w, int64_t end, int64_t stride, FwdItem& it) {
  for (; w < end; w += stride) {
    const int2 tile = p.table[w % p.tiles];
    if (tile.x < 0) continue;
    it.h = static_cast<int>(w / p.tiles);
    it.start = p.cu[tile.x];
    it.len = p.cu[tile.x + 1] - it.start;
    it.m0 = tile.y * kBrOf<C>;
    const int n_end = kCausal ? min(it.len, it.m0 + kBrOf<C>) : it.len;
    it.n_tiles = (n_end + kBc - 1) / kBc;
    return w;
  }
  return end;
}

// The producer (one thread): Q of each item, then its K/V tiles through the ring.
template <int D, bool kCausal, int C>
__device__ __forceinline__ void Produce(const FwdShared<D, C>& sm, const CUtensorMap* tq, const CUtensorMap* tk,
                                        const CUtensorMap* tv, const FwdParams& p) {
  using QTile = typename FwdShared<D, C>::QTile;
  using KTile = typename FwdShared<D, C>::KTile;
  const int64_t items = p.tiles * p.hq, first = kCausal ? 2 * int64_t(blockIdx.x) : blockIdx.x;
  const int64_t end = kCausal ? min(items, first + 2) : items, stride = kCausal ? 1 : gridDim.x;
  int64_t kv = 0, nq = 0;
  FwdItem it;
  for (int64_t w = NextItem<kCausal, C>(p, first, end, stride, it);; ++nq) {
    if (nq > 0) tma::Wait(sm.q_empty(), (nq - 1) & 1);  // the consumers are past the slot and Q
    if (w >= end) {
      sm.slot()->h = -1;
      tma::Arrive(sm.q_full());
      return;
    }
    *sm.slot() = it;
    const int kvh = it.h / (p.hq / p.hkv);
    tma::ArriveExpectTx(sm.q_full(), QTile::kBytes);
    for (int b = 0; b < D / 64; ++b)
      tma::Load3d(reinterpret_cast<char*>(sm.q().base) + b * QTile::kBlockBytes, tq, sm.q_full(), 64 * b, it.h,
                  it.start + it.m0);
    FwdItem next;  // its loads are in flight during this item's K/V stream
    const int64_t w_next = NextItem<kCausal, C>(p, w + stride, end, stride, next);
    for (int j = 0; j < it.n_tiles; ++j, ++kv) {
      const int st = kv % kStages, row = it.start + j * kBc;
      const int ph = static_cast<int>(kv / kStages) & 1;
      if (kv >= kStages) tma::Wait(sm.k_empty(st), ph ^ 1);
      tma::ArriveExpectTx(sm.k_full(st), KTile::kBytes);
      for (int b = 0; b < D / 64; ++b)
        tma::Load3d(reinterpret_cast<char*>(sm.k(st).base) + b * KTile::kBlockBytes, tk, sm.k_full(st), 64 * b, kvh, row);
      if (kv >= kStages) tma::Wait(sm.v_empty(st), ph ^ 1);
      tma::ArriveExpectTx(sm.v_full(st), KTile::kBytes);
      for (int b = 0; b < D / 64; ++b)
        tma::Load3d(reinterpret_cast<char*>(sm.v(st).base) + b * KTile::kBlockBytes, tv, sm.v_full(st), 64 * b, kvh, row);
    }
    it = next;
    w = w_next;
  }
}

// Keys past the sequence end, and (causal) after the query, get -inf. s holds this
// thread's rows g and g + 8 of the 64 x 128 score tile (columns 8 (i/4) + 2t + (i&1)).
template <bool kCausal>
__device__ __forceinline__ void MaskTile(float (&s)[kBc / 2], int n0, int len, int row0, int g, int t) {
#pragma unroll
  for (int i = 0; i < kBc / 2; ++i) {
    const int kj = n0 + 8 * (i / 4) + 2 * t + (i & 1), qi = row0 + g + 8 * ((i >> 1) & 1);
    if (kj >= len || (kCausal && kj > qi)) s[i] = -INFINITY;
  }
}

// Online softmax over one score tile for rows g (r = 0) and g + 8 (r = 1): new running
// max m and sum l, the rescale factor alpha of the old accumulators, s -> exp2 in place.
__device__ __forceinline__ void SoftmaxTile(float (&s)[kBc / 2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                            float sl2) {
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
}

// Normalizes O, writes its bf16 rows and the log-sum-exp (rows past the sequence are not
// written).
template <int D>
__device__ __forceinline__ void WriteOutput(const float (&o)[D / 2], const float (&m)[2], const float (&l)[2],
                                            const FwdParams& p, const FwdItem& it, int row0, int g, int t) {
  const int64_t q_stride = int64_t(p.hq) * D;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float sum = tc::QuadSum(l[r]);
    const int qi = row0 + g + 8 * r;
    if (qi >= it.len) continue;
    const float inv = 1.f / sum;
    bf16* orow = p.out + (int64_t(it.start) + qi) * q_stride + it.h * D + 2 * t;
#pragma unroll
    for (int c = 0; c < D / 8; ++c)
      *reinterpret_cast<uint32_t*>(orow + 8 * c) = tc::PackBf16(o[4 * c + 2 * r] * inv, o[4 * c + 2 * r + 1] * inv);
    if (t == 0) p.lse[(int64_t(it.start) + qi) * p.hq + it.h] = m[r] * p.scale + logf(sum);
  }
}

// One consumer warpgroup's share (64 query rows) of one item. `kv` counts the K/V tiles
// this CTA consumed so far (the ring's stage and phase).
template <int D, bool kCausal, int C>
__device__ __forceinline__ void ConsumeItem(const FwdShared<D, C>& sm, const FwdParams& p, const FwdItem& it, int64_t& kv,
                                            int wgi, int warp, int lane) {
  const int g = lane / 4, t = lane % 4, n_tiles = it.n_tiles;
  const float sl2 = p.scale * kLog2e;
  const int row0 = it.m0 + wgi * 64 + warp * 16;  // sequence-local query of this thread's rows g and g + 8
  // Ping-pong: the two consumer warpgroups take turns issuing their wgmmas (named
  // barriers 2 and 3), so one warpgroup's softmax runs while the other's products occupy
  // the tensor cores. Warpgroup 0 goes first; warpgroup 1 skips its last hand-over so
  // that both barriers end balanced (per item).
  const int turns = n_tiles + 1;
  auto my_turn = [&] {
    if constexpr (C == 2) asm volatile("bar.sync %0, 256;\n" ::"r"(2 + wgi) : "memory");
  };
  auto pass_turn = [&](int turn) {
    if constexpr (C == 2)
      if (wgi == 0 || turn + 1 < turns) asm volatile("bar.arrive %0, 256;\n" ::"r"(3 - wgi) : "memory");
  };
  if constexpr (C == 2)
    if (wgi == 1) asm volatile("bar.arrive 2, 256;\n" ::: "memory");

  float o[D / 2] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  uint32_t pa[kBc / 16][4];
  for (int j = 0; j < n_tiles; ++j, ++kv) {
    const int n0 = j * kBc, st = kv % kStages, pst = (kv + kStages - 1) % kStages;
    tma::Wait(sm.k_full(st), static_cast<int>(kv / kStages) & 1);
    float s[kBc / 2];  // no zeroing: the first product overwrites (scale-d = 0)
    my_turn();
    wg::Fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wg::WgmmaSS_m64n128(s, wg::KMajorDesc(sm.q(), wgi * 64, kk), wg::KMajorDesc(sm.k(st), 0, kk), kk > 0);
    wg::Commit();
    if (j > 0) {
      tma::Wait(sm.v_full(pst), static_cast<int>((kv - 1) / kStages) & 1);
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) PvMma<D>(o, pa[kk], wg::MnMajorDesc(sm.v(pst), kk));
      wg::Commit();
      pass_turn(j);
      wg::Wait<1>();
    } else {
      pass_turn(j);
      wg::Wait<0>();
    }
    wg::FenceRegs(s);
    if (lane == 0) tma::Arrive(sm.k_empty(st));
    if (j + 1 == n_tiles) tma::Arrive(sm.q_empty());  // Q's last reader is done
    if (n0 + kBc > it.len || (kCausal && n0 + kBc - 1 > row0)) MaskTile<kCausal>(s, n0, it.len, row0, g, t);
    float alpha[2];
    SoftmaxTile(s, m, l, alpha, sl2);
    wg::Wait<0>();  // O += P(j-1) V(j-1) done: O, pa and that V stage are free
    wg::FenceRegs(o);
    if (j > 0 && lane == 0) tma::Arrive(sm.v_empty(pst));
#pragma unroll
    for (int c = 0; c < D / 8; ++c)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[4 * c + e] *= alpha[e >> 1];
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk)
#pragma unroll
      for (int e = 0; e < 4; ++e) pa[kk][e] = tc::PackBf16(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
  }
  const int pst = (kv + kStages - 1) % kStages;  // the last tile's P V
  tma::Wait(sm.v_full(pst), static_cast<int>((kv - 1) / kStages) & 1);
  my_turn();
  wg::Fence();
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) PvMma<D>(o, pa[kk], wg::MnMajorDesc(sm.v(pst), kk));
  wg::Commit();
  pass_turn(n_tiles);
  wg::Wait<0>();
  wg::FenceRegs(o);
  if (lane == 0) tma::Arrive(sm.v_empty(pst));
  WriteOutput<D>(o, m, l, p, it, row0, g, t);
}

template <int D, bool kCausal, int C>
__global__ void __launch_bounds__(kThreadsOf<C>, C == 1 ? 2 : 1)
    FwdKernel(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
              const __grid_constant__ CUtensorMap tv, FwdParams p) {
#if TESSERA_SM90A
  extern __shared__ unsigned char smem_raw[];
  const FwdShared<D, C> sm = FwdShared<D, C>::Make(smem_raw);
  const int tid = threadIdx.x, wgi = tid / 128 - 1, warp = (tid / 32) % 4, lane = tid % 32;
  if (tid == 0) sm.InitBarriers();
  __syncthreads();
  if (wgi < 0) {  // producer warpgroup
    tma::RegDealloc<24>();
    if (tid == 0) Produce<D, kCausal, C>(sm, &tq, &tk, &tv, p);
    return;
  }
  tma::RegAlloc<C == 2 ? 240 : 232>();  // C = 1: 2 CTAs x (128 x 24 + 128 x 232) registers
  int64_t kv = 0;
  for (int64_t nq = 0;; ++nq) {
    tma::Wait(sm.q_full(), nq & 1);
    const FwdItem* slot = sm.slot();  // read as shared memory (its pointer lost the address space)
    const FwdItem it{tc::LdSharedI32(&slot->h), tc::LdSharedI32(&slot->start), tc::LdSharedI32(&slot->len),
                     tc::LdSharedI32(&slot->m0), tc::LdSharedI32(&slot->n_tiles)};
    if (it.h < 0) return;
    ConsumeItem<D, kCausal, C>(sm, p, it, kv, wgi, warp, lane);
  }
#else
  __trap();  // Hopper only: launched where HopperPaths()
#endif
}

template <int D, bool kCausal, int C>
absl::Status Launch(const void* q, const void* k, const void* v, const FwdParams& p, const AttentionDims& d,
                    int2* table, cudaStream_t s) {
  constexpr int kSmem = FwdSmem<D, C>::kBytes, kBr = kBrOf<C>;
  CUtensorMap tq, tk, tv;
  TESSERA_RETURN_IF_ERROR(TokenTensorMap(&tq, q, d.tokens, d.q_heads, D, kBr, "q"));
  TESSERA_RETURN_IF_ERROR(TokenTensorMap(&tk, k, d.tokens, d.kv_heads, D, kBc, "k"));
  TESSERA_RETURN_IF_ERROR(TokenTensorMap(&tv, v, d.tokens, d.kv_heads, D, kBc, "v"));
  auto kernel = FwdKernel<D, kCausal, C>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) != cudaSuccess)
    return LaunchStatus("flash_forward(smem attribute)");
  const int64_t tiles = TileCapacity(d, kBr);
  TESSERA_RETURN_IF_ERROR(BuildTileTable(p.cu, d.batch, kBr, table, tiles, s, nullptr,
                                         kCausal ? TileOrder::kPairs : TileOrder::kLastFirst));
  // Full attention: persistent, one CTA per multiprocessor (each holds one) taking items
  // round robin (they all cost the same), so each CTA's next Q and K/V load under its
  // last item's tail and epilogue. Causal items differ in cost (tile i of a sequence sees
  // i + 1 key tiles): static round robin over all items measured slower at every length
  // (H200: 0.92-0.97x at 512-2048 tokens per sequence, 0.57-0.78x at 4k-16k — CTAs drift
  // apart and lose the L2 reuse of a head's K/V), so a causal CTA takes one heavy-light
  // pair of one sequence (tiles n-1-i and i: n + 1 key tiles, the same for all pairs of
  // a sequence) and the hardware hands the pairs out: half the CTA starts of one item per
  // CTA, and the second item's loads run under the first one's tail (H100, 1k-token
  // sequences: 0.286 -> 0.260 ms at d64, 0.204 -> 0.188 at d128). Persistent CTAs over
  // the pairs and a second Q buffer measured no faster (H100, 1k-16k) and would drift
  // on unequal packed sequences.
  const int sms = SmCount();
  const int64_t items = tiles * d.q_heads;
  FwdParams params = p;
  params.table = table;
  params.tiles = tiles;
  const int64_t grid = kCausal ? (items + 1) / 2 : std::min<int64_t>(items, sms * (C == 1 ? 2 : 1));
  kernel<<<static_cast<unsigned>(grid), kThreadsOf<C>, kSmem, s>>>(tq, tk, tv, params);
  return LaunchStatus("flash_forward");
}
}  // namespace

absl::Status TokenTensorMap(CUtensorMap* map, const void* base, int64_t tokens, int64_t heads, int64_t D, int rows,
                            const char* name) {
  auto encode = TensorMapEncoder();
  if (encode == nullptr) return absl::InternalError("flash attention: the driver has no cuTensorMapEncodeTiled");
  const cuuint64_t dims[3] = {cuuint64_t(D), cuuint64_t(heads), cuuint64_t(tokens)};
  const cuuint64_t strides[2] = {cuuint64_t(D * 2), cuuint64_t(heads * D * 2)};
  const cuuint32_t box[3] = {64, 1, cuuint32_t(rows)}, elem[3] = {1, 1, 1};
  CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(base), dims, strides, box, elem,
                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return absl::InvalidArgumentError(absl::StrCat("flash attention: cannot describe ", name, " [", tokens, ", ", heads, ", ",
                                                   D, "] for TMA (CUresult ", int(r), "; needs a 16-byte aligned base)"));
  return absl::OkStatus();
}

absl::Status Forward(const void* q, const void* k, const void* v, const int32_t* cu, void* out, float* lse,
                     const AttentionDims& d, cudaStream_t s) {
  int2* table = nullptr;  // scratch: the tile table
  // Causal d64 over short sequences (mean length <= 2048): CTAs of one consumer
  // warpgroup, two per SM. H100, same call: 1k-token sequences 0.260 -> 0.242 ms; 4k
  // the same; 16k 1-3% slower, and full attention 1-4% slower from 4k (so not used there).
  const bool one = d.head_dim == 64 && d.causal && d.tokens <= 2048 * d.batch;
  if (cudaMallocAsync(&table, TileCapacity(d, one ? kBrOf<1> : kBrOf<2>) * sizeof(int2), s) != cudaSuccess)
    return LaunchStatus("flash_forward(alloc)");
  FwdParams p{static_cast<bf16*>(out), lse, cu, nullptr, 0, static_cast<int>(d.q_heads), static_cast<int>(d.kv_heads),
              d.scale};
  auto launch = one ? Launch<64, true, 1>
                    : d.head_dim == 64 ? (d.causal ? Launch<64, true, 2> : Launch<64, false, 2>)
                                       : (d.causal ? Launch<128, true, 2> : Launch<128, false, 2>);
  absl::Status st = launch(q, k, v, p, d, table, s);
  cudaFreeAsync(table, s);
  return st;
}

}  // namespace tessera::kernels::flash
