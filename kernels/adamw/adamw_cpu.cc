// CPU reference (see the header); reductions accumulate in double.
#include "kernels/adamw/adamw.h"
#include <cmath>
#include <vector>

#include "kernels/common/host_elem.h"

namespace tessera::kernels {

absl::Status AdamWCpu(float* p, const void* g, DType gt, float* m, float* v, uint16_t* p_bf16, int64_t n,
                      const AdamWArgs& a) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.step));
  for (int64_t i = 0; i < n; ++i) {
    // The scaled gradient rounded to f32 first, as the CUDA kernel computes it.
    const double gv = static_cast<float>(LoadElem(g, i, gt)) * a.grad_scale;
    double mi = a.beta1 * static_cast<double>(m[i]) + (1 - a.beta1) * gv;
    double vi = a.beta2 * static_cast<double>(v[i]) + (1 - a.beta2) * gv * gv;
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    double upd = (mi / bc1) / (std::sqrt(vi / bc2) + a.eps) + a.weight_decay * static_cast<double>(p[i]);
    p[i] = static_cast<float>(p[i] - a.lr * upd);
    if (p_bf16) p_bf16[i] = tessera::FloatToBf16(p[i]);
  }
  return absl::OkStatus();
}

}  // namespace tessera::kernels
