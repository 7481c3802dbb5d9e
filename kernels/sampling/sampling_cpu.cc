#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/common/host_elem.h"
#include "kernels/sampling/sampling.h"

namespace tessera::kernels {

absl::Status SampleCpu(const void* logits, int64_t n, int64_t v, DType t, const SampleArgs& a, int32_t* token,
                       float* logprob) {
  std::vector<double> p(v), sorted;
  for (int64_t i = 0; i < n; ++i) {
    const double temp = a.temperature[i];
    const double inv_t = temp > 0 ? 1.0 / temp : 1.0;
    double m = -INFINITY;
    int64_t arg = 0;
    for (int64_t j = 0; j < v; ++j) {
      double z = LoadElem(logits, i * v + j, t);
      if (z > m) m = z, arg = j;
    }
    double zsum = 0;
    for (int64_t j = 0; j < v; ++j) zsum += p[j] = std::exp((LoadElem(logits, i * v + j, t) - m) * inv_t);
    for (int64_t j = 0; j < v; ++j) p[j] /= zsum;
    if (temp <= 0) {
      token[i] = static_cast<int32_t>(arg);
      logprob[i] = static_cast<float>(std::log(p[arg]));
      continue;
    }
    // Threshold: a token is kept when p >= thr (top-k, then top-p over the survivors).
    sorted.assign(p.begin(), p.end());
    std::sort(sorted.begin(), sorted.end(), std::greater<double>());
    double thr = 0;
    int64_t k = a.top_k[i];
    if (k > 0 && k < v) thr = sorted[k - 1];
    if (a.top_p[i] < 1.f) {
      double kept_total = 0;
      for (double q : sorted) if (q >= thr) kept_total += q;
      double cum = 0;
      for (double q : sorted) {
        if (q < thr) break;
        cum += q;
        if (cum >= a.top_p[i] * kept_total) { thr = std::max(thr, q); break; }
      }
    }
    double mass = 0;
    for (int64_t j = 0; j < v; ++j) if (p[j] >= thr) mass += p[j];
    double target = SampleUniform(a.seed[i], a.offset[i]) * mass, cum = 0;
    int64_t pick = -1, last_kept = 0;
    for (int64_t j = 0; j < v && pick < 0; ++j) {
      if (p[j] < thr) continue;
      last_kept = j;
      cum += p[j];
      if (cum > target) pick = j;
    }
    if (pick < 0) pick = last_kept;  // rounding at the very top of the CDF
    token[i] = static_cast<int32_t>(pick);
    logprob[i] = static_cast<float>(std::log(p[pick]));
  }
  return absl::OkStatus();
}

}  // namespace tessera::kernels
