#include "kernels/common/host_elem.h"
#include "kernels/reduce/reduce.h"

namespace tessera::kernels {

absl::Status SumSquaresCpu(const void* x, int64_t n, DType t, float* out) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    double v = LoadElem(x, i, t);
    s += v * v;
  }
  *out = static_cast<float>(*out + s);
  return absl::OkStatus();
}

absl::Status ScaleCpu(void* x, int64_t n, float s, DType t) {
  for (int64_t i = 0; i < n; ++i) StoreElem(x, i, LoadElem(x, i, t) * s, t);
  return absl::OkStatus();
}

}  // namespace tessera::kernels
