// Rotary position embedding with explicit positions (Llama's rotate-half layout):
// for x[token, head, 0..d), pairs (i, i + d/2), angle = pos[token] * base^(-2i/d):
//   y_i = x_i cos - x_{i+d/2} sin;  y_{i+d/2} = x_{i+d/2} cos + x_i sin.
// The backward is the same rotation by -angle (sign = -1). x_row / y_row: elements from
// one token's row to the next (heads * dim when contiguous; more when x or y are the
// head columns of a fused Q|K|V row).
#pragma once
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace tessera::kernels {
absl::Status RopeCpu(const void* x, const int32_t* pos, void* y, int64_t tokens, int64_t heads, int64_t dim,
                     float base, float sign, DType t, int64_t x_row, int64_t y_row);
absl::Status RopeCuda(const void* x, const int32_t* pos, void* y, int64_t tokens, int64_t heads, int64_t dim,
                      float base, float sign, DType t, void* stream, int64_t x_row, int64_t y_row);
}  // namespace tessera::kernels
