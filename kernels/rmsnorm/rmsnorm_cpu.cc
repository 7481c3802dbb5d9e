// CPU reference (see the header); reductions accumulate in double.
#include "kernels/rmsnorm/rmsnorm.h"
#include <cmath>
#include <vector>

#include "kernels/common/host_elem.h"

namespace tessera::kernels {

absl::Status RmsNormForwardCpu(const void* x, const void* w, void* y, float* rstd, int64_t rows, int64_t cols, float eps,
                               DType t) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < cols; ++c) {
      double v = LoadElem(x, r * cols + c, t);
      ss += v * v;
    }
    double rs = 1.0 / std::sqrt(ss / cols + eps);
    rstd[r] = static_cast<float>(rs);
    for (int64_t c = 0; c < cols; ++c)
      StoreElem(y, r * cols + c, static_cast<float>(LoadElem(x, r * cols + c, t) * rs * LoadElem(w, c, t)), t);
  }
  return absl::OkStatus();
}

absl::Status RmsNormBackwardCpu(const void* dy, const void* x, const void* w, const float* rstd, void* dx, float* dw,
                                int64_t rows, int64_t cols, DType t, const void* add) {
  std::vector<double> dwa(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double rs = rstd[r], dot = 0;
    for (int64_t c = 0; c < cols; ++c) {
      int64_t i = r * cols + c;
      double xv = LoadElem(x, i, t), g = LoadElem(dy, i, t);
      dot += g * LoadElem(w, c, t) * xv;
      dwa[c] += g * xv * rs;
    }
    double coef = rs * rs * rs * dot / cols;
    for (int64_t c = 0; c < cols; ++c) {
      int64_t i = r * cols + c;
      const double v = rs * LoadElem(dy, i, t) * LoadElem(w, c, t) - LoadElem(x, i, t) * coef;
      StoreElem(dx, i, static_cast<float>(add != nullptr ? v + LoadElem(add, i, t) : v), t);
    }
  }
  for (int64_t c = 0; c < cols; ++c) dw[c] = static_cast<float>(dwa[c]);
  return absl::OkStatus();
}

}  // namespace tessera::kernels
