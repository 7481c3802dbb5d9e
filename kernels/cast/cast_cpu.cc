// CPU reference (see the header); reductions accumulate in double.
#include "kernels/cast/cast.h"
#include <cmath>
#include <vector>

#include "kernels/common/host_elem.h"

namespace tessera::kernels {

absl::Status CastCpu(const void* x, DType xt, void* y, DType yt, int64_t n) {
  for (int64_t i = 0; i < n; ++i) StoreElem(y, i, LoadElem(x, i, xt), yt);
  return absl::OkStatus();
}

}  // namespace tessera::kernels
