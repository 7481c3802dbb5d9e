// Elementwise ops the engines need: y = alpha * x + beta * y over n elements (residual
// adds, gradient accumulation into f32 buffers, scaled copies). x and y are f32 or
// bf16, independently (a bf16 gradient can accumulate into an f32 buffer); arithmetic is
// f32 (CPU: double), rounded once into y's dtype.
// And a select of i32 values: out[i] = src[i] >= 0 ? from[src[i]] : values[i] (a
// generation step's tokens: those sampled by the step before, still on the device, or
// known on the host). Indices are checked by the caller.
#pragma once
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace tessera::kernels {
absl::Status AxpbyCpu(float alpha, const void* x, DType tx, float beta, void* y, DType ty, int64_t n);
absl::Status AxpbyCuda(float alpha, const void* x, DType tx, float beta, void* y, DType ty, int64_t n, void* stream);
absl::Status SelectCpu(const int32_t* src, const int32_t* from, const int32_t* values, int32_t* out, int64_t n);
absl::Status SelectCuda(const int32_t* src, const int32_t* from, const int32_t* values, int32_t* out, int64_t n,
                        void* stream);
}  // namespace tessera::kernels
