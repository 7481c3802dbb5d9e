// The decode step's linear layers on CUDA (decode_linear.h): a grid of warps, all resident
// at once, streams the weights. A warp owns tiles of two weight rows (swiglu: a gate row
// and its up row); its lanes read each row in 16-byte chunks (lane l the chunks l, l + 32,
// ...), U of them per row in registers at once, dot them with the block's copy of x in
// shared memory (normalized there once per block when the layer's norm is fused in) and
// accumulate in f32; one reduce-scatter over the warp's shuffles leaves each lane one
// (row, x row) sum, which the epilogue rounds once (bias, residual, or silu(gate) * up) and
// stores. Where rows are long and tiles few (a down projection), two warps of a block share
// each tile's chunks and meet in shared memory.
// Launched as a programmatic dependent: before waiting for the kernel before it, each warp
// loads its first batch of weights into registers and prefetches its next tiles into L2,
// and the block stages the norm's weights (all constants), so the pass over the weights
// starts while the previous kernel drains. After the wait the path to the first store is
// one read of x from L2 (the norm's sums taken from the same read) and the epilogue's
// bias and residual, loaded before the sums that they wait under.
#include <algorithm>

#include "kernels/common/cuda_elem.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/common/phase_probe.cuh"
#include "kernels/decode/decode_linear.h"

PHASE_PROBE_TU(decode_linear)

namespace tessera::kernels {
namespace {
using bf16 = __nv_bfloat16;
constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int64_t kPrefetchBytes = 24 << 20;  // of weights into L2 before the wait (about half of it)

struct Part {
  const bf16 *w, *bias;
  bf16* y;
  int n, tiles_end;  // tiles of this part and those before it
};
struct Params {
  const bf16 *x, *norm, *residual;
  float eps;
  int m, k, parts, swiglu, prefetch_tiles;
  Part part[3];
};

__device__ __forceinline__ float2 Bf2(uint32_t v) {
  return make_float2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

// A tile's part and its first weight row.
__device__ __forceinline__ void TileAt(const Params& p, int tile, int rows_per_tile, int* part, int* row0) {
  int j = 0;
  while (j + 1 < p.parts && !p.swiglu && tile >= p.part[j].tiles_end) ++j;
  *part = j;
  *row0 = (tile - (j == 0 ? 0 : p.part[j - 1].tiles_end)) * rows_per_tile;
}

// The norm's weights into shared memory after x's M rows (sx + M * k / 8): constants,
// loaded before the dependency wait.
template <int M>
__device__ void StageNorm(const Params& p, uint4* sx) {
  if (p.norm == nullptr) return;
  const int chunks = p.k / 8;
  const uint4* nw = reinterpret_cast<const uint4*>(p.norm);
  for (int c = threadIdx.x; c < chunks; c += kThreads) sx[M * chunks + c] = nw[c];
}

// x (RMS-normalized by p.norm when given, rounded to bf16 as kernels/rmsnorm rounds) into
// shared memory: M rows of k / 8 chunks, zeros past p.m. With the norm, warp r reads row r
// once (its sum of squares and its raw copy in shared memory), then every thread scales
// the copy in place: one read of x from L2 on the path after the wait.
template <int M>
__device__ void StageX(const Params& p, uint4* sx) {
  const int chunks = p.k / 8;
  __shared__ float rstd[M];
  const uint4* x = reinterpret_cast<const uint4*>(p.x);
  if (p.norm == nullptr) {
    for (int i = threadIdx.x; i < M * chunks; i += kThreads) {
      const int r = i / chunks, c = i % chunks;
      sx[i] = r < p.m ? x[int64_t(r) * chunks + c] : make_uint4(0, 0, 0, 0);
    }
    return;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < M; r += kWarps) {
    float ss = 0.f;
    if (r < p.m)
      for (int c = lane; c < chunks; c += 32) {
        const uint4 v = x[int64_t(r) * chunks + c];
        sx[r * chunks + c] = v;
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float2 f = Bf2(w[e]);
          ss += f.x * f.x + f.y * f.y;
        }
      }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (lane == 0) rstd[r] = rsqrtf(ss / p.k + p.eps);
  }
  __syncthreads();
  const uint4* nw = sx + M * chunks;
  for (int i = threadIdx.x; i < M * chunks; i += kThreads) {
    const int r = i / chunks, c = i % chunks;
    uint4 o = make_uint4(0, 0, 0, 0);
    if (r < p.m) {
      const uint4 v = sx[i], g = nw[c];
      const float rs = rstd[r];
      const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
      const __nv_bfloat162* wh = reinterpret_cast<const __nv_bfloat162*>(&g);
      __nv_bfloat162* oh = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 f = __bfloat1622float2(h[e]), gw = __bfloat1622float2(wh[e]);
        oh[e] = __floats2bfloat162_rn(f.x * rs * gw.x, f.y * rs * gw.y);
      }
    }
    sx[i] = o;
  }
}

// Reduce-scatter of V (a power of two <= 32) per-lane partial sums over the warp: lane l
// ends with the warp's total of value l >> (5 - log2 V) in v[0].
template <int V>
__device__ __forceinline__ void WarpReduceScatter(float (&v)[V]) {
  const int lane = threadIdx.x % 32;
  int cnt = V;
#pragma unroll
  for (int s = 16; s >= 1; s >>= 1) {
    if (cnt > 1) {
      const int half = cnt / 2;
      const bool upper = (lane & s) != 0;
#pragma unroll
      for (int i = 0; i < V / 2; ++i) {
        if (i >= half) break;
        const float send = upper ? v[i] : v[i + half], keep = upper ? v[i + half] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, s);
      }
      cnt = half;
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], s);
    }
  }
}

// U chunks per lane and row in flight at once: a batch of R * U 16-byte loads is issued,
// then used. The warp's first batch is issued before the dependency wait.
template <int M, int R, int U, int KS>
__global__ void __launch_bounds__(kThreads) DecodeGemv(const Params p) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint4* sx = reinterpret_cast<uint4*>(smem);
  PHASE_DECL
  PHASE(0);
  constexpr int V = R * M, kLog = V == 1 ? 0 : V == 2 ? 1 : V == 4 ? 2 : V == 8 ? 3 : V == 16 ? 4 : 5;
  static_assert(V >= 1 && V <= 32 && (V & (V - 1)) == 0, "R * M: a power of two up to 32");
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, chunks = p.k / 8;
  const int rows_per_tile = p.swiglu ? R / 2 : R;
  // A block takes kWarps / KS tiles at a time; warp w the tile w / KS and the share
  // w % KS of its chunks [c_begin, c_end).
  constexpr int ks = KS;
  const int per_block = kWarps / ks, kp = warp % ks;
  const int share = (chunks + ks - 1) / ks, c_begin = KS == 1 ? 0 : min(chunks, kp * share),
            c_end = KS == 1 ? chunks : min(chunks, c_begin + share);
  const int total = p.part[p.parts - 1].tiles_end, first = blockIdx.x * per_block + warp / ks, stride = gridDim.x * per_block;
  __shared__ float partial[KS > 1 ? kWarps : 1][32];  // the other shares' sums
  const uint4* w[R];
  bool ok[R];
  int part = 0, row0 = 0;
  auto start_tile = [&](int t) {
    TileAt(p, t, rows_per_tile, &part, &row0);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int j = p.swiglu ? (r < R / 2 ? 0 : 1) : part, row = row0 + (p.swiglu ? r % (R / 2) : r);
      ok[r] = row < p.part[j].n;
      w[r] = reinterpret_cast<const uint4*>(p.part[j].w) + int64_t(ok[r] ? row : 0) * chunks;
    }
  };
  uint4 wv[U][R];
  auto load = [&](int c0) {  // the batch of chunks c0 + lane + 32 u
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + lane + 32 * u;
#pragma unroll
      for (int r = 0; r < R; ++r) wv[u][r] = ok[r] && c < c_end ? __ldcs(w[r] + c) : make_uint4(0, 0, 0, 0);
    }
  };
  // The weights are constants: the first batch into registers, and further tiles into
  // L2, before waiting for the kernel that writes x.
  if (first < total) start_tile(first), load(c_begin);
  if (lane == 0 && kp == 0)
    for (int t = first + stride; t < p.prefetch_tiles; t += stride) {
      int tp, r0;
      TileAt(p, t, rows_per_tile, &tp, &r0);
      for (int h = 0; h < (p.swiglu ? 2 : 1); ++h) {
        const int j = p.swiglu ? h : tp, rows = min(rows_per_tile, p.part[j].n - r0);
        if (rows > 0) PrefetchL2(reinterpret_cast<const uint4*>(p.part[j].w) + int64_t(r0) * chunks, unsigned(rows * chunks) * 16u);
      }
    }
  StageNorm<M>(p, sx);
  PHASE(1);
  GridDependencyWait();
  GridDependentsLaunch();
  PHASE(2);
  StageX<M>(p, sx);
  __syncthreads();
  PHASE(3);

  const int idx = lane >> (5 - kLog), out_r = idx / M, out_mi = idx % M;  // the (row, x row) this lane ends with
  const bool writer = (lane & ((1 << (5 - kLog)) - 1)) == 0;
  // Every warp of a block runs the same iterations (the shares meet in shared memory).
  for (int t0 = first - warp / ks; t0 < total; t0 += stride) {
    const int t = t0 + warp / ks;
    const bool active = t < total;
    if (ks == 1 && !active) break;
    if (t != first && active) start_tile(t), load(c_begin);
    // The epilogue's bias and residual, loaded now: their latency passes under the sums.
    float bias = 0.f, res = 0.f;
    if (!p.swiglu) {
      const Part& q = p.part[part];
      const int row = row0 + out_r;
      if (active && writer && kp == 0 && out_mi < p.m && row < q.n) {
        if (q.bias != nullptr) bias = __bfloat162float(q.bias[row]);
        if (p.residual != nullptr) res = __bfloat162float(p.residual[int64_t(out_mi) * q.n + row]);
      }
    }
    float acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0.f;
    for (int c0 = c_begin; active && c0 < c_end; c0 += 32 * U) {
      if (c0 > c_begin) load(c0);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + lane + 32 * u;
        if (c >= c_end) break;
#pragma unroll
        for (int mi = 0; mi < M; ++mi) {
          const uint4 xv = sx[mi * chunks + c];
          const float2 x0 = Bf2(xv.x), x1 = Bf2(xv.y), x2 = Bf2(xv.z), x3 = Bf2(xv.w);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            const float2 w0 = Bf2(wv[u][r].x), w1 = Bf2(wv[u][r].y), w2 = Bf2(wv[u][r].z), w3 = Bf2(wv[u][r].w);
            float a = acc[r * M + mi];
            a = fmaf(w0.x, x0.x, a), a = fmaf(w0.y, x0.y, a), a = fmaf(w1.x, x1.x, a), a = fmaf(w1.y, x1.y, a);
            a = fmaf(w2.x, x2.x, a), a = fmaf(w2.y, x2.y, a), a = fmaf(w3.x, x3.x, a), a = fmaf(w3.y, x3.y, a);
            acc[r * M + mi] = a;
          }
        }
      }
    }
    WarpReduceScatter<V>(acc);
    if constexpr (KS > 1) {  // the tile's first warp adds the other shares' sums, in share order
      partial[warp][lane] = acc[0];
      __syncthreads();
      if (kp == 0)
        for (int j = 1; j < ks; ++j) acc[0] += partial[warp + j][lane];
      __syncthreads();  // partial is rewritten next iteration
      if (kp != 0 || !active) continue;
    }
    const int r = out_r, mi = out_mi;
    if (p.swiglu) {
      const float up = __shfl_down_sync(0xffffffffu, acc[0], 16);  // value idx + V / 2: the up row of this gate row
      const int row = row0 + r;
      if (writer && r < R / 2 && mi < p.m && row < p.part[0].n) {
        const float g = __bfloat162float(__float2bfloat16_rn(acc[0])), u = __bfloat162float(__float2bfloat16_rn(up));
        p.part[0].y[int64_t(mi) * p.part[0].n + row] = __float2bfloat16_rn(g / (1.f + __expf(-g)) * u);
      }
    } else {
      const Part& q = p.part[part];
      const int row = row0 + r;
      if (writer && mi < p.m && row < q.n) {
        q.y[int64_t(mi) * q.n + row] = __float2bfloat16_rn(acc[0] + bias + res);  // (sum + bias) + residual
      }
    }
  }
  PHASE_END(10 * M + KS + (p.swiglu ? 5 : 0) + (p.norm != nullptr ? 100 : 0) + (p.residual != nullptr ? 200 : 0));
}

// The rows of x a kernel instance stages (its M; zeros past m), the norm's weights after them.
int64_t KernelRows(int64_t m) { return m <= 2 ? m : 4; }

// An instantiation's resident blocks per multiprocessor at the largest x (0: the
// shared-memory attribute was refused).
template <int M, int R, int U, int KS>
int BlocksPerSm() {
  static const int per_sm = [] {
    if (cudaFuncSetAttribute(DecodeGemv<M, R, U, KS>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kDecodeMaxXBytes)) !=
        cudaSuccess)
      return 0;
    int n = 0;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, DecodeGemv<M, R, U, KS>, kThreads, 0) == cudaSuccess && n >= 1 ? n : 1;
  }();
  return per_sm;
}

// Blocks of an instantiation that fit at once beside this x (all resident: no second wave).
template <int M, int R, int U, int KS>
int Fit(size_t smem) {
  return std::max(1, std::min(BlocksPerSm<M, R, U, KS>(), int((227 * 1024) / std::max<size_t>(smem + 1024, 1))));
}

template <int M, int R, int U, int KS>
absl::Status LaunchKs(Params& p, int tiles, size_t smem, cudaStream_t s) {
  if (BlocksPerSm<M, R, U, KS>() == 0) return LaunchStatus("decode linear (shared memory)");
  const int per_block = kWarps / KS;
  const int blocks = std::max(1, std::min((tiles + per_block - 1) / per_block, SmCount() * Fit<M, R, U, KS>(smem)));
  const int64_t tile_bytes = int64_t(R) * p.k * 2;
  p.prefetch_tiles = int(std::min<int64_t>(tiles, kPrefetchBytes / tile_bytes));
  return Launched(LaunchDependent(DecodeGemv<M, R, U, KS>, dim3(blocks), dim3(kThreads), smem, s, p), "decode linear");
}

template <int M, int R, int U>
absl::Status Launch(Params& p, cudaStream_t s) {
  const int rows_per_tile = p.swiglu ? R / 2 : R;
  for (int j = 0, end = 0; j < p.parts; ++j) {
    if (!p.swiglu || j == 0) end += (p.part[j].n + rows_per_tile - 1) / rows_per_tile;
    p.part[j].tiles_end = end;
  }
  const int tiles = p.part[p.parts - 1].tiles_end;
  const size_t smem = size_t(M + (p.norm != nullptr ? 1 : 0)) * p.k * 2;  // x's rows (and the norm's weights)
  // Long rows over few tiles (a down projection): two warps share each tile's chunks, so
  // each makes half the passes of U chunks — every pass a memory round trip — where the
  // warps that takes are all resident at once.
  const int batches = (p.k / 8 + 32 * U - 1) / (32 * U);
  if (BlocksPerSm<M, R, U, 2>() > 0 && batches >= 2 && int64_t(tiles) * 2 <= int64_t(SmCount()) * Fit<M, R, U, 2>(smem) * kWarps)
    return LaunchKs<M, R, U, 2>(p, tiles, smem, s);
  return LaunchKs<M, R, U, 1>(p, tiles, smem, s);
}
}  // namespace

bool DecodeLinearCudaSupported(int64_t m, int64_t k, DType t) {
  if (m > kDecodeCudaMaxRows) return DecodeGemmCudaSupported(m, k, t);
  return t == DType::kBF16 && m >= 1 && m <= kDecodeCudaMaxRows && k % 8 == 0 && k <= (int64_t(1) << 20) &&
         (KernelRows(m) + 1) * k * 2 <= kDecodeMaxXBytes;
}

absl::Status DecodeLinearCuda(const DecodeLinearArgs& a, DType t, void* stream, DeviceScratch* scratch) {
  if (auto s = CheckDecodeLinear(a); !s.ok()) return s;
  if (a.m > kDecodeCudaMaxRows) return DecodeGemmCuda(a, t, stream, scratch);  // it says what it does not take
  if (!DecodeLinearCudaSupported(a.m, a.k, t))
    return absl::InvalidArgumentError(absl::StrCat("decode linear: CUDA takes bf16 with k % 8 == 0, m <= ", kDecodeCudaMaxRows,
                                                   " and (m rounded up to 1, 2 or 4, plus 1) * k * 2 <= ", kDecodeMaxXBytes,
                                                   " bytes; got m ", a.m, ", k ", a.k));
  Params p = {};
  p.x = static_cast<const bf16*>(a.x), p.norm = static_cast<const bf16*>(a.norm);
  p.residual = static_cast<const bf16*>(a.residual);
  p.eps = a.eps, p.m = int(a.m), p.k = int(a.k), p.parts = a.num_parts, p.swiglu = a.swiglu ? 1 : 0;
  for (int j = 0; j < a.num_parts; ++j) {
    p.part[j].w = static_cast<const bf16*>(a.parts[j].w), p.part[j].bias = static_cast<const bf16*>(a.parts[j].bias);
    p.part[j].y = static_cast<bf16*>(a.parts[j].y), p.part[j].n = int(a.parts[j].n);
  }
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  // Tiles of two rows (swiglu: a gate row and its up row); a lane keeps 8 chunks per row in
  // flight (4 at four rows of x).
  if (a.m == 1) return Launch<1, 2, 8>(p, s);
  if (a.m == 2) return Launch<2, 2, 8>(p, s);
  return Launch<4, 2, 4>(p, s);
}

}  // namespace tessera::kernels
