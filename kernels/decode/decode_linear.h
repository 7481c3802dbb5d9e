// The linear layers of a decode step, over few rows (batch <= kDecodeMaxRows): at that
// size a layer is a pass over its weights, and the time is how close that pass gets to
// the memory's bandwidth and how little is spent between passes. One call computes, for
// each of up to three weights w_j [n_j, k] (a layer's q, k and v, say),
//   y_j [m, n_j] = op(x) @ w_j^T (+ bias_j) (+ residual),
// op(x) = x, or RMSNorm(x; norm, eps) rounded to x's dtype — the layer's input norm
// fused in (each row's rstd as kernels/rmsnorm computes it); `residual` [m, n] (one
// weight): the residual stream added before the one rounding; `swiglu` (two weights of
// one shape, gate and up): y_0 = silu(round(x @ gate^T)) * round(x @ up^T), the MLP's
// activation, rounded as the unfused ops round.
// CPU: the reference (f32 or bf16; double accumulation). CUDA: bf16, m <= kDecodeCudaMaxRows,
// k % 8 == 0 and (m rounded up to 1, 2 or 4, plus one) * k * 2 bytes <= kDecodeMaxXBytes:
// warps stream the weights with 16-byte loads, the (normalized) rows of x and the norm's
// weights in shared memory; launched as a programmatic dependent of the
// kernel before it, whose tail it overlaps (its weights prefetched into L2 before it waits
// for its input). Past 4 rows the CUDA-core dot products are bound by arithmetic: there
// cuBLASLt's GEMMs are faster (H200, a 1B Llama's decode step at 5 to 8 rows: 1.37 ms with
// this kernel, 1.22 ms with the GEMMs), so the CUDA backend does not take those sizes,
// unless TESSERA_DECODE_GEMM=1: then from 5 to kDecodeGemmMaxRows rows on Hopper the same
// call runs the tensor-core decode GEMM (decode_gemm_cuda.cu: the weights streamed by TMA,
// K split over a cluster where tiles are few, the same epilogues; the norm a small kernel
// before it, x normalized into `scratch`), which is correct but so far slower than
// cuBLASLt's GEMMs at those rows (docs/perf.md).
#pragma once
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "kernels/common/scratch.h"

namespace tessera::kernels {
constexpr int64_t kDecodeMaxRows = 8;      // the CPU reference
constexpr int64_t kDecodeCudaMaxRows = 4;  // the CUDA-core kernel
constexpr int64_t kDecodeGemmMaxRows = 128;  // the tensor-core kernel (Hopper)
constexpr int64_t kDecodeMaxXBytes = 96 * 1024;

struct DecodeLinearPart {
  const void* w = nullptr;     // [n, k]
  const void* bias = nullptr;  // [n] or null
  void* y = nullptr;           // [m, n]; unused for the second part under swiglu
  int64_t n = 0;
};
struct DecodeLinearArgs {
  const void* x = nullptr;  // [m, k]
  int64_t m = 0, k = 0;
  const void* norm = nullptr;  // [k] or null
  float eps = 0.f;
  DecodeLinearPart parts[3];
  int num_parts = 0;
  const void* residual = nullptr;  // [m, n] (one part)
  bool swiglu = false;             // two parts of one n
};
// INVALID_ARGUMENT naming what is wrong with the arguments' shapes (both backends).
absl::Status CheckDecodeLinear(const DecodeLinearArgs& a);
absl::Status DecodeLinearCpu(const DecodeLinearArgs& a, DType t);
// Whether the CUDA kernels take these sizes and dtype (on the current device; past 4 rows
// only with TESSERA_DECODE_GEMM=1).
bool DecodeLinearCudaSupported(int64_t m, int64_t k, DType t);
absl::Status DecodeLinearCuda(const DecodeLinearArgs& a, DType t, void* stream, DeviceScratch* scratch = nullptr);
// The tensor-core kernel alone (kDecodeCudaMaxRows < m <= kDecodeGemmMaxRows, Hopper,
// TESSERA_DECODE_GEMM=1).
bool DecodeGemmCudaSupported(int64_t m, int64_t k, DType t);
absl::Status DecodeGemmCuda(const DecodeLinearArgs& a, DType t, void* stream, DeviceScratch* scratch);
}  // namespace tessera::kernels
