// CPU reference of the decode step's linear layers (see the header); sums in double.
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/common/host_elem.h"
#include "kernels/decode/decode_linear.h"

namespace tessera::kernels {

absl::Status CheckDecodeLinear(const DecodeLinearArgs& a) {
  auto bad = [](const std::string& m) { return absl::InvalidArgumentError(absl::StrCat("decode linear: ", m)); };
  if (a.x == nullptr || a.m < 1 || a.k < 1) return bad(absl::StrCat("x [", a.m, ", ", a.k, "] must be non-empty"));
  if (a.num_parts < 1 || a.num_parts > 3) return bad(absl::StrCat(a.num_parts, " weights; 1 to 3 expected"));
  for (int j = 0; j < a.num_parts; ++j) {
    const DecodeLinearPart& p = a.parts[j];
    if (p.w == nullptr || p.n < 1 || (p.y == nullptr && !(a.swiglu && j == 1)))
      return bad(absl::StrCat("weight ", j, " [", p.n, ", ", a.k, "] needs its data and output"));
  }
  if (a.residual != nullptr && a.num_parts != 1) return bad("a residual takes one weight");
  if (a.swiglu && (a.num_parts != 2 || a.parts[0].n != a.parts[1].n || a.residual != nullptr))
    return bad("swiglu takes two weights of one shape (gate, up) and no residual");
  if (a.swiglu && (a.parts[0].bias != nullptr || a.parts[1].bias != nullptr)) return bad("swiglu's gate and up take no bias");
  return absl::OkStatus();
}

namespace {
inline float Round(float v, DType t) {  // to the dtype and back
  if (t == DType::kF32) return v;
  uint16_t h;
  StoreElem(&h, 0, v, t);
  return LoadElem(&h, 0, t);
}
}  // namespace

absl::Status DecodeLinearCpu(const DecodeLinearArgs& a, DType t) {
  if (auto s = CheckDecodeLinear(a); !s.ok()) return s;
  const int64_t m = a.m, k = a.k;
  std::vector<float> x(m * k);
  for (int64_t r = 0; r < m; ++r) {
    double rs = 1.0;
    if (a.norm != nullptr) {  // as kernels/rmsnorm's reference, rounded to the dtype
      double ss = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double v = LoadElem(a.x, r * k + c, t);
        ss += v * v;
      }
      rs = 1.0 / std::sqrt(ss / k + a.eps);
    }
    for (int64_t c = 0; c < k; ++c) {
      const double v = LoadElem(a.x, r * k + c, t);
      x[r * k + c] = a.norm != nullptr ? Round(static_cast<float>(v * rs * LoadElem(a.norm, c, t)), t) : static_cast<float>(v);
    }
  }
  auto dot = [&](const DecodeLinearPart& p, int64_t r, int64_t i) {
    double s = 0;
    for (int64_t c = 0; c < k; ++c) s += double(x[r * k + c]) * LoadElem(p.w, i * k + c, t);
    if (p.bias != nullptr) s += LoadElem(p.bias, i, t);
    return s;
  };
  if (a.swiglu) {
    const int64_t n = a.parts[0].n;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t i = 0; i < n; ++i) {
        const double g = Round(static_cast<float>(dot(a.parts[0], r, i)), t);
        const double u = Round(static_cast<float>(dot(a.parts[1], r, i)), t);
        StoreElem(a.parts[0].y, r * n + i, static_cast<float>(g / (1.0 + std::exp(-g)) * u), t);
      }
    return absl::OkStatus();
  }
  for (int j = 0; j < a.num_parts; ++j) {
    const DecodeLinearPart& p = a.parts[j];
    for (int64_t r = 0; r < m; ++r)
      for (int64_t i = 0; i < p.n; ++i) {
        double s = dot(p, r, i);
        if (a.residual != nullptr) s += LoadElem(a.residual, r * p.n + i, t);
        StoreElem(p.y, r * p.n + i, static_cast<float>(s), t);
      }
  }
  return absl::OkStatus();
}

}  // namespace tessera::kernels
