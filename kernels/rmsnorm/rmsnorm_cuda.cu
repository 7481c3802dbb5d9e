// RMSNorm on CUDA: one block per row, f32 accumulation, warp-shuffle reductions.
// Backward: bf16 rows of up to 2048 (multiple of 256) run a warp per row for dx, with
// the next rows prefetched into shared memory by bulk copies, and per-CTA column
// partials for dw summed in shared memory and then by a second kernel (deterministic);
// others accumulate dw with atomics.
#include "common/status.h"
#include "kernels/common/cuda_elem.cuh"
#include "kernels/common/pdl.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/rmsnorm/rmsnorm.h"

#include <algorithm>
#include <cstdint>

namespace tessera::kernels {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float BlockSum(float v) { return BlockReduce<kThreads>(v, SumOp()); }

template <typename T>
__global__ void Forward(const T* x, const T* w, T* y, float* rstd, int64_t cols, float eps) {
  const T* xr = x + blockIdx.x * cols;
  float ss = 0;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    float v = ToF(xr[c]);
    ss += v * v;
  }
  float rs = rsqrtf(BlockSum(ss) / cols + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = rs;
  T* yr = y + blockIdx.x * cols;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) yr[c] = FromF<T>(ToF(xr[c]) * rs * ToF(w[c]));
}

template <typename T>
__global__ void Backward(const T* dy, const T* x, const T* w, const float* rstd, T* dx, float* dw, int64_t cols,
                         const T* add) {
  const int64_t off = blockIdx.x * cols;
  const float rs = rstd[blockIdx.x];
  float dot = 0;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) dot += ToF(dy[off + c]) * ToF(w[c]) * ToF(x[off + c]);
  float coef = rs * rs * rs * BlockSum(dot) / cols;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    float g = ToF(dy[off + c]), xv = ToF(x[off + c]);
    const float v = rs * g * ToF(w[c]) - xv * coef;
    dx[off + c] = FromF<T>(add != nullptr ? v + ToF(add[off + c]) : v);
    atomicAdd(&dw[c], g * xv * rs);
  }
}

// 8 bf16 values in one 16-byte vector.
__device__ __forceinline__ float SumSqBf16x8(const uint4& x) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&x);
  float ss = 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float2 f = __bfloat1622float2(h[j]);
    ss += f.x * f.x + f.y * f.y;
  }
  return ss;
}
__device__ __forceinline__ uint4 NormalizeBf16x8(const uint4& x, const uint4& w, float rs) {
  uint4 out;
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&x);
  const __nv_bfloat162* wh = reinterpret_cast<const __nv_bfloat162*>(&w);
  __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    float2 f = __bfloat1622float2(h[j]), g = __bfloat1622float2(wh[j]);
    o[j] = __floats2bfloat162_rn(f.x * rs * g.x, f.y * rs * g.y);
  }
  return out;
}

// bf16 rows with cols % 8 == 0 and cols <= 256 * 8 * kMaxVec: each thread loads its
// 16-byte vectors once, keeps them in registers for the second pass, writes 16 bytes.
constexpr int kMaxVec = 4;
__global__ void ForwardVecBf16(const uint4* x, const uint4* w, uint4* y, float* rstd, int64_t cols, float eps) {
  const int64_t nvec = cols / 8;
  const uint4* xr = x + blockIdx.x * nvec;
  uint4 v[kMaxVec];
  float ss = 0;
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
    int64_t i = threadIdx.x + int64_t(k) * kThreads;
    if (i < nvec) {
      v[k] = xr[i];
      ss += SumSqBf16x8(v[k]);
    }
  }
  float rs = rsqrtf(BlockSum(ss) / cols + eps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = rs;
  uint4* yr = y + blockIdx.x * nvec;
#pragma unroll
  for (int k = 0; k < kMaxVec; ++k) {
    int64_t i = threadIdx.x + int64_t(k) * kThreads;
    if (i < nvec) {
      yr[i] = NormalizeBf16x8(v[k], w[i], rs);
    }
  }
}

// bf16 rows with cols % 256 == 0 and cols <= 32 * 8 * kWarpVec: one warp per row, 8
// rows per block, each lane issues all its 16-byte loads before the first use and the
// reduction is warp shuffles only (no block barriers between load and store).
constexpr int kWarpVec = 16;
template <int kVec>
__global__ void ForwardWarpRowBf16(const uint4* x, const uint4* w, uint4* y, float* rstd, int64_t rows, int64_t cols,
                                   float eps) {
  const int64_t row = blockIdx.x * int64_t(kThreads / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  if (row >= rows) return;
  const int64_t nvec = cols / 8;
  const uint4* xr = x + row * nvec;
  uint4 v[kVec];
  float ss = 0;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    int64_t i = lane + 32 * k;
    if (i < nvec) v[k] = xr[i];
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    int64_t i = lane + 32 * k;
    if (i < nvec) {
      ss += SumSqBf16x8(v[k]);
    }
  }
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffff, ss, o);
  const float rs = rsqrtf(ss / cols + eps);
  if (lane == 0) rstd[row] = rs;
  uint4* yr = y + row * nvec;
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    int64_t i = lane + 32 * k;
    if (i < nvec) {
      yr[i] = NormalizeBf16x8(v[k], w[i], rs);
    }
  }
}

// Backward, bf16 rows with cols % 256 == 0 and cols <= 32 * 8 * kBwdVec. A CTA owns a
// run of consecutive rows, a warp per row at a time. The op is DRAM-latency-bound when
// each warp only loads the row it works on (ncu: long-scoreboard stalls, DRAM 58% busy),
// so lane 0 of each warp keeps the warp's next kBwdBufs rows of x and dy streaming into
// shared memory with bulk copies (cp.async.bulk on an mbarrier per buffer): the bytes in
// flight no longer cost registers. Per row: dx from dot(dy w, x) by warp shuffles, and
// dy x rstd added into the warp's own dw row in shared memory (a lane owns the same
// columns in every row: no atomics, no barrier). At the end the CTA sums its warps' dw
// rows into its partial; DwReduce adds the partials (the same order every run). Both are
// programmatic dependent launches (ncu, H200: row kernel 56 us, DwReduce 3.4 us; the
// overlap took the op from 0.067 to 0.060 ms), and dw needs no memset.
// Warps per CTA and row buffers per warp. The defaults are the fastest of sweeps
// (bench/variants, H200, 16384 x 2048; without PDL): 8 warps x 1 buffer
// 3.01 TB/s; 8 x 2: 2.62-2.66; 4 x 1, 6 x 1, 12 x 1: 2.65-2.70; 4 x 2, 4 x 3, 2 x 3, 2 x 4:
// 2.43-2.78; without prefetch (rows loaded into registers): 2.70-2.82. With
// PDL: 8 x 1 3.30-3.36 TB/s; 6 x 1 / 12 x 1 2.8-2.9; dw in registers instead of shared
// rows (refill after the row, 2-4 buffers, 3-12 warps): 2.58-3.13; the partials summed in
// the same kernel after a cooperative grid barrier: 3.11. Overridable for such sweeps.
#ifndef TESSERA_RMS_BWD_WARPS
#define TESSERA_RMS_BWD_WARPS 8
#endif
#ifndef TESSERA_RMS_BWD_BUFS
#define TESSERA_RMS_BWD_BUFS 1
#endif
#ifndef TESSERA_RMS_BWD_PDL
#define TESSERA_RMS_BWD_PDL 1
#endif
#ifndef TESSERA_RMS_BWD_RCOLS
#define TESSERA_RMS_BWD_RCOLS 16
#endif
constexpr int kBwdVec = 8, kBwdWarps = TESSERA_RMS_BWD_WARPS, kBwdBufs = TESSERA_RMS_BWD_BUFS;
constexpr bool kBwdPdl = TESSERA_RMS_BWD_PDL != 0;  // the row kernel, too, is a dependent launch
constexpr int kReduceCols = TESSERA_RMS_BWD_RCOLS;   // DwReduce: columns per CTA (x 32 rows of threads)
// Shared memory: per warp kBwdBufs x (x row, dy row) in bf16, then per warp a dw row in
// f32, then the mbarriers.
inline size_t BwdSmemBytes(int64_t cols) {
  return size_t(kBwdWarps) * kBwdBufs * 2 * cols * 2 + size_t(kBwdWarps) * cols * 4 + kBwdWarps * kBwdBufs * 8;
}
__global__ void __launch_bounds__(kBwdWarps * 32) BackwardWarpRowBf16(const uint4* dy, const uint4* x, const uint4* w,
                                                                      const float* rstd, uint4* dx, float* partial,
                                                                      int64_t rows, int64_t cols, int rows_per_cta,
                                                                      const uint4* add) {
#if TESSERA_SM90A
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, nvec = static_cast<int>(cols / 8);
  const uint32_t row_bytes = static_cast<uint32_t>(cols * 2);
  uint4* const bufs = reinterpret_cast<uint4*>(smem_raw) + warp * kBwdBufs * 2 * nvec;  // [buf][x | dy][nvec]
  float4* const mine = reinterpret_cast<float4*>(smem_raw + size_t(kBwdWarps) * kBwdBufs * 2 * row_bytes) + warp * (cols / 4);
  uint64_t* const bars = reinterpret_cast<uint64_t*>(reinterpret_cast<char*>(mine - warp * (cols / 4)) + kBwdWarps * cols * 4) +
                         warp * kBwdBufs;
  for (int i = lane; i < nvec; i += 32) mine[2 * i] = mine[2 * i + 1] = make_float4(0.f, 0.f, 0.f, 0.f);
  const int64_t row0 = blockIdx.x * int64_t(rows_per_cta);
  const int64_t row_end = rows < row0 + rows_per_cta ? rows : row0 + rows_per_cta;
  const int my_rows = row0 + warp < row_end ? static_cast<int>((row_end - row0 - warp + kBwdWarps - 1) / kBwdWarps) : 0;
  auto fetch = [&](int i) {  // lane 0: this warp's i-th row into buffer i % kBwdBufs
    const int b = i % kBwdBufs;
    const int64_t row = row0 + warp + int64_t(i) * kBwdWarps;
    tma::ArriveExpectTx(bars + b, 2 * row_bytes);
    tma::BulkLoad(bufs + b * 2 * nvec, x + row * nvec, row_bytes, bars + b);
    tma::BulkLoad(bufs + b * 2 * nvec + nvec, dy + row * nvec, row_bytes, bars + b);
  };
  // Launched as a dependent (PDL), the start above overlaps the previous kernel's tail;
  // nothing global is read or written before the previous grid is complete.
  GridDependencyWait();
  if (lane == 0) {
    for (int b = 0; b < kBwdBufs; ++b) tma::BarInit(bars + b, 1);
    tma::FenceBarrierInit();
    for (int i = 0; i < kBwdBufs && i < my_rows; ++i) fetch(i);
  }
  __syncwarp();
  for (int i = 0; i < my_rows; ++i) {
    const int64_t row = row0 + warp + int64_t(i) * kBwdWarps;
    const int b = i % kBwdBufs;
    const float rs = rstd[row];
    // The residual's gradient (add) for this row, loaded before any of the row's stores
    // (add may be dx itself) and ahead of the wait, so its latency hides there: loaded
    // beside each store it cost a dependent round trip per vector (H100:
    // 33.9 us a call for the 1B's 4096 x 2048 against ~19 without add).
    uint4 res[kBwdVec];
#pragma unroll
    for (int k = 0; k < kBwdVec; ++k) {
      const int v = lane + 32 * k;
      res[k] = add != nullptr && v < nvec ? __ldcs(add + row * nvec + v) : make_uint4(0, 0, 0, 0);
    }
    tma::Wait(bars + b, (i / kBwdBufs) & 1);
    uint4 xv[kBwdVec], gv[kBwdVec];
#pragma unroll
    for (int k = 0; k < kBwdVec; ++k) {
      const int v = lane + 32 * k;
      if (v < nvec) xv[k] = bufs[b * 2 * nvec + v], gv[k] = bufs[b * 2 * nvec + nvec + v];
    }
    __syncwarp();  // every lane has read buffer b: it may be refilled
    if (lane == 0 && i + kBwdBufs < my_rows) fetch(i + kBwdBufs);
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < kBwdVec; ++k) {
      if (lane + 32 * k >= nvec) break;
      const uint4 wq = __ldg(w + lane + 32 * k);
      const __nv_bfloat162 *x2 = reinterpret_cast<const __nv_bfloat162*>(&xv[k]),
                          *g2 = reinterpret_cast<const __nv_bfloat162*>(&gv[k]),
                          *w2 = reinterpret_cast<const __nv_bfloat162*>(&wq);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 xf = __bfloat1622float2(x2[j]), gf = __bfloat1622float2(g2[j]), wf = __bfloat1622float2(w2[j]);
        dot += gf.x * wf.x * xf.x + gf.y * wf.y * xf.y;
      }
    }
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffff, dot, o);
    const float coef = rs * rs * rs * dot / cols;
#pragma unroll
    for (int k = 0; k < kBwdVec; ++k) {
      const int i8 = lane + 32 * k;
      if (i8 >= nvec) break;
      const uint4 wq = __ldg(w + i8);
      const __nv_bfloat162 *x2 = reinterpret_cast<const __nv_bfloat162*>(&xv[k]),
                          *g2 = reinterpret_cast<const __nv_bfloat162*>(&gv[k]),
                          *w2 = reinterpret_cast<const __nv_bfloat162*>(&wq);
      uint4 out;
      const __nv_bfloat162* r2 = reinterpret_cast<const __nv_bfloat162*>(&res[k]);  // zeros without add
      __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(&out);
      float d[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 xf = __bfloat1622float2(x2[j]), gf = __bfloat1622float2(g2[j]), wf = __bfloat1622float2(w2[j]),
                     rf = __bfloat1622float2(r2[j]);
        o2[j] = __floats2bfloat162_rn(rs * gf.x * wf.x - xf.x * coef + rf.x, rs * gf.y * wf.y - xf.y * coef + rf.y);
        d[2 * j] = gf.x * xf.x * rs;
        d[2 * j + 1] = gf.y * xf.y * rs;
      }
      __stcs(dx + row * nvec + i8, out);
      float4 a = mine[2 * i8], c = mine[2 * i8 + 1];
      a.x += d[0], a.y += d[1], a.z += d[2], a.w += d[3];
      c.x += d[4], c.y += d[5], c.z += d[6], c.w += d[7];
      mine[2 * i8] = a, mine[2 * i8 + 1] = c;
    }
  }
  __syncthreads();
  GridDependentsLaunch();
  const float* all = reinterpret_cast<const float*>(smem_raw + size_t(kBwdWarps) * kBwdBufs * 2 * row_bytes);
  for (int c = threadIdx.x; c < cols; c += kBwdWarps * 32) {
    float sum = 0.f;
#pragma unroll
    for (int k = 0; k < kBwdWarps; ++k) sum += all[k * cols + c];
    partial[blockIdx.x * cols + c] = sum;
  }
#else
  __trap();  // bulk copies and mbarriers: Hopper only, launched where HopperPaths()
#endif
}

// dw[c] = sum over the CTAs' partials: a CTA per kReduceCols columns, 32 rows of threads
// each summing every 32nd partial (coalesced rows, several loads in flight per thread),
// combined in shared memory in a fixed order.
__global__ void __launch_bounds__(32 * kReduceCols) DwReduce(const float* partial, int blocks, int64_t cols, float* dw) {
  __shared__ float acc[32][kReduceCols + 1];
  GridDependencyWait();  // launched early (PDL): the partials are complete after this
  const int tx = threadIdx.x % kReduceCols, ty = threadIdx.x / kReduceCols;
  const int64_t c = blockIdx.x * int64_t(kReduceCols) + tx;
  float s = 0.f;
  if (c < cols) {
#pragma unroll 4
    for (int b = ty; b < blocks; b += 32) s += partial[b * cols + c];
  }
  acc[ty][tx] = s;
  __syncthreads();
  if (ty == 0 && c < cols) {
    float t = 0.f;
#pragma unroll
    for (int k = 0; k < 32; ++k) t += acc[k][tx];
    dw[c] = t;
  }
}

bool Aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

}  // namespace

absl::Status RmsNormForwardCuda(const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t cols, float eps,
                                DType t, void* stream) {
  if (rows == 0) return absl::OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  // A warp per row where there are rows to fill the GPU with blocks of 8; fewer rows (a
  // decode step's) take a block each.
  const bool many_rows = rows >= int64_t(kThreads / 32) * SmCount();
  if (many_rows && t == DType::kBF16 && cols % 256 == 0 && cols <= 32 * 8 * kWarpVec && Aligned16(x) && Aligned16(w) &&
      Aligned16(y)) {
    const unsigned blocks = static_cast<unsigned>((rows + kThreads / 32 - 1) / (kThreads / 32));
    auto xv = static_cast<const uint4*>(x);
    auto wv = static_cast<const uint4*>(w);
    auto yv = static_cast<uint4*>(y);
    if (cols <= 32 * 8 * 8) ForwardWarpRowBf16<8><<<blocks, kThreads, 0, s>>>(xv, wv, yv, rstd, rows, cols, eps);
    else ForwardWarpRowBf16<kWarpVec><<<blocks, kThreads, 0, s>>>(xv, wv, yv, rstd, rows, cols, eps);
    return LaunchStatus("rmsnorm_forward");
  }
  if (t == DType::kBF16 && cols % 8 == 0 && cols <= int64_t(kThreads) * 8 * kMaxVec && Aligned16(x) && Aligned16(w) &&
      Aligned16(y)) {
    ForwardVecBf16<<<rows, kThreads, 0, s>>>(static_cast<const uint4*>(x), static_cast<const uint4*>(w),
                                             static_cast<uint4*>(y), rstd, cols, eps);
    return LaunchStatus("rmsnorm_forward");
  }
  if (t == DType::kF32)
    Forward<<<rows, kThreads, 0, s>>>(static_cast<const float*>(x), static_cast<const float*>(w), static_cast<float*>(y), rstd, cols, eps);
  else
    Forward<<<rows, kThreads, 0, s>>>(static_cast<const __nv_bfloat16*>(x), static_cast<const __nv_bfloat16*>(w),
                                      static_cast<__nv_bfloat16*>(y), rstd, cols, eps);
  return LaunchStatus("rmsnorm_forward");
}

absl::Status RmsNormBackwardCuda(const void* dy, const void* x, const void* w, const float* rstd, void* dx, float* dw,
                                 int64_t rows, int64_t cols, DType t, void* stream, const void* add) {
  auto s = static_cast<cudaStream_t>(stream);
  using bf = __nv_bfloat16;
  if (rows > 0 && HopperPaths() && t == DType::kBF16 && cols % 256 == 0 && cols <= 32 * 8 * kBwdVec && Aligned16(dy) && Aligned16(x) &&
      Aligned16(w) && Aligned16(dx) && Aligned16(add)) {
    // As many CTAs as fit on the device at once (by shared memory), each owning a run of
    // rows; DwReduce writes every dw column, so dw needs no memset here.
    auto* kernel = BackwardWarpRowBf16;
    const size_t smem = BwdSmemBytes(cols);
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) != cudaSuccess)
      return LaunchStatus("rmsnorm_backward(smem)");
    int per_sm = 1;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kBwdWarps * 32, smem) != cudaSuccess || per_sm < 1)
      per_sm = 1;
    const int64_t slots = int64_t(SmCount()) * per_sm;
    const int64_t per = std::max<int64_t>(kBwdWarps, (rows + slots - 1) / slots);
    const int blocks = static_cast<int>((rows + per - 1) / per);
    float* partial = nullptr;
    if (cudaMallocAsync(&partial, blocks * cols * sizeof(float), s) != cudaSuccess) return LaunchStatus("rmsnorm_backward(alloc)");
    const uint4 *dyv = static_cast<const uint4*>(dy), *xv = static_cast<const uint4*>(x), *wv = static_cast<const uint4*>(w);
    uint4* dxv = static_cast<uint4*>(dx);
    const int per_cta = static_cast<int>(per);
    // Both kernels are programmatic dependent launches: each may start while the kernel
    // before it finishes (the row kernel's set-up, DwReduce's launch) and waits for it with
    // griddepcontrol.wait before touching its data; the row kernel's CTAs signal once their
    // rows are done.
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    auto launch = [&]() -> absl::Status {
      cfg.gridDim = dim3(static_cast<unsigned>(blocks));
      cfg.blockDim = dim3(kBwdWarps * 32);
      cfg.dynamicSmemBytes = smem;
      attr[0].val.programmaticStreamSerializationAllowed = kBwdPdl ? 1 : 0;
      cudaLaunchKernelEx(&cfg, kernel, dyv, xv, wv, rstd, dxv, static_cast<float*>(partial), rows, cols, per_cta,
                         static_cast<const uint4*>(add));
      TESSERA_RETURN_IF_ERROR(LaunchStatus("rmsnorm_backward"));
      cfg.gridDim = dim3(static_cast<unsigned>((cols + kReduceCols - 1) / kReduceCols));
      cfg.blockDim = dim3(32 * kReduceCols);
      cfg.dynamicSmemBytes = 0;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      const float* cpartial = partial;
      cudaLaunchKernelEx(&cfg, DwReduce, cpartial, blocks, cols, dw);
      return LaunchStatus("rmsnorm_backward(dw)");
    };
    const absl::Status st = launch();
    cudaFreeAsync(partial, s);
    return st;
  }
  if (cudaMemsetAsync(dw, 0, cols * sizeof(float), s) != cudaSuccess) return LaunchStatus("rmsnorm_backward(memset)");
  if (rows == 0) return absl::OkStatus();
  if (t == DType::kF32)
    Backward<<<rows, kThreads, 0, s>>>(static_cast<const float*>(dy), static_cast<const float*>(x), static_cast<const float*>(w),
                                       rstd, static_cast<float*>(dx), dw, cols, static_cast<const float*>(add));
  else
    Backward<<<rows, kThreads, 0, s>>>(static_cast<const bf*>(dy), static_cast<const bf*>(x), static_cast<const bf*>(w), rstd,
                                       static_cast<bf*>(dx), dw, cols, static_cast<const bf*>(add));
  return LaunchStatus("rmsnorm_backward");
}

}  // namespace tessera::kernels
