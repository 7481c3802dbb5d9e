#include <cmath>

#include "kernels/common/host_elem.h"
#include "kernels/rope/rope.h"

namespace tessera::kernels {

absl::Status RopeCpu(const void* x, const int32_t* pos, void* y, int64_t tokens, int64_t heads, int64_t dim,
                     const float* inv_freq, float scale, float sign, DType t, int64_t x_row, int64_t y_row) {
  const int64_t half = dim / 2;
  for (int64_t tok = 0; tok < tokens; ++tok)
    for (int64_t i = 0; i < half; ++i) {
      const float ang = static_cast<float>(pos[tok]) * inv_freq[i];
      const double c = scale * std::cos(static_cast<double>(ang)), s = sign * scale * std::sin(static_cast<double>(ang));
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t ox = tok * x_row + h * dim, oy = tok * y_row + h * dim;
        double a = LoadElem(x, ox + i, t), b = LoadElem(x, ox + i + half, t);
        StoreElem(y, oy + i, static_cast<float>(a * c - b * s), t);
        StoreElem(y, oy + i + half, static_cast<float>(b * c + a * s), t);
      }
    }
  return absl::OkStatus();
}

}  // namespace tessera::kernels
