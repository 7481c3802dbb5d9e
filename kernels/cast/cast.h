// Cast between any two of f32, bf16 and f16 (round to nearest even; NaN stays NaN, f16
// overflows to inf). Launchers take raw pointers (and a CUDA stream as void*).
#pragma once
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace tessera::kernels {
absl::Status CastCpu(const void* x, DType xt, void* y, DType yt, int64_t n);
absl::Status CastCuda(const void* x, DType xt, void* y, DType yt, int64_t n, void* stream);
}  // namespace tessera::kernels
