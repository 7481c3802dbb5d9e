// CPU reference (see the header); reductions accumulate in double.
#include "kernels/swiglu/swiglu.h"
#include <cmath>
#include <vector>

#include "kernels/common/host_elem.h"

namespace tessera::kernels {

namespace {
inline double Sigmoid(double g) { return 1.0 / (1.0 + std::exp(-g)); }
}  // namespace

absl::Status SwiGluForwardCpu(const void* g, const void* u, void* y, int64_t n, DType t) {
  for (int64_t i = 0; i < n; ++i) {
    double gv = LoadElem(g, i, t);
    StoreElem(y, i, static_cast<float>(gv * Sigmoid(gv) * LoadElem(u, i, t)), t);
  }
  return absl::OkStatus();
}

absl::Status SwiGluBackwardCpu(const void* dy, const void* g, const void* u, void* dg, void* du, int64_t n, DType t,
                               void* y) {
  for (int64_t i = 0; i < n; ++i) {
    double gv = LoadElem(g, i, t), uv = LoadElem(u, i, t), d = LoadElem(dy, i, t), s = Sigmoid(gv);
    StoreElem(dg, i, static_cast<float>(d * uv * s * (1 + gv * (1 - s))), t);
    StoreElem(du, i, static_cast<float>(d * gv * s), t);
    if (y != nullptr) StoreElem(y, i, static_cast<float>(gv * Sigmoid(gv) * uv), t);  // as the forward
  }
  return absl::OkStatus();
}

}  // namespace tessera::kernels
