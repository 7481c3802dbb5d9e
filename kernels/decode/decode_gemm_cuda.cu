// The decode linears (decode_linear.h) past 4 rows, up to kDecodeGemmMaxRows, on Hopper:
// a pass over the weights with the rows of x as the tensor cores' narrow side. Each
// warpgroup computes a 64-row tile of a weight against all the rows of x (wgmma
// m64nNk16, N = the rows rounded up to 32, 64 or 128: C^T = W X^T, both operands K-major in
// 128-byte-swizzled shared memory); a CTA is two such warpgroups (128 weight rows; under
// swiglu a gate tile and its up tile) and one producer warp that streams 64-column slices
// of both weight tiles through a ring of stages with TMA (mbarriers, bytes counted); the
// consumers bring x's slices themselves by cp.async. Where the tiles are fewer than the
// multiprocessors, a weight's K is split over a thread-block cluster of up to 8 CTAs (about
// one CTA a multiprocessor), which sum their partial tiles through distributed shared
// memory in rank order (the same bits every run) and share the epilogue: bias, residual,
// or silu(round(gate)) * round(up), rounded once as the fused CUDA-core kernel rounds. The
// layer's input norm runs first as its own small kernel (each row's rstd, x normalized and
// rounded into scratch), since every split needs whole rows.
// Launched as a programmatic dependent: the producer issues the first stages' weight
// loads before it waits for the kernel before it.
//
// Measured (H100, op_bench decode_linear, 16 kernels a graph): slower than cuBLASLt's GEMMs
// at 16 to 128 rows, so not dispatched by default (TESSERA_DECODE_GEMM=1 turns it on). Its
// main loop alone streams near the copy bandwidth (o at 64 rows 5.2 us for 8.4 MB); the
// epilogue costs 4.5 us at 16 rows up to 15 us at 128 whether K is split or not (a
// variant without the main loop), with stalls on memory barriers, long scoreboards and
// barriers (Nsight Compute) -- where that time goes is the open question.
#include <cuda.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <cooperative_groups.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/common/cuda_elem.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/common/scratch.cuh"
#include "kernels/common/tensor_map.h"
#include "kernels/common/wgmma.cuh"
#include "kernels/decode/decode_linear.h"

#if !TESSERA_SM90A
#pragma nv_diag_suppress 177
#endif

namespace tessera::kernels {
namespace {
namespace cg = cooperative_groups;
using bf16 = __nv_bfloat16;
constexpr int kConsumers = 2;                    // warpgroups of 64 weight rows
constexpr int kThreads = 128 * kConsumers + 32;  // and the producer warp
constexpr int kTile = 64;                        // weight rows a warpgroup owns
constexpr int kBk = 64;                          // K of a stage: one 128-byte swizzle span
constexpr int kMaxSplit = 8;                     // the portable cluster size
constexpr int kRedStride = kConsumers * kTile + 4;  // floats per x row of the partial tile (banks)

struct GPart {
  const bf16* bias;
  bf16* y;
  int n, tiles_end;  // 64-row tiles of this part and those before it
};
struct GParams {
  const bf16* x;  // [m, k], normalized where the layer has a norm
  const bf16* residual;
  int m, k, chunks, parts, swiglu, tiles, split;
  GPart part[3];
};
struct GMaps {
  CUtensorMap w[3];
};

// CTAs a multiprocessor (a build-time choice): 2 keeps room for the next kernel's CTAs
// (programmatic launch); 1 doubles each ring (H100, op_bench: gate|up at 128 rows 35.7
// against 51.9 us; slower at 16 and 64 rows).
#ifndef TESSERA_DECODE_GEMM_CTAS_PER_SM
#define TESSERA_DECODE_GEMM_CTAS_PER_SM 2
#endif
constexpr int kCtasPerSm = TESSERA_DECODE_GEMM_CTAS_PER_SM;
template <int NB>
struct Stages {  // about 96 KB a CTA at two a multiprocessor
  static constexpr int kS = (NB == 128 ? 3 : NB == 64 ? 4 : 5) * (kCtasPerSm == 1 ? 2 : 1);
};
template <int NB>
struct GSmem {
  using WTile = wg::Sw128Tile<kTile, kBk>;
  using XTile = wg::Sw128Tile<NB, kBk>;
  static constexpr int kS = Stages<NB>::kS;
  static constexpr int kStageBytes = kConsumers * WTile::kBytes + XTile::kBytes;
  static constexpr int kRing = kS * kStageBytes;
  static constexpr int kRed = NB * kRedStride * 4;  // the partial tile, over the ring once it is drained
  static_assert(kRed <= kRing, "the partial tile fits in the ring");
  static constexpr int kBytes = kRing + 2 * kS * 8 + 1024;  // + full/empty barriers, alignment slack
};

template <int NB>
__device__ __forceinline__ void Mma(float (&d)[NB / 2], uint64_t a, uint64_t b) {
  if constexpr (NB == 128) wg::WgmmaSS_m64n128(d, a, b, 1);
  else if constexpr (NB == 64) wg::WgmmaSS_m64n64(d, a, b, 1);
  else wg::WgmmaSS_m64n32(d, a, b, 1);
}

// Shared-memory reads of the partial tiles by 32-bit address: this CTA's own (ld.shared),
// and another's of the cluster (ld.shared::cluster at the address mapa gives); generic
// pointers into the cluster's window are several times slower here.
__device__ __forceinline__ float4 LdShared4(uint32_t a) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ float4 LdCluster4(uint32_t a) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t MapRank(uint32_t a, int rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(a), "r"(rank));
  return out;
}

// The weight tile warpgroup w of CTA `cta` owns: its part and first row (part < 0: none).
__device__ __forceinline__ void TileOf(const GParams& p, int cta, int w, int* part, int* row0) {
  if (p.swiglu) {
    *part = w, *row0 = cta * kTile;
    return;
  }
  const int t = cta * kConsumers + w;
  if (t >= p.tiles) {
    *part = -1, *row0 = 0;
    return;
  }
  int j = 0;
  while (j + 1 < p.parts && t >= p.part[j].tiles_end) ++j;
  *part = j, *row0 = (t - (j == 0 ? 0 : p.part[j - 1].tiles_end)) * kTile;
}

template <int NB>
__global__ void __launch_bounds__(kThreads, kCtasPerSm) DecodeGemm(const __grid_constant__ GMaps maps, const __grid_constant__ GParams p) {
#if TESSERA_SM90A
  using Sm = GSmem<NB>;
  constexpr int kS = Sm::kS;
  extern __shared__ unsigned char raw[];
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(base + Sm::kRing);
  uint64_t* empty = full + kS;
  auto wtile = [&](int st, int w) { return typename Sm::WTile{reinterpret_cast<bf16*>(base + st * Sm::kStageBytes + w * Sm::WTile::kBytes)}; };
  auto xtile = [&](int st) {
    return typename Sm::XTile{reinterpret_cast<bf16*>(base + st * Sm::kStageBytes + kConsumers * Sm::WTile::kBytes)};
  };
  const int split = p.split, rank = blockIdx.x % split, cta = blockIdx.x / split;
  const int c0 = rank * p.chunks / split, nc = (rank + 1) * p.chunks / split - c0;  // this CTA's 64-column slices of K
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int parts[kConsumers], rows0[kConsumers];
#pragma unroll
  for (int w = 0; w < kConsumers; ++w) TileOf(p, cta, w, &parts[w], &rows0[w]);
  if (threadIdx.x == 0) {
    for (int i = 0; i < kS; ++i) tma::BarInit(&full[i], 1), tma::BarInit(&empty[i], 4 * kConsumers);
    tma::FenceBarrierInit();
  }
  __syncthreads();

  if (warp == 4 * kConsumers) {  // the producer: the weights, kS stages ahead
    if (lane == 0) {
      uint32_t bytes = 0;
      for (int w = 0; w < kConsumers; ++w) bytes += parts[w] >= 0 ? Sm::WTile::kBytes : 0;
      auto load_w = [&](int st, int c) {
        tma::ArriveExpectTx(&full[st], bytes);
        for (int w = 0; w < kConsumers; ++w)
          if (parts[w] >= 0) tma::Load2d(wtile(st, w).base, &maps.w[parts[w]], &full[st], (c0 + c) * kBk, rows0[w]);
      };
      for (int c = 0; c < min(nc, kS); ++c) load_w(c, c);  // no dependency on the kernel before
      for (int c = kS; c < nc; ++c) {
        const int st = c % kS;
        tma::Wait(&empty[st], ((c / kS) & 1) ^ 1);
        load_w(st, c);
      }
    }
    GridDependencyWait();
    GridDependentsLaunch();
  } else {  // a consumer warpgroup
    GridDependencyWait();
    GridDependentsLaunch();
    const int w = warp / 4, tid = threadIdx.x;  // tid < 128 kConsumers
    // x's slices come by cp.async from the consumers themselves (the copy engine's
    // requests are the weights'), kS - 2 stages ahead: the slice of stage c + kS - 2 goes
    // where stage c - 2 was, whose MMAs both warpgroups have finished by the barrier of
    // stage c. Rows past m and columns past k are zeros.
    auto load_x = [&](int c) {
      if (c < nc) {
        const typename Sm::XTile t = xtile(c % kS);
        const int col0 = (c0 + c) * kBk;
#pragma unroll
        for (int i = tid; i < NB * (kBk / 8); i += 128 * kConsumers) {
          const int r = i / (kBk / 8), ch = i % (kBk / 8), col = col0 + 8 * ch;
          const bool ok = r < p.m && col < p.k;
          tc::CpAsync16(t.Chunk(r, ch), ok ? p.x + int64_t(r) * p.k + col : p.x, ok);
        }
      }
      tc::CpAsyncCommit();  // one group a stage, empty or not
    };
#pragma unroll
    for (int c = 0; c < kS - 2; ++c) load_x(c);
    float d[NB / 2];
#pragma unroll
    for (int i = 0; i < NB / 2; ++i) d[i] = 0.f;
    // A stage's MMAs run while the next stage is awaited (at most one group in flight); its
    // weights' slot goes back to the producer once the MMAs after it are issued.
    // (A warpgroup without a tile multiplies whatever its shared memory holds, so that no
    // branch splits the MMAs; the epilogue skips its rows.)
    for (int c = 0; c < nc; ++c) {
      const int st = c % kS;
      tc::CpAsyncWait<kS - 3>();
      wg::FenceProxyAsync();
      asm volatile("bar.sync 1, %0;\n" ::"n"(128 * kConsumers) : "memory");
      load_x(c + kS - 2);
      tma::Wait(&full[st], (c / kS) & 1);
      wg::Fence();
#pragma unroll
      for (int kk = 0; kk < kBk / 16; ++kk) Mma<NB>(d, wg::KMajorDesc(wtile(st, w), 0, kk), wg::KMajorDesc(xtile(st), 0, kk));
      wg::Commit();
      wg::Wait<1>();
      if (lane == 0 && c > 0) tma::Arrive(&empty[(c - 1) % kS]);
    }
    wg::Wait<0>();
    wg::FenceRegs(d);
    // The ring is drained (every stage consumed): the partial tile goes over it, as
    // red[x row][weight row], weight rows of warpgroup w at 64 w.
    asm volatile("bar.sync 1, %0;\n" ::"n"(128 * kConsumers) : "memory");
    float* red = reinterpret_cast<float*>(base);
    const int g = lane / 4, t = lane % 4, r0 = w * kTile + 16 * (warp % 4) + g;
#pragma unroll
    for (int j = 0; j < NB / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) red[(8 * j + 2 * t + (e & 1)) * kRedStride + r0 + 8 * (e >> 1)] = d[4 * j + e];
  }
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every split's partial tile is in its shared memory

  // The epilogue, spread over the cluster: units of 8 weight rows of one x row, summed over
  // the splits in rank order.
  const int groups = p.swiglu ? kTile / 8 : kConsumers * kTile / 8;
  const int units = p.m * groups;
  const float* red = reinterpret_cast<const float*>(base);
  for (int u = rank * units / split + int(threadIdx.x), end = (rank + 1) * units / split; u < end; u += kThreads) {
    const int r = u / groups, jg = u % groups;
    float v[8] = {}, up[8] = {};
    // The splits' loads issued four at a time before their sums (remote shared memory is a
    // round trip each), summed in rank order.
    auto gather = [&](float(&acc)[8], int off) {
      const uint32_t at = tc::SmemAddr(red + r * kRedStride + off);
#pragma unroll
      for (int q0 = 0; q0 < kMaxSplit; q0 += 4) {
        if (q0 >= split) break;
        float4 a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (q0 + i < split) {
            if (q0 + i == rank) {
              a[i] = LdShared4(at), b[i] = LdShared4(at + 16);
            } else {
              const uint32_t remote = MapRank(at, q0 + i);
              a[i] = LdCluster4(remote), b[i] = LdCluster4(remote + 16);
            }
          }
#pragma unroll
        for (int i = 0; i < 4; ++i)
          if (q0 + i < split) {
            acc[0] += a[i].x, acc[1] += a[i].y, acc[2] += a[i].z, acc[3] += a[i].w;
            acc[4] += b[i].x, acc[5] += b[i].y, acc[6] += b[i].z, acc[7] += b[i].w;
          }
      }
    };
    gather(v, 8 * jg);
    if (p.swiglu) gather(up, kTile + 8 * jg);
    const bool second = !p.swiglu && jg >= kTile / 8;
    const int part = second ? parts[1] : parts[0];
    if (part < 0) continue;
    const GPart& q = p.part[part];
    const int col = (second ? rows0[1] : rows0[0]) + (8 * jg) % kTile, valid = min(8, q.n - col);
    if (valid <= 0) continue;
    if (p.swiglu) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float gt = __bfloat162float(__float2bfloat16_rn(v[e])), ut = __bfloat162float(__float2bfloat16_rn(up[e]));
        v[e] = gt / (1.f + __expf(-gt)) * ut;
      }
    } else {
      const int64_t at = int64_t(r) * q.n + col;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (e < valid) {
          if (q.bias != nullptr) v[e] += __bfloat162float(q.bias[col + e]);
          if (p.residual != nullptr) v[e] += __bfloat162float(p.residual[at + e]);  // (sum + bias) + residual
        }
      }
    }
    bf16* y = q.y + int64_t(r) * q.n + col;
    if (valid == 8 && q.n % 8 == 0) {
      uint4 o;
      __nv_bfloat162* oh = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
      for (int e = 0; e < 4; ++e) oh[e] = __floats2bfloat162_rn(v[2 * e], v[2 * e + 1]);
      *reinterpret_cast<uint4*>(y) = o;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (e < valid) y[e] = __float2bfloat16_rn(v[e]);
    }
  }
  cluster.sync();  // the others' shared memory stays until the epilogue has read it
#else
  __trap();  // Hopper only: launched where HopperPaths()
#endif
}

// RMSNorm of x's rows into xn (rounded to bf16 as kernels/rmsnorm rounds): one block a row.
__global__ void __launch_bounds__(256) NormRows(const bf16* x, const bf16* norm, bf16* xn, int k, float eps) {
  GridDependencyWait();
  GridDependentsLaunch();
  const int r = blockIdx.x, chunks = k / 8;
  const uint4* row = reinterpret_cast<const uint4*>(x) + int64_t(r) * chunks;
  float ss = 0.f;
  for (int c = threadIdx.x; c < chunks; c += 256) {
    const uint4 v = row[c];
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __bfloat1622float2(h[e]);
      ss += f.x * f.x + f.y * f.y;
    }
  }
  const float rs = rsqrtf(BlockReduce<256>(ss, SumOp{}) / k + eps);
  const uint4* nw = reinterpret_cast<const uint4*>(norm);
  uint4* out = reinterpret_cast<uint4*>(xn) + int64_t(r) * chunks;
  for (int c = threadIdx.x; c < chunks; c += 256) {
    const uint4 v = row[c], gv = nw[c];
    uint4 o;
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
    const __nv_bfloat162* wh = reinterpret_cast<const __nv_bfloat162*>(&gv);
    __nv_bfloat162* oh = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __bfloat1622float2(h[e]), gw = __bfloat1622float2(wh[e]);
      oh[e] = __floats2bfloat162_rn(f.x * rs * gw.x, f.y * rs * gw.y);
    }
    out[c] = o;
  }
}

// A [rows, k] bf16 matrix for TMA in 128-byte-swizzled boxes of 64 columns x box_rows rows;
// reads past either bound are zeros.
absl::Status MatrixMap(CUtensorMap* map, const void* base, int64_t rows, int64_t k, int box_rows, const char* name) {
  auto encode = TensorMapEncoder();
  if (encode == nullptr) return absl::InternalError("decode gemm: the driver has no cuTensorMapEncodeTiled");
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(k * 2)};
  const cuuint32_t box[2] = {cuuint32_t(kBk), cuuint32_t(box_rows)}, elem[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box, elem,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return absl::InvalidArgumentError(absl::StrCat("decode gemm: cannot describe ", name, " [", rows, ", ", k,
                                                   "] for TMA (CUresult ", int(r), "; needs a 16-byte aligned base)"));
  return absl::OkStatus();
}

template <int NB>
absl::Status Launch(const GMaps& maps, GParams& p, int ctas, cudaStream_t s) {
  constexpr int kSmem = GSmem<NB>::kBytes;
  if (cudaFuncSetAttribute(DecodeGemm<NB>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) != cudaSuccess)
    return LaunchStatus("decode gemm(smem attribute)");
  // Where the tiles are fewer than the multiprocessors, K splits over a cluster so that
  // the grid has about one CTA a multiprocessor (each the same share of the bytes; a second
  // CTA on some would double their time), every split keeping two slices at least.
  const int sms = SmCount();
  p.split = ctas >= sms ? 1 : std::max(1, std::min({kMaxSplit, sms / ctas, p.chunks / 2}));
  return Launched(LaunchDependentCluster(DecodeGemm<NB>, dim3(unsigned(ctas * p.split)), dim3(kThreads), kSmem, s,
                                         dim3(unsigned(p.split), 1, 1), maps, p),
                  "decode gemm");
}
}  // namespace

bool DecodeGemmCudaSupported(int64_t m, int64_t k, DType t) {
  static const bool off = [] {  // TESSERA_DECODE_GEMM=1 turns it on (slower than cuBLASLt so far)
    const char* e = std::getenv("TESSERA_DECODE_GEMM");
    return e == nullptr || std::string_view(e) != "1";
  }();
  return !off && t == DType::kBF16 && m > kDecodeCudaMaxRows && m <= kDecodeGemmMaxRows && k % 8 == 0 && k <= (int64_t(1) << 24) &&
         HopperPaths() && GSmem<128>::kBytes <= OptinSharedMemory();
}

absl::Status DecodeGemmCuda(const DecodeLinearArgs& a, DType t, void* stream, DeviceScratch* scratch) {
  if (!DecodeGemmCudaSupported(a.m, a.k, t))
    return absl::InvalidArgumentError(absl::StrCat("decode gemm: takes bf16 with k % 8 == 0 and ", kDecodeCudaMaxRows, " < m <= ",
                                                   kDecodeGemmMaxRows, " on Hopper with TESSERA_DECODE_GEMM=1; got m ", a.m, ", k ", a.k));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int nb = a.m <= 32 ? 32 : a.m <= 64 ? 64 : 128;
  ScratchBlock xn(scratch, a.norm != nullptr ? size_t(a.m * a.k) * 2 : 0, s);
  const void* x = a.x;
  if (a.norm != nullptr) {
    if (xn.get() == nullptr) {
      (void)cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrCat("decode gemm: no device memory for the normalized x [", a.m, ", ", a.k, "]"));
    }
    TESSERA_RETURN_IF_ERROR(Launched(LaunchDependent(NormRows, dim3(unsigned(a.m)), dim3(256), 0, s, static_cast<const bf16*>(a.x),
                                                     static_cast<const bf16*>(a.norm), static_cast<bf16*>(xn.get()), int(a.k), a.eps),
                                     "decode gemm(norm)"));
    x = xn.get();
  }
  GMaps maps;
  GParams p = {};
  p.x = static_cast<const bf16*>(x), p.residual = static_cast<const bf16*>(a.residual);
  p.m = int(a.m), p.k = int(a.k), p.chunks = int((a.k + kBk - 1) / kBk), p.parts = a.num_parts, p.swiglu = a.swiglu ? 1 : 0;
  for (int j = 0, end = 0; j < a.num_parts; ++j) {
    const DecodeLinearPart& q = a.parts[j];
    TESSERA_RETURN_IF_ERROR(MatrixMap(&maps.w[j], q.w, q.n, a.k, kTile, "a weight"));
    if (!a.swiglu || j == 0) end += int((q.n + kTile - 1) / kTile);
    p.part[j] = GPart{static_cast<const bf16*>(q.bias), static_cast<bf16*>(q.y), int(q.n), end};
  }
  p.tiles = p.part[a.num_parts - 1].tiles_end;
  const int ctas = a.swiglu ? p.tiles : (p.tiles + kConsumers - 1) / kConsumers;
  if (nb == 32) return Launch<32>(maps, p, ctas, s);
  if (nb == 64) return Launch<64>(maps, p, ctas, s);
  return Launch<128>(maps, p, ctas, s);
}

}  // namespace tessera::kernels
