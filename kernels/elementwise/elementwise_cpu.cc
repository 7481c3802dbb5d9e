#include "kernels/common/host_elem.h"
#include "kernels/elementwise/elementwise.h"

namespace tessera::kernels {

absl::Status AxpbyCpu(float alpha, const void* x, DType tx, float beta, void* y, DType ty, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    // beta == 0 overwrites y without reading it (y may hold NaN, e.g. fresh memory).
    const double yv = beta == 0.f ? 0.0 : double(beta) * LoadElem(y, i, ty);
    StoreElem(y, i, static_cast<float>(double(alpha) * LoadElem(x, i, tx) + yv), ty);
  }
  return absl::OkStatus();
}

absl::Status SelectCpu(const int32_t* src, const int32_t* from, const int32_t* values, int32_t* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = src[i] >= 0 ? from[src[i]] : values[i];
  return absl::OkStatus();
}

}  // namespace tessera::kernels
