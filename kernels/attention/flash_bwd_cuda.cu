// Flash-attention backward (FlashAttention-2 scheme) with bf16 mma.sync tensor cores.
// One CTA = 8 warps = a tile of 128 keys of one kv head; warp w owns keys 16w..16w+15
// and accumulates their dK and dV in registers over every query head of the GQA group
// and every query tile that sees them (so GQA needs no extra reduction). Per query tile
// (64 queries, double-buffered through cp.async):
//   S^T  = K Q^T            P^T  = exp(S^T * scale - lse)        (masked)
//   dV  += P^T dO           dP^T = V dO^T
//   dS^T = P^T (dP^T - D)   dK  += dS^T Q
//   dQ  += dS K             (dS^T staged in shared memory; f32 atomics into dq_acc)
// with D = rowsum(dO * O) precomputed. dK is scaled at the end; dq_acc is scaled by the
// caller.
#include "kernels/attention/flash_cuda.h"
#include "kernels/common/cuda_elem.cuh"
#include "kernels/common/tensor_core.cuh"

namespace tessera::kernels::flash {
namespace {
using bf16 = __nv_bfloat16;
constexpr float kLog2e = 1.4426950408889634f;
constexpr int kWarps = 8, kThreads = kWarps * 32, kBc = kWarps * 16, kBr = 64;

struct BwdParams {
  const bf16 *q, *k, *v, *dout;
  const float *lse, *dvec;
  float* dq_acc;
  bf16 *dk, *dv;
  const int32_t* cu;
  const int2* table;
  int hq, hkv;
  float scale;
};

template <int D>
constexpr int BwdSmemBytes() {
  return (2 * kBc * D + 4 * kBr * D + kBc * kBr) * 2 + 4 * kBr * 4;
}

template <int D, bool kCausal>
__global__ void __launch_bounds__(kThreads) BwdKernel(BwdParams p) {
  constexpr int kKSteps = D / 16, kNTiles = kBr / 8, kDTiles = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* base = reinterpret_cast<bf16*>(smem);
  const tc::SwizzledTile<D> sK{base}, sV{base + kBc * D};
  bf16* const q_bufs = base + 2 * kBc * D;  // [2][kBr][D], then dO [2][kBr][D]
  auto sQ = [&](int buf) { return tc::SwizzledTile<D>{q_bufs + buf * kBr * D}; };
  auto sdO = [&](int buf) { return tc::SwizzledTile<D>{q_bufs + (2 + buf) * kBr * D}; };
  const tc::SwizzledTile<kBr> sdS{base + 2 * kBc * D + 4 * kBr * D};
  float* sL = reinterpret_cast<float*>(base + 2 * kBc * D + 4 * kBr * D + kBc * kBr);  // [2][kBr] lse * log2e
  float* sD = sL + 2 * kBr;                                                             // [2][kBr] rowsum(dO O)

  const int2 tile = p.table[blockIdx.x];
  if (tile.x < 0) return;
  const int kvh = blockIdx.y, group = p.hq / p.hkv;
  const int start = p.cu[tile.x], len = p.cu[tile.x + 1] - start, n0 = tile.y * kBc;
  const int64_t q_stride = int64_t(p.hq) * D, kv_stride = int64_t(p.hkv) * D;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int mi = lane / 8, mr = lane % 8;
  const float sl2 = p.scale * kLog2e;

  tc::LoadTileAsync<kBc, D, kThreads>(sK, p.k + (int64_t(start) + n0) * kv_stride + kvh * D, kv_stride, len - n0);
  tc::LoadTileAsync<kBc, D, kThreads>(sV, p.v + (int64_t(start) + n0) * kv_stride + kvh * D, kv_stride, len - n0);

  const int m_first = kCausal ? n0 / kBr : 0, m_tiles = (len + kBr - 1) / kBr - m_first;
  const int iters = group * m_tiles;
  auto issue = [&](int it, int buf) {
    const int h = kvh * group + it / m_tiles, m0 = (m_first + it % m_tiles) * kBr;
    const int64_t off = (int64_t(start) + m0) * q_stride + h * D;
    tc::LoadTileAsync<kBr, D, kThreads>(sQ(buf), p.q + off, q_stride, len - m0);
    tc::LoadTileAsync<kBr, D, kThreads>(sdO(buf), p.dout + off, q_stride, len - m0);
    for (int i = threadIdx.x; i < kBr; i += kThreads) {
      const bool ok = m0 + i < len;
      const int64_t row = (int64_t(start) + m0 + i) * p.hq + h;
      sL[buf * kBr + i] = ok ? p.lse[row] * kLog2e : INFINITY;  // +inf: P = 0 for padding rows
      sD[buf * kBr + i] = ok ? p.dvec[row] : 0.f;
    }
    tc::CpAsyncCommit();
  };
  issue(0, 0);  // the first group also carries K and V

  float dk[kDTiles][4] = {}, dv[kDTiles][4] = {};
  const int key_row = warp * 16;  // this warp's keys within the tile
  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1, h = kvh * group + it / m_tiles, m0 = (m_first + it % m_tiles) * kBr;
    if (it + 1 < iters) {
      issue(it + 1, buf ^ 1);
      tc::CpAsyncWait<1>();
    } else {
      tc::CpAsyncWait<0>();
    }
    __syncthreads();
    const float* lrow = sL + buf * kBr;
    const float* drow = sD + buf * kBr;

    // S^T = K Q^T (16 keys x 64 queries per warp).
    float s[kNTiles][4] = {};
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t kf[4];
      tc::Ldmatrix4(kf, sK.Chunk(key_row + (mi & 1) * 8 + mr, kk * 2 + (mi >> 1)));
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t qf[4];
        tc::Ldmatrix4(qf, sQ(buf).Chunk(np * 16 + (mi >> 1) * 8 + mr, kk * 2 + (mi & 1)));
        tc::Mma(s[2 * np], kf, qf[0], qf[1]);
        tc::Mma(s[2 * np + 1], kf, qf[2], qf[3]);
      }
    }
    // P^T, masked where the key is past the sequence end or (causal) after the query.
    const bool mask = n0 + kBc > len || (kCausal && n0 + key_row + 15 > m0);
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = nt * 8 + 2 * t + (e & 1), kj = n0 + key_row + g + (e >> 1) * 8;
        float pv = tc::Exp2(fmaf(s[nt][e], sl2, -lrow[col]));
        if (mask && (kj >= len || (kCausal && kj > m0 + col))) pv = 0.f;
        s[nt][e] = pv;
      }
    // dV += P^T dO
#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) {
      const uint32_t a[4] = {tc::PackBf16(s[2 * kk][0], s[2 * kk][1]), tc::PackBf16(s[2 * kk][2], s[2 * kk][3]),
                             tc::PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             tc::PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        tc::Ldmatrix4T(b, sdO(buf).Chunk(kk * 16 + (mi & 1) * 8 + mr, dp * 2 + (mi >> 1)));
        tc::Mma(dv[2 * dp], a, b[0], b[1]);
        tc::Mma(dv[2 * dp + 1], a, b[2], b[3]);
      }
    }
    // dP^T = V dO^T
    float dpt[kNTiles][4] = {};
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      uint32_t vf[4];
      tc::Ldmatrix4(vf, sV.Chunk(key_row + (mi & 1) * 8 + mr, kk * 2 + (mi >> 1)));
#pragma unroll
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t of[4];
        tc::Ldmatrix4(of, sdO(buf).Chunk(np * 16 + (mi >> 1) * 8 + mr, kk * 2 + (mi & 1)));
        tc::Mma(dpt[2 * np], vf, of[0], of[1]);
        tc::Mma(dpt[2 * np + 1], vf, of[2], of[3]);
      }
    }
    // dS^T = P^T (dP^T - D), kept in dpt; also staged (bf16) in shared memory for dQ.
#pragma unroll
    for (int nt = 0; nt < kNTiles; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dpt[nt][e] = s[nt][e] * (dpt[nt][e] - drow[nt * 8 + 2 * t + (e & 1)]);
#pragma unroll
      for (int r = 0; r < 2; ++r)
        *reinterpret_cast<uint32_t*>(sdS.At(key_row + g + 8 * r, nt * 8 + 2 * t)) =
            tc::PackBf16(dpt[nt][2 * r], dpt[nt][2 * r + 1]);
    }
    // dK += dS^T Q
#pragma unroll
    for (int kk = 0; kk < kBr / 16; ++kk) {
      const uint32_t a[4] = {tc::PackBf16(dpt[2 * kk][0], dpt[2 * kk][1]), tc::PackBf16(dpt[2 * kk][2], dpt[2 * kk][3]),
                             tc::PackBf16(dpt[2 * kk + 1][0], dpt[2 * kk + 1][1]),
                             tc::PackBf16(dpt[2 * kk + 1][2], dpt[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t b[4];
        tc::Ldmatrix4T(b, sQ(buf).Chunk(kk * 16 + (mi & 1) * 8 + mr, dp * 2 + (mi >> 1)));
        tc::Mma(dk[2 * dp], a, b[0], b[1]);
        tc::Mma(dk[2 * dp + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // dS^T complete
    // dQ (64 queries x D) += dS K: warp (wm, wn) takes queries 16wm.. and half wn of D.
    {
      const int wm = warp % 4, wn = warp / 4;
      float dq[D / 16][4] = {};
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) {
        uint32_t a[4];
        tc::Ldmatrix4T(a, sdS.Chunk(kk * 16 + (mi >> 1) * 8 + mr, wm * 2 + (mi & 1)));
#pragma unroll
        for (int dp = 0; dp < D / 32; ++dp) {
          uint32_t b[4];
          tc::Ldmatrix4T(b, sK.Chunk(kk * 16 + (mi & 1) * 8 + mr, wn * (D / 16) + dp * 2 + (mi >> 1)));
          tc::Mma(dq[2 * dp], a, b[0], b[1]);
          tc::Mma(dq[2 * dp + 1], a, b[2], b[3]);
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int qi = m0 + wm * 16 + g + 8 * r;
        if (qi >= len) continue;
        float* row = p.dq_acc + (int64_t(start) + qi) * q_stride + h * D + wn * (D / 2) + 2 * t;
#pragma unroll
        for (int nt = 0; nt < D / 16; ++nt)
          atomicAdd(reinterpret_cast<float2*>(row + nt * 8), make_float2(dq[nt][2 * r], dq[nt][2 * r + 1]));
      }
    }
    __syncthreads();  // buffers of this iteration and dS^T are free again
  }
  // Epilogue: dK (scaled) and dV for this warp's keys.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int kj = n0 + key_row + g + 8 * r;
    if (kj >= len) continue;
    const int64_t off = (int64_t(start) + kj) * kv_stride + kvh * D + 2 * t;
#pragma unroll
    for (int dt = 0; dt < kDTiles; ++dt) {
      *reinterpret_cast<uint32_t*>(p.dk + off + dt * 8) = tc::PackBf16(dk[dt][2 * r] * p.scale, dk[dt][2 * r + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(p.dv + off + dt * 8) = tc::PackBf16(dv[dt][2 * r], dv[dt][2 * r + 1]);
    }
  }
}

template <int D, bool kCausal>
absl::Status Launch(const BwdParams& p, const AttentionDims& d, cudaStream_t s) {
  constexpr int kSmem = BwdSmemBytes<D>();
  auto kernel = BwdKernel<D, kCausal>;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem) != cudaSuccess)
    return LaunchStatus("flash_backward(smem attribute)");
  kernel<<<dim3(static_cast<unsigned>(TileCapacity(d, kBc)), static_cast<unsigned>(d.kv_heads)), kThreads, kSmem, s>>>(p);
  return LaunchStatus("flash_backward");
}
}  // namespace

absl::Status Backward(const void* q, const void* k, const void* v, const int32_t* cu, const void* dout,
                      const float* lse, const float* dvec, float* dq_acc, void* dk, void* dv, const AttentionDims& d,
                      cudaStream_t s) {
  int2* table = nullptr;
  const int64_t tiles = TileCapacity(d, kBc);
  if (cudaMallocAsync(&table, tiles * sizeof(int2), s) != cudaSuccess) return LaunchStatus("flash_backward(alloc)");
  BwdParams p{static_cast<const bf16*>(q), static_cast<const bf16*>(k), static_cast<const bf16*>(v),
              static_cast<const bf16*>(dout), lse, dvec, dq_acc, static_cast<bf16*>(dk), static_cast<bf16*>(dv), cu,
              table, static_cast<int>(d.q_heads), static_cast<int>(d.kv_heads), d.scale};
  auto launch = d.head_dim == 64 ? (d.causal ? Launch<64, true> : Launch<64, false>)
                                 : (d.causal ? Launch<128, true> : Launch<128, false>);
  absl::Status st = BuildTileTable(cu, d.batch, kBc, table, tiles, s);
  if (st.ok()) st.Update(launch(p, d, s));
  cudaFreeAsync(table, s);
  return st;
}

}  // namespace tessera::kernels::flash
