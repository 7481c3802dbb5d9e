// Rotary position embedding with explicit positions (Llama's rotate-half layout):
// for x[token, head, 0..d), pairs (i, i + d/2), angle = pos[token] * base^(-2i/d):
//   y_i = x_i cos - x_{i+d/2} sin;  y_{i+d/2} = x_{i+d/2} cos + x_i sin.
// The backward is the same rotation by -angle (sign = -1).
#pragma once
#include <cstdint>

#include "absl/status/status.h"
#include "worker/runtime/dtype.h"

namespace tessera::kernels {
using runtime::DType;
absl::Status RopeCpu(const void* x, const int32_t* pos, void* y, int64_t tokens, int64_t heads, int64_t dim,
                     float base, float sign, DType t);
absl::Status RopeCuda(const void* x, const int32_t* pos, void* y, int64_t tokens, int64_t heads, int64_t dim,
                      float base, float sign, DType t, void* stream);
}  // namespace tessera::kernels
