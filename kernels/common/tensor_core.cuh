// Warp-level tensor-core building blocks (sm_80+ instructions, used on sm_90a):
// cp.async 16-byte copies with zero fill, ldmatrix (plain and transposed) and the
// bf16 m16n8k16 MMA with f32 accumulation, plus a swizzled shared-memory tile layout.
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4):
//   A (16x16, row major)  a0 = (g, 2t..2t+1)  a1 = (g+8, 2t..)  a2 = (g, 2t+8..)  a3 = (g+8, 2t+8..)
//   B (16x8, "col")       b0 = (k 2t..2t+1, n g)  b1 = (k 2t+8.., n g)
//   C (16x8, f32)         c0,c1 = (g, 2t..2t+1)  c2,c3 = (g+8, 2t..2t+1)
// Two adjacent C tiles (16x16) packed to bf16 are exactly an A fragment: this is how
// the softmax probabilities feed the second GEMM without touching shared memory.
#pragma once
#include <cuda_bf16.h>
#include <cstdint>

namespace tessera::kernels::tc {

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Shared-memory loads and stores by 32-bit shared address (ld/st.shared). A pointer that
// went through an integer (alignment arithmetic) has lost its address space, and the
// compiler's generic accesses then take the L1TEX path with long-scoreboard waits. The
// "memory" clobbers keep them ordered with barrier waits and fences.
__device__ __forceinline__ float2 LdShared2(const float* p) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(SmemAddr(p)) : "memory");
  return v;
}
__device__ __forceinline__ int LdSharedI32(const int* p) {
  int v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(SmemAddr(p)) : "memory");
  return v;
}
__device__ __forceinline__ void StShared(void* p, uint32_t v) {
  asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(SmemAddr(p)), "r"(v) : "memory");
}
__device__ __forceinline__ void StShared(void* p, float4 v) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(SmemAddr(p)), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}

// Copies 16 bytes global -> shared; copies nothing and writes zeros when !valid.
__device__ __forceinline__ void CpAsync16(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(smem)), "l"(gmem), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void Ldmatrix4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(smem)));
}
__device__ __forceinline__ void Ldmatrix4T(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(smem)));
}

// c += a * b (bf16 in, f32 accumulate).
__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The 8x8 16-bit matrix a warp holds one register a lane (lane l: row l / 4, columns
// 2 (l % 4) and 2 (l % 4) + 1, the lower column in the low half), transposed.
__device__ __forceinline__ uint32_t Transpose8x8(uint32_t v) {
  uint32_t r;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(v));
  return r;
}
__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

__device__ __forceinline__ float Exp2(float x) {  // 2^x, -inf -> 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Row-major [rows][kCols] bf16 tile whose 16-byte chunks are XOR-swizzled by row % 8,
// so that the eight row addresses of one ldmatrix hit eight different bank groups.
// kCols must be a multiple of 64.
template <int kCols>
struct SwizzledTile {
  static_assert(kCols % 64 == 0, "swizzle needs at least 8 chunks per row");
  __nv_bfloat16* base;
  // Address of the 16-byte chunk `chunk` (8 elements) of row `row`.
  __device__ __forceinline__ __nv_bfloat16* Chunk(int row, int chunk) const {
    return base + row * kCols + ((chunk ^ (row & 7)) << 3);
  }
  // Element (row, col) with col even (for 4-byte pair stores).
  __device__ __forceinline__ __nv_bfloat16* At(int row, int col) const { return Chunk(row, col >> 3) + (col & 7); }
};

// Asynchronously loads rows [0, kRows) of a strided global matrix into `tile`; rows at
// or beyond `valid_rows` are zero-filled (never read). All kThreads threads call it.
template <int kRows, int kCols, int kThreads>
__device__ __forceinline__ void LoadTileAsync(SwizzledTile<kCols> tile, const __nv_bfloat16* g, int64_t row_stride,
                                              int valid_rows) {
  constexpr int kChunks = kCols / 8;
  static_assert(kRows * kChunks % kThreads == 0, "tile chunks must divide evenly among threads");
#pragma unroll
  for (int it = 0; it < kRows * kChunks / kThreads; ++it) {
    const int i = it * kThreads + threadIdx.x, r = i / kChunks, c = i % kChunks;
    const bool ok = r < valid_rows;
    CpAsync16(tile.Chunk(r, c), g + (ok ? r : 0) * row_stride + c * 8, ok);
  }
}

// Max / sum across the four lanes (t = 0..3) that hold one row of a C fragment.
__device__ __forceinline__ float QuadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffff, v, 2));
}
__device__ __forceinline__ float QuadSum(float v) {
  v += __shfl_xor_sync(0xffffffff, v, 1);
  return v + __shfl_xor_sync(0xffffffff, v, 2);
}

}  // namespace tessera::kernels::tc
