// Reference attention: per sequence, per query head, scores in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/common/host_elem.h"

namespace tessera::kernels {
namespace {
struct Idx {
  const AttentionDims& d;
  int64_t Q(int64_t tok, int64_t h) const { return (tok * d.q_heads + h) * d.head_dim; }
  int64_t K(int64_t tok, int64_t h) const { return (tok * d.kv_heads + h / (d.q_heads / d.kv_heads)) * d.head_dim; }
};
}  // namespace

absl::Status AttentionMergeCpu(void* out, float* lse, const void* out_b, const float* lse_b, int64_t rows, int64_t dim,
                               DType t) {
  for (int64_t r = 0; r < rows; ++r) {
    const double a = lse[r], b = lse_b[r];
    if (b == -std::numeric_limits<double>::infinity()) continue;  // the block adds nothing
    const double m = std::max(a, b), l = m + std::log(std::exp(a - m) + std::exp(b - m));
    const double wa = std::exp(a - l), wb = std::exp(b - l);
    for (int64_t i = r * dim; i < (r + 1) * dim; ++i)
      StoreElem(out, i, static_cast<float>(wa * LoadElem(out, i, t) + wb * LoadElem(out_b, i, t)), t);
    lse[r] = static_cast<float>(l);
  }
  return absl::OkStatus();
}

absl::Status AttentionForwardCpu(const void* q, const void* k, const void* v, const int32_t* cu, void* out, float* lse,
                                 const AttentionDims& d, DType t) {
  Idx ix{d};
  const int64_t D = d.head_dim;
  std::vector<double> s, acc(D);
  for (int64_t b = 0; b < d.batch; ++b) {
    const int64_t start = cu[b], end = cu[b + 1];
    for (int64_t h = 0; h < d.q_heads; ++h)
      for (int64_t i = start; i < end; ++i) {
        const int64_t last = d.causal ? i : end - 1;
        s.assign(last - start + 1, 0.0);
        double m = -std::numeric_limits<double>::infinity();
        for (int64_t j = start; j <= last; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < D; ++c) dot += double(LoadElem(q, ix.Q(i, h) + c, t)) * LoadElem(k, ix.K(j, h) + c, t);
          s[j - start] = dot * d.scale;
          m = std::max(m, s[j - start]);
        }
        double sum = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = start; j <= last; ++j) {
          double p = std::exp(s[j - start] - m);
          sum += p;
          for (int64_t c = 0; c < D; ++c) acc[c] += p * LoadElem(v, ix.K(j, h) + c, t);
        }
        for (int64_t c = 0; c < D; ++c) StoreElem(out, ix.Q(i, h) + c, static_cast<float>(acc[c] / sum), t);
        lse[i * d.q_heads + h] = static_cast<float>(m + std::log(sum));
      }
  }
  return absl::OkStatus();
}

absl::Status AttentionBackwardCpu(const void* q, const void* k, const void* v, const int32_t* cu, const void* out,
                                  const void* dout, const float* lse, void* dq, void* dk, void* dv,
                                  const AttentionDims& d, DType t) {
  Idx ix{d};
  const int64_t D = d.head_dim;
  std::vector<double> gq(d.tokens * d.q_heads * D, 0.0), gk(d.tokens * d.kv_heads * D, 0.0), gv(gk.size(), 0.0);
  for (int64_t b = 0; b < d.batch; ++b) {
    const int64_t start = cu[b], end = cu[b + 1];
    for (int64_t h = 0; h < d.q_heads; ++h)
      for (int64_t i = start; i < end; ++i) {
        const int64_t last = d.causal ? i : end - 1;
        double Di = 0;  // sum(dO_i * O_i)
        for (int64_t c = 0; c < D; ++c) Di += double(LoadElem(dout, ix.Q(i, h) + c, t)) * LoadElem(out, ix.Q(i, h) + c, t);
        for (int64_t j = start; j <= last; ++j) {
          double sdot = 0, dpdot = 0;
          for (int64_t c = 0; c < D; ++c) {
            sdot += double(LoadElem(q, ix.Q(i, h) + c, t)) * LoadElem(k, ix.K(j, h) + c, t);
            dpdot += double(LoadElem(dout, ix.Q(i, h) + c, t)) * LoadElem(v, ix.K(j, h) + c, t);
          }
          double p = std::exp(sdot * d.scale - lse[i * d.q_heads + h]);
          double ds = p * (dpdot - Di) * d.scale;
          for (int64_t c = 0; c < D; ++c) {
            gv[ix.K(j, h) + c] += p * LoadElem(dout, ix.Q(i, h) + c, t);
            gq[ix.Q(i, h) + c] += ds * LoadElem(k, ix.K(j, h) + c, t);
            gk[ix.K(j, h) + c] += ds * LoadElem(q, ix.Q(i, h) + c, t);
          }
        }
      }
  }
  for (size_t x = 0; x < gq.size(); ++x) StoreElem(dq, x, static_cast<float>(gq[x]), t);
  for (size_t x = 0; x < gk.size(); ++x) {
    StoreElem(dk, x, static_cast<float>(gk[x]), t);
    StoreElem(dv, x, static_cast<float>(gv[x]), t);
  }
  return absl::OkStatus();
}

}  // namespace tessera::kernels
