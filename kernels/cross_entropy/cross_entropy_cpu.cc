#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/common/host_elem.h"
#include "kernels/cross_entropy/cross_entropy.h"

namespace tessera::kernels {

absl::Status CrossEntropyPartialsCpu(const void* logits, const int32_t* targets, float* max, float* sum, float* dot,
                                     float* tgt, int64_t n, int64_t v, int64_t vocab_start, DType t) {
  for (int64_t i = 0; i < n; ++i) {
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < v; ++j) m = std::max(m, static_cast<double>(LoadElem(logits, i * v + j, t)));
    double s = 0, d = 0;
    for (int64_t j = 0; j < v; ++j) {
      double z = LoadElem(logits, i * v + j, t), e = std::exp(z - m);
      s += e;
      d += e * z;
    }
    int64_t local = targets[i] - vocab_start;
    max[i] = static_cast<float>(m);
    sum[i] = static_cast<float>(s);
    dot[i] = static_cast<float>(d);
    tgt[i] = local >= 0 && local < v ? LoadElem(logits, i * v + local, t) : 0.f;
  }
  return absl::OkStatus();
}

absl::Status CrossEntropyBackwardCpu(const void* logits, const int32_t* targets, const float* lse, const float* dloss,
                                     void* dlogits, int64_t n, int64_t v, int64_t vocab_start, DType t,
                                     const float* dent, const float* ent) {
  for (int64_t i = 0; i < n; ++i) {
    int64_t local = targets[i] - vocab_start;
    const double dh = dent != nullptr ? dent[i] : 0.0, h = ent != nullptr ? ent[i] : 0.0;
    for (int64_t j = 0; j < v; ++j) {
      const double logp = static_cast<double>(LoadElem(logits, i * v + j, t)) - lse[i], p = std::exp(logp);
      double d = dloss[i] * (p - (j == local ? 1.0 : 0.0));
      if (dent != nullptr) d -= dh * p * (logp + h);
      StoreElem(dlogits, i * v + j, static_cast<float>(d), t);
    }
  }
  return absl::OkStatus();
}

absl::Status CrossEntropyLossCpu(const float* max, const float* sum, const float* tgt, const int32_t* targets,
                                 float scale, float* lse, float* dloss, float* loss_sum, int64_t n) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool counted = targets[i] >= 0;
    lse[i] = counted ? max[i] + std::log(sum[i]) : 0.f;
    dloss[i] = counted ? scale : 0.f;
    if (counted) total += static_cast<double>(lse[i]) - tgt[i];
  }
  loss_sum[0] = static_cast<float>(loss_sum[0] + total);
  return absl::OkStatus();
}

absl::Status CrossEntropyRescaleCpu(const float* max, const float* global_max, float* sum, int64_t n) {
  for (int64_t i = 0; i < n; ++i) sum[i] *= std::exp(max[i] - global_max[i]);
  return absl::OkStatus();
}

CrossEntropyResult CombineCrossEntropy(const std::vector<std::vector<std::vector<float>>>& shards) {
  CrossEntropyResult r;
  if (shards.empty()) return r;
  size_t n = shards[0][0].size();
  r.lse.resize(n), r.loss.resize(n), r.logprob.resize(n), r.entropy.resize(n);
  for (size_t i = 0; i < n; ++i) {
    double m = -std::numeric_limits<double>::infinity();
    for (const auto& s : shards) m = std::max(m, static_cast<double>(s[0][i]));
    double S = 0, D = 0, z = 0;
    for (const auto& s : shards) {
      double w = std::exp(s[0][i] - m);
      S += s[1][i] * w;
      D += s[2][i] * w;
      z += s[3][i];
    }
    double lse = m + std::log(S);
    r.lse[i] = static_cast<float>(lse);
    r.loss[i] = static_cast<float>(lse - z);
    r.logprob[i] = static_cast<float>(z - lse);
    r.entropy[i] = static_cast<float>(lse - D / S);
  }
  return r;
}

}  // namespace tessera::kernels
