// RMSNorm forward and backward over rows of length `cols`.
//   y = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps)           (rstd saved, f32)
//   dx = rstd * (dy*w) - x * rstd^3 * mean(dy*w*x) [+ add];  dw = sum_rows(dy * x * rstd)  (f32)
// `add` (optional, dx's dtype and shape, may be dx itself): the residual stream's gradient,
// added before dx is rounded — a pre-norm block's input gradient in one pass.
// x, y, dy, dx, w share dtype t (f32 or bf16); accumulation in f32 (CUDA) / double (CPU).
#pragma once
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace tessera::kernels {
absl::Status RmsNormForwardCpu(const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t cols, float eps, DType t);
absl::Status RmsNormBackwardCpu(const void* dy, const void* x, const void* w, const float* rstd, void* dx, float* dw,
                                int64_t rows, int64_t cols, DType t, const void* add = nullptr);
absl::Status RmsNormForwardCuda(const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t cols, float eps,
                                DType t, void* stream);
absl::Status RmsNormBackwardCuda(const void* dy, const void* x, const void* w, const float* rstd, void* dx, float* dw,
                                 int64_t rows, int64_t cols, DType t, void* stream, const void* add = nullptr);
}  // namespace tessera::kernels
