// SwiGLU: y = silu(g) * u; dg = dy * u * silu'(g); du = dy * silu(g).
// silu(g) = g * s, s = sigmoid(g); silu'(g) = s * (1 + g * (1 - s)).
// The backward can also rebuild y (non-null `y`: the same value the forward wrote, for a
// model that did not keep it); y may be dy itself (each element is read before written).
#pragma once
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace tessera::kernels {
absl::Status SwiGluForwardCpu(const void* g, const void* u, void* y, int64_t n, DType t);
absl::Status SwiGluBackwardCpu(const void* dy, const void* g, const void* u, void* dg, void* du, int64_t n, DType t,
                               void* y = nullptr);
absl::Status SwiGluForwardCuda(const void* g, const void* u, void* y, int64_t n, DType t, void* stream);
absl::Status SwiGluBackwardCuda(const void* dy, const void* g, const void* u, void* dg, void* du, int64_t n, DType t,
                                void* stream, void* y = nullptr);
}  // namespace tessera::kernels
