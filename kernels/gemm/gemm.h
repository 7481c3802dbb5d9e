// Row-major GEMM: C[m,n] = alpha * op(A) @ op(B) + beta * C, op = transpose when set.
// A is [m,k] ([k,m] if ta), B is [k,n] ([n,k] if tb). f32 or bf16 (f32 accumulate);
// C has A's dtype `t`, or `ct` = f32 with bf16 inputs (weight gradients accumulated
// straight into f32 main gradients, Megatron's gradient-accumulation fusion).
// With `c_in` (C's dtype and shape), C = alpha * op(A) @ op(B) + beta * C_in and C is only
// written: a residual added in the epilogue (cuBLASLt's separate C and D).
// CPU: OpenBLAS sgemm (bf16 converted through f32). CUDA: cuBLASLt.
#pragma once
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace tessera::kernels {
absl::Status GemmCpu(const void* a, bool ta, const void* b, bool tb, void* c, int64_t m, int64_t n, int64_t k, float alpha,
                     float beta, DType t, DType ct, const void* c_in = nullptr);
// `workspace` (device memory, `workspace_bytes`) is reused across calls; `handle` is a cublasLtHandle_t.
absl::Status GemmCuda(const void* a, bool ta, const void* b, bool tb, void* c, int64_t m, int64_t n, int64_t k,
                      float alpha, float beta, DType t, DType ct, void* handle, void* workspace, size_t workspace_bytes,
                      void* stream, const void* c_in = nullptr);
// Whether a CUDA GEMM shape's first call times cuBLASLt's candidates and keeps the fastest
// (default: the environment's TESSERA_GEMM_TUNE=1; see gemm_cuda.cc). Shapes already
// planned keep their algorithm.
// (The setting lives with the CPU GEMM so that builds without CUDA link it too.)
void SetGemmTuning(bool on);
bool GemmTuning();
}  // namespace tessera::kernels
