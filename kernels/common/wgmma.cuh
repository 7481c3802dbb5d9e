// Hopper warpgroup MMA (wgmma, sm_90a) building blocks: shared-memory matrix descriptors
// for the 128-byte swizzle, the fences and the bf16 -> f32 instruction shapes the
// attention kernels and the decode GEMM use. Generated operand lists are spelled out (up to 64 accumulators).
//
// Shared-memory tiles (Sw128Tile) hold a [rows][cols] bf16 matrix as cols/64 column
// blocks of [rows][64]; each 128-byte row of a block has its 16-byte chunks XOR-ed with
// row % 8 — the layout wgmma's 128B swizzle expects, both K-major (rows = M or N, the
// 64 columns along K) and MN-major (rows = K, the 64 columns along M or N). Blocks
// start on 1024-byte boundaries so the descriptor's base offset is 0.
//
// Accumulator layout of m64nNk16 (f32), thread (warp w of the warpgroup, g = lane / 4,
// t = lane % 4): d[4j + e] = (row 16w + g + 8 (e >> 1), col 8j + 2t + (e & 1)).
// A from registers: each warp gives its 16 rows as an mma.m16n8k16 A fragment.
#pragma once
#include <cstdint>

#include "kernels/common/tensor_core.cuh"

namespace tessera::kernels::wg {

template <int kRows, int kCols>
struct Sw128Tile {
  static_assert(kRows % 8 == 0 && kCols % 64 == 0, "tile must be whole 8 x 64 swizzle atoms");
  static constexpr int kBytes = kRows * kCols * 2;
  static constexpr int kBlockBytes = kRows * 128;  // one 64-column block
  __nv_bfloat16* base;
  // The 16-byte chunk `chunk` (columns 8 chunk .. 8 chunk + 7) of row `row`.
  __device__ __forceinline__ __nv_bfloat16* Chunk(int row, int chunk) const {
    return base + (chunk >> 3) * (kRows * 64) + row * 64 + (((chunk & 7) ^ (row & 7)) << 3);
  }
};

// Asynchronously loads rows [0, kRows) of a strided global matrix; rows at or beyond
// valid_rows are zero-filled. All kThreads threads call it.
template <int kRows, int kCols, int kThreads>
__device__ __forceinline__ void LoadTileAsync(Sw128Tile<kRows, kCols> tile, const __nv_bfloat16* g, int64_t row_stride,
                                              int valid_rows, int thread) {
  constexpr int kChunks = kCols / 8;
  static_assert(kRows * kChunks % kThreads == 0, "tile chunks must divide evenly among threads");
#pragma unroll
  for (int it = 0; it < kRows * kChunks / kThreads; ++it) {
    const int i = it * kThreads + thread, r = i / kChunks, c = i % kChunks;
    const bool ok = r < valid_rows;
    tc::CpAsync16(tile.Chunk(r, c), g + (ok ? r : 0) * row_stride + c * 8, ok);
  }
}

// Descriptor of a 128B-swizzled operand starting at `p` (1024-byte aligned atom rows).
__device__ __forceinline__ uint64_t Desc(const void* p, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  const uint64_t addr = tc::SmemAddr(p);
  return ((addr & 0x3FFFF) >> 4) | (uint64_t((lbo_bytes & 0x3FFFF) >> 4) << 16) |
         (uint64_t((sbo_bytes & 0x3FFFF) >> 4) << 32) | (uint64_t(1) << 62);
}
// K-major operand (rows along M/N, K contiguous): k-step kk (16 elements) of a tile.
template <int kRows, int kCols>
__device__ __forceinline__ uint64_t KMajorDesc(Sw128Tile<kRows, kCols> t, int row0, int kk) {
  const char* p = reinterpret_cast<const char*>(t.base) + (kk >> 2) * t.kBlockBytes + row0 * 128 + (kk & 3) * 32;
  return Desc(p, 16, 1024);  // LBO unused for swizzled K-major (encoded 1)
}
// MN-major operand (rows along K, M/N contiguous): k-step kk covers rows 16 kk .. 16 kk + 15,
// from the 64-column block `block` on (an operand of 64 M/N starting there).
template <int kRows, int kCols>
__device__ __forceinline__ uint64_t MnMajorDesc(Sw128Tile<kRows, kCols> t, int kk, int block = 0) {
  return Desc(reinterpret_cast<const char*>(t.base) + block * t.kBlockBytes + kk * 16 * 128, t.kBlockBytes, 1024);
}

__device__ __forceinline__ void Fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void Commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void Wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Makes this thread's generic-proxy shared-memory writes (cp.async, st.shared) visible
// to the async proxy (wgmma) after the next barrier.
__device__ __forceinline__ void FenceProxyAsync() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Keeps the compiler from moving accumulator reads/writes across an in-flight wgmma.
template <int N>
__device__ __forceinline__ void FenceRegs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (64 x 32, f32) {+}= A (64 x 16, smem) * B (16 x 32, smem); kTransA/kTransB: 0 = K-major, 1 = M/N-major
template <int kTransA = 0, int kTransB = 0>
__device__ __forceinline__ void WgmmaSS_m64n32(float (&d)[16], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, %19, %20;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a_desc), "l"(b_desc), "r"(accumulate), "n"(kTransA), "n"(kTransB));
}

// d (64 x 64, f32) {+}= A (64 x 16, smem) * B (16 x 64, smem); kTransA/kTransB: 0 = K-major, 1 = M/N-major
template <int kTransA = 0, int kTransB = 0>
__device__ __forceinline__ void WgmmaSS_m64n64(float (&d)[32], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a_desc), "l"(b_desc), "r"(accumulate), "n"(kTransA), "n"(kTransB));
}

// d (64 x 128, f32) {+}= A (64 x 16, smem) * B (16 x 128, smem); kTransA/kTransB: 0 = K-major, 1 = M/N-major
template <int kTransA = 0, int kTransB = 0>
__device__ __forceinline__ void WgmmaSS_m64n128(float (&d)[64], uint64_t a_desc, uint64_t b_desc, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a_desc), "l"(b_desc), "r"(accumulate), "n"(kTransA), "n"(kTransB));
}

// d (64 x 64, f32) += A (64 x 16, registers) * B (16 x 64, smem, {K|N}-major per kTransB)
template <int kTransB>
__device__ __forceinline__ void WgmmaRS_m64n64(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %37;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(kTransB));
}

// d (64 x 128, f32) += A (64 x 16, registers) * B (16 x 128, smem, {K|N}-major per kTransB)
template <int kTransB>
__device__ __forceinline__ void WgmmaRS_m64n128(float (&d)[64], const uint32_t (&a)[4], uint64_t b_desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %69;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "n"(kTransB));
}

}  // namespace tessera::kernels::wg

// ---- mbarriers, bulk tensor copies (TMA) and register reallocation (sm_90) ----
namespace tessera::kernels::tma {

__device__ __forceinline__ void BarInit(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(tc::SmemAddr(bar)), "r"(count));
}
// Makes barrier initialization visible to the async proxy (TMA) and other threads.
__device__ __forceinline__ void FenceBarrierInit() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void ArriveExpectTx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(tc::SmemAddr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void Arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(tc::SmemAddr(bar)) : "memory");
}
// Blocks until the barrier's phase with this parity has completed.
__device__ __forceinline__ void Wait(uint64_t* bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(tc::SmemAddr(bar)),
      "r"(parity)
      : "memory");
}
// One box of a 2-D tensor map (c0 the inner coordinate) into shared memory; completion
// counted on `bar` in bytes.
__device__ __forceinline__ void Load2d(void* smem, const void* tensor_map, uint64_t* bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          tc::SmemAddr(smem)),
      "l"(tensor_map), "r"(c0), "r"(c1), "r"(tc::SmemAddr(bar))
      : "memory");
}
// One box of a 3-D tensor map into shared memory; completion counted on `bar` in bytes.
__device__ __forceinline__ void Load3d(void* smem, const void* tensor_map, uint64_t* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
          tc::SmemAddr(smem)),
      "l"(tensor_map), "r"(c0), "r"(c1), "r"(c2), "r"(tc::SmemAddr(bar))
      : "memory");
}
// Bulk (non-tensor) copy of `bytes` (a multiple of 16, both addresses 16-byte aligned)
// from global to shared memory; completion counted on `bar` in bytes.
__device__ __forceinline__ void BulkLoad(void* smem, const void* global, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   tc::SmemAddr(smem)),
               "l"(global), "r"(bytes), "r"(tc::SmemAddr(bar))
               : "memory");
}
// Bulk (non-tensor) reduce-add of `bytes` f32 from shared to global memory, and the
// bulk-group bookkeeping of the issuing thread.
__device__ __forceinline__ void BulkReduceAddF32(float* global, const void* smem, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(global),
               "r"(tc::SmemAddr(smem)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void BulkCommit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>  // at most N groups still reading shared memory
__device__ __forceinline__ void BulkWaitRead() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>  // at most N groups not complete
__device__ __forceinline__ void BulkWait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void RegAlloc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void RegDealloc() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

}  // namespace tessera::kernels::tma
