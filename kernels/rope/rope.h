// Rotary position embedding with explicit positions (Llama's rotate-half layout):
// for x[token, head, 0..d), pairs (i, i + d/2), angle = f32(pos[token]) * inv_freq[i]
// rounded to f32 (the angle transformers, Megatron and vLLM form; inv_freq: the host's
// table of d/2 frequencies, common/model/rope.h), then, with c = scale cos(angle) and
// s = scale sin(angle) (scale: YaRN's attention scaling, else 1):
//   y_i = x_i c - x_{i+d/2} s;  y_{i+d/2} = x_{i+d/2} c + x_i s.
// The backward is the same rotation by -angle (sign = -1): scale R(-angle) is the
// transpose of scale R(angle). x_row / y_row: elements from
// one token's row to the next (heads * dim when contiguous; more when x or y are the
// head columns of a fused Q|K|V row).
#pragma once
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace tessera::kernels {
// The largest head dim the kernels take (the CUDA kernel's frequencies travel by value).
constexpr int64_t kRopeMaxHeadDim = 256;
absl::Status RopeCpu(const void* x, const int32_t* pos, void* y, int64_t tokens, int64_t heads, int64_t dim,
                     const float* inv_freq, float scale, float sign, DType t, int64_t x_row, int64_t y_row);
absl::Status RopeCuda(const void* x, const int32_t* pos, void* y, int64_t tokens, int64_t heads, int64_t dim,
                      const float* inv_freq, float scale, float sign, DType t, void* stream, int64_t x_row, int64_t y_row);
}  // namespace tessera::kernels
