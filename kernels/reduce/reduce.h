// Reductions for global-norm clipping: out[0] += sum(x^2) (f32 accumulation, CUDA with
// block partials + atomics), and in-place scaling x *= s.
#pragma once
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace tessera::kernels {
absl::Status SumSquaresCpu(const void* x, int64_t n, DType t, float* out);
absl::Status ScaleCpu(void* x, int64_t n, float s, DType t);
absl::Status SumSquaresCuda(const void* x, int64_t n, DType t, float* out, void* stream);
absl::Status ScaleCuda(void* x, int64_t n, float s, DType t, void* stream);
}  // namespace tessera::kernels
