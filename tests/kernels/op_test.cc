// The op harness: every op on every backend against a reference, on fresh random
// inputs (a new seed each run, printed on failure), odd and boundary shapes, outputs
// poisoned (0xff bytes = NaN) before each run so that unwritten elements fail.
//
// References and tolerances (relative L2 error ||got - ref|| / ||ref||):
//  - CPU backend vs an independent double-precision implementation in this file:
//    1e-6 for f32 (the CPU ops accumulate in double and round once to f32; GEMM uses
//    OpenBLAS f32 accumulation over k <= 300 terms: 1e-5).
//  - CPU backward ops vs central finite differences of the double forward: 1e-4
//    (h = 1e-3 on O(1) inputs: truncation error ~h^2, rounding ~1e-16/h).
//  - CUDA backend vs the CPU backend: f32 1e-5 (different summation order; SwiGLU
//    uses __expf: 1e-5 still holds at these magnitudes); bf16 2e-2 (outputs are rounded
//    to bf16, 8 bits of mantissa: a few ulp of 2^-8 after different f32 accumulation;
//    GEMM in bf16 accumulates in f32 on both sides).
//  - AdamW: per element, relative to the magnitude of the terms (m can cancel, so plain
//    relative error would be meaningless; p's scale includes |terms of m| / sqrt(v), the
//    size m's rounding reaches p with): 1e-6 on the CPU (double), 5e-6 on CUDA (f32).
//  - Cancelling results (RMSNorm dx, cross-entropy dlogits at p -> 1) are measured
//    against the size of their terms, not of the result.

#include "absl/strings/str_cat.h"
#include "kernels/cross_entropy/cross_entropy.h"
#include "kernels/gemm/gemm.h"
#include "tests/kernels/op_harness.h"

namespace tessera::runtime::test {
namespace {

// d f / d x_k by central differences (step 1e-3), for every k.
template <class F>
std::vector<double> CentralDifferences(const std::vector<float>& x, const F& f) {
  const double h = 1e-3;
  std::vector<double> d(x.size());
  for (size_t k = 0; k < x.size(); ++k) {
    auto p = x, m = x;
    p[k] += h, m[k] -= h;
    d[k] = (f(p) - f(m)) / (2 * h);
  }
  return d;
}

std::vector<double> RmsNormRef(const std::vector<float>& x, const std::vector<float>& w, int64_t rows, int64_t cols,
                               double eps, std::vector<double>* rstd = nullptr) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t c = 0; c < cols; ++c) ss += double(x[r * cols + c]) * x[r * cols + c];
    double rs = 1 / std::sqrt(ss / cols + eps);
    if (rstd) rstd->push_back(rs);
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = x[r * cols + c] * rs * w[c];
  }
  return y;
}
double Silu(double g) { return g / (1 + std::exp(-g)); }

float RoundTo(DType t, float v) {
  if (t == DType::kBF16) return Bf16ToFloat(FloatToBf16(v));
  if (t == DType::kF16) return F16ToFloat(FloatToF16(v));
  return v;
}

// Every cast between f32, bf16 and f16 rounds exactly as the host conversions (round to
// nearest even): no tolerance. Values span f16's subnormals, normals and overflow.
TEST_P(OpTest, Cast) {
  Rng rng(seed_);
  const std::vector<DType> types = {DType::kF32, DType::kBF16, DType::kF16};
  for (int64_t n : {1, 7, 1000, 65537}) {
    auto v = rng.Normal(n, 3.f);
    for (int64_t i = 0; i < n; i += 5) v[i] *= (i % 3 == 0) ? 1e-6f : 3e4f;  // f16 subnormals and overflow
    for (DType from : types)
      for (DType to : types) {
        SCOPED_TRACE(::testing::Message() << DTypeName(from) << " -> " << DTypeName(to) << " n=" << n << " seed=" << seed_);
        std::vector<float> src(n);
        for (int64_t i = 0; i < n; ++i) src[i] = RoundTo(from, v[i]);
        auto x = Make(*be_, {n}, from, src);
        auto y = Out(*be_, {n}, to);
        ASSERT_TRUE(be_->Cast(x, y).ok());
        auto got = Read(*be_, y);
        for (int64_t i = 0; i < n; ++i) {
          const float want = RoundTo(to, src[i]);
          ASSERT_TRUE(got[i] == want || (std::isnan(got[i]) && std::isnan(want))) << i << ": " << got[i] << " vs " << want;
        }
      }
  }
}

TEST_P(OpTest, CastRejectsIntegers) {
  auto x = Out(*be_, {4}, DType::kI32), y = Out(*be_, {4}, DType::kF32);
  EXPECT_THAT(std::string(be_->Cast(x, y).message()), HasSubstr("i32 -> f32"));
}

TEST_P(OpTest, RmsNormForwardAndBackward) {
  Rng rng(seed_);
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {17, 33}, {64, 1000}, {5, 4097}, {2, 8192},
                              {33, 2048}, {9, 512}, {3, 4096}, {4099, 256}}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(t) << " rows=" << rows << " cols=" << cols << " seed=" << seed_);
      auto xv = Quantize(rng.Normal(rows * cols), t), wv = Quantize(rng.Normal(cols, 0.5f), t);
      auto dyv = Quantize(rng.Normal(rows * cols), t);
      auto x = Make(*be_, {rows, cols}, t, xv), w = Make(*be_, {cols}, t, wv), dy = Make(*be_, {rows, cols}, t, dyv);
      auto y = Out(*be_, {rows, cols}, t), rstd = Out(*be_, {rows}, DType::kF32);
      ASSERT_TRUE(be_->RmsNormForward(x, w, 1e-5f, y, rstd).ok());
      auto dx = Out(*be_, {rows, cols}, t), dw = Out(*be_, {cols}, DType::kF32);
      ASSERT_TRUE(be_->RmsNormBackward(dy, x, w, rstd, dx, dw).ok());
      if (cpu() && t == DType::kF32) {
        std::vector<double> rs;
        EXPECT_LT(RelErr(Read(*be_, y), RmsNormRef(xv, wv, rows, cols, 1e-5, &rs)), 1e-6);
        EXPECT_LT(RelErr(Read(*be_, rstd), rs), 1e-6);
      } else {
        auto rx = Make(*ref_, {rows, cols}, t, xv), rw = Make(*ref_, {cols}, t, wv), rdy = Make(*ref_, {rows, cols}, t, dyv);
        auto ry = Out(*ref_, {rows, cols}, t), rr = Out(*ref_, {rows}, DType::kF32);
        auto rdx = Out(*ref_, {rows, cols}, t), rdw = Out(*ref_, {cols}, DType::kF32);
        ASSERT_TRUE(ref_->RmsNormForward(rx, rw, 1e-5f, ry, rr).ok());
        ASSERT_TRUE(ref_->RmsNormBackward(rdy, rx, rw, rr, rdx, rdw).ok());
        EXPECT_LT(RelErr(Read(*be_, y), Read(*ref_, ry)), Tol(t));
        EXPECT_LT(RelErr(Read(*be_, rstd), Read(*ref_, rr)), 1e-5);
        // dx = rs*dy*w - x*rs^3*mean(dy*w*x) cancels (completely as cols -> 1): measure its
        // error against the size of the first term, not of the (possibly tiny) result.
        auto rsv = Read(*ref_, rr);
        std::vector<float> term(rows * cols);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) term[r * cols + c] = rsv[r] * dyv[r * cols + c] * wv[c];
        EXPECT_LT(ErrOverScale(Read(*be_, dx), Read(*ref_, rdx), term), Tol(t));
        EXPECT_LT(RelErr(Read(*be_, dw), Read(*ref_, rdw)), t == DType::kBF16 ? Tol(t) : 1e-5);
      }
      // With `add` = dx itself (a residual's gradient in place): dx + the same backward,
      // rounded once (the unfused sum rounds twice in bf16: within a few ulp).
      auto addv = Quantize(rng.Normal(rows * cols), t);
      auto dx2 = Make(*be_, {rows, cols}, t, addv), dw2 = Out(*be_, {cols}, DType::kF32);
      ASSERT_TRUE(be_->RmsNormBackward(dy, x, w, rstd, dx2, dw2, &dx2).ok());
      std::vector<float> want = Read(*be_, dx);
      for (size_t i = 0; i < want.size(); ++i) want[i] += addv[i];
      EXPECT_LT(RelErr(Read(*be_, dx2), want), t == DType::kBF16 ? 1e-2 : 1e-6);
      // The CPU sums dw in one order both times; CUDA sums it with atomics, in an order
      // that varies from run to run (4099 rows: 1.3e-6 apart once on H100).
      EXPECT_LT(RelErr(Read(*be_, dw2), Read(*be_, dw)), cpu() ? 1e-6 : 1e-5);
    }
  }
}

// Finite differences (double) for the CPU backward: L = sum(y * r).
TEST_P(OpTest, RmsNormBackwardMatchesFiniteDifferences) {
  if (!cpu()) GTEST_SKIP() << "finite differences check the CPU reference";
  Rng rng(seed_);
  const int64_t rows = 3, cols = 11;
  auto xv = rng.Normal(rows * cols), wv = rng.Normal(cols), rv = rng.Normal(rows * cols);
  auto x = Make(*be_, {rows, cols}, DType::kF32, xv), w = Make(*be_, {cols}, DType::kF32, wv);
  auto dy = Make(*be_, {rows, cols}, DType::kF32, rv);
  auto y = Out(*be_, {rows, cols}, DType::kF32), rstd = Out(*be_, {rows}, DType::kF32);
  auto dx = Out(*be_, {rows, cols}, DType::kF32), dw = Out(*be_, {cols}, DType::kF32);
  ASSERT_TRUE(be_->RmsNormForward(x, w, 1e-5f, y, rstd).ok());
  ASSERT_TRUE(be_->RmsNormBackward(dy, x, w, rstd, dx, dw).ok());
  auto loss = [&](const std::vector<float>& xx, const std::vector<float>& ww) {
    auto yy = RmsNormRef(xx, ww, rows, cols, 1e-5);
    double l = 0;
    for (size_t i = 0; i < yy.size(); ++i) l += yy[i] * rv[i];
    return l;
  };
  const double h = 1e-3;
  std::vector<double> ndx(xv.size()), ndw(wv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    auto p = xv, m = xv;
    p[i] += h, m[i] -= h;
    ndx[i] = (loss(p, wv) - loss(m, wv)) / (2 * h);
  }
  for (size_t i = 0; i < wv.size(); ++i) {
    auto p = wv, m = wv;
    p[i] += h, m[i] -= h;
    ndw[i] = (loss(xv, p) - loss(xv, m)) / (2 * h);
  }
  EXPECT_LT(RelErr(Read(*be_, dx), ndx), 1e-4) << "seed " << seed_;
  EXPECT_LT(RelErr(Read(*be_, dw), ndw), 1e-4) << "seed " << seed_;
}

TEST_P(OpTest, SwiGluForwardAndBackward) {
  Rng rng(seed_);
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int64_t n : {1, 7, 1000, 65536, 65537}) {  // 1000 and 65536: the 16-byte-vector path
      SCOPED_TRACE(::testing::Message() << DTypeName(t) << " n=" << n << " seed=" << seed_);
      auto gv = Quantize(rng.Normal(n, 2.f), t), uv = Quantize(rng.Normal(n), t), dv = Quantize(rng.Normal(n), t);
      auto g = Make(*be_, {n}, t, gv), u = Make(*be_, {n}, t, uv), dy = Make(*be_, {n}, t, dv);
      auto y = Out(*be_, {n}, t), dg = Out(*be_, {n}, t), du = Out(*be_, {n}, t);
      ASSERT_TRUE(be_->SwiGluForward(g, u, y).ok());
      ASSERT_TRUE(be_->SwiGluBackward(dy, g, u, dg, du).ok());
      std::vector<double> ry(n), rdg(n), rdu(n);
      for (int64_t i = 0; i < n; ++i) {
        double s = 1 / (1 + std::exp(-double(gv[i])));
        ry[i] = Silu(gv[i]) * uv[i];
        rdg[i] = dv[i] * uv[i] * s * (1 + gv[i] * (1 - s));
        rdu[i] = dv[i] * Silu(gv[i]);
      }
      double tol = t == DType::kBF16 ? 2e-2 : 1e-5;
      EXPECT_LT(RelErr(Read(*be_, y), ry), tol);
      EXPECT_LT(RelErr(Read(*be_, dg), rdg), tol);
      EXPECT_LT(RelErr(Read(*be_, du), rdu), tol);
      // The backward rebuilding y (a model that dropped it), in place over dy: y bit for
      // bit the forward's, the gradients unchanged.
      auto dy2 = Make(*be_, {n}, t, dv), dg2 = Out(*be_, {n}, t), du2 = Out(*be_, {n}, t);
      ASSERT_TRUE(be_->SwiGluBackward(dy2, g, u, dg2, du2, &dy2).ok());
      EXPECT_EQ(Read(*be_, dy2), Read(*be_, y));
      EXPECT_EQ(Read(*be_, dg2), Read(*be_, dg));
      EXPECT_EQ(Read(*be_, du2), Read(*be_, du));
    }
  }
  auto small = Out(*be_, {3}, DType::kF32), other = Out(*be_, {4}, DType::kF32);
  EXPECT_THAT(std::string(be_->SwiGluBackward(small, small, small, small, small, &other).message()), HasSubstr("y"));
  // Finite differences of the double forward confirm the derivative formula.
  double g0 = 0.7, u0 = -1.3, h = 1e-5, s = 1 / (1 + std::exp(-g0));
  EXPECT_NEAR((Silu(g0 + h) - Silu(g0 - h)) / (2 * h) * u0, u0 * s * (1 + g0 * (1 - s)), 1e-8);
}

TEST_P(OpTest, Gemm) {
  Rng rng(seed_);
  struct G { int64_t m, n, k; };
  // (input, output) dtypes: bf16 -> f32 is the weight gradient accumulated into an f32
  // main gradient (only the input rounding: f32 tolerance).
  for (auto [t, ct] : {std::pair{DType::kF32, DType::kF32}, {DType::kBF16, DType::kBF16}, {DType::kBF16, DType::kF32}}) {
    for (G g : {G{1, 1, 1}, G{7, 5, 3}, G{33, 17, 65}, G{128, 256, 64}, G{100, 300, 257}}) {
      for (int tr = 0; tr < 4; ++tr) {
        bool ta = tr & 1, tb = tr & 2;
        SCOPED_TRACE(::testing::Message() << DTypeName(t) << "->" << DTypeName(ct) << " m=" << g.m << " n=" << g.n << " k=" << g.k << " ta=" << ta
                                          << " tb=" << tb << " seed=" << seed_);
        auto av = Quantize(rng.Normal(g.m * g.k), t), bv = Quantize(rng.Normal(g.k * g.n), t);
        auto cv = Quantize(rng.Normal(g.m * g.n), ct);
        std::vector<int64_t> as = ta ? std::vector<int64_t>{g.k, g.m} : std::vector<int64_t>{g.m, g.k};
        std::vector<int64_t> bs = tb ? std::vector<int64_t>{g.n, g.k} : std::vector<int64_t>{g.k, g.n};
        auto a = Make(*be_, as, t, av), b = Make(*be_, bs, t, bv), c = Make(*be_, {g.m, g.n}, ct, cv);
        ASSERT_TRUE(be_->Gemm(a, ta, b, tb, c, 0.5f, 0.25f).ok());
        // The sums can cancel (at k = 1 one product against 0.25 c): errors are measured
        // against the size of the terms.
        std::vector<float> ref(g.m * g.n), scale(g.m * g.n);
        for (int64_t i = 0; i < g.m; ++i)
          for (int64_t j = 0; j < g.n; ++j) {
            double acc = 0, mag = 0;
            for (int64_t p = 0; p < g.k; ++p) {
              const double x = double(av[ta ? p * g.m + i : i * g.k + p]) * bv[tb ? j * g.k + p : p * g.n + j];
              acc += x, mag += std::abs(x);
            }
            ref[i * g.n + j] = static_cast<float>(0.5 * acc + 0.25 * cv[i * g.n + j]);
            scale[i * g.n + j] = static_cast<float>(0.5 * mag + 0.25 * std::abs(cv[i * g.n + j]));
          }
        const double tol = ct == DType::kBF16 ? 2e-2 : 1e-5;
        EXPECT_LT(ErrOverScale(Read(*be_, c), ref, scale), tol);
        // c_in: the same sum into a write-only c (poisoned: every element must be written).
        auto c_in = Make(*be_, {g.m, g.n}, ct, cv), c2 = Out(*be_, {g.m, g.n}, ct);
        ASSERT_TRUE(be_->Gemm(a, ta, b, tb, c2, 0.5f, 0.25f, &c_in).ok());
        EXPECT_LT(ErrOverScale(Read(*be_, c2), ref, scale), tol);
        EXPECT_EQ(Read(*be_, c_in), std::vector<float>(cv.begin(), cv.end()));
      }
    }
  }
}

// Independent GEMMs in one Gemms call (CUDA: at once, on side streams with their own
// workspaces) compute what each computes alone, bit for bit — two, three (a layer's q, k
// and v), and four (more than the side streams: one after another); a call that is not
// independent of another, or not a GEMM, is refused by its index before anything runs.
TEST_P(OpTest, GemmsEqualEachGemmAlone) {
  Rng rng(seed_);
  for (DType t : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(::testing::Message() << DTypeName(t) << " seed=" << seed_);
    const int64_t m = 24, k = 96;
    auto x = Make(*be_, {m, k}, t, Quantize(rng.Normal(m * k), t));
    const std::vector<int64_t> ns = {64, 16, 16, 40};
    std::vector<Tensor> w, alone, together;
    for (int64_t n : ns) {
      w.push_back(Make(*be_, {n, k}, t, Quantize(rng.Normal(n * k), t)));
      alone.push_back(Out(*be_, {m, n}, t));
      ASSERT_TRUE(be_->Gemm(x, false, w.back(), true, alone.back()).ok());
    }
    for (size_t count : {size_t(2), size_t(3), size_t(4)}) {
      std::vector<Backend::GemmCall> calls;
      together.clear();
      for (size_t i = 0; i < count; ++i) together.push_back(Out(*be_, {m, ns[i]}, t));
      for (size_t i = 0; i < count; ++i) calls.push_back({&x, false, &w[i], true, &together[i]});
      ASSERT_TRUE(be_->Gemms(calls).ok()) << count;
      for (size_t i = 0; i < count; ++i) EXPECT_EQ(Read(*be_, together[i]), Read(*be_, alone[i])) << count << " calls, #" << i;
    }
    // c of one call is the a of another (two rows of one tensor): refused, nothing written.
    auto both = Make(*be_, {2 * m, k}, t, Quantize(rng.Normal(2 * m * k), t));
    auto top = *both.Slice(0, 0, m), bottom = *both.Slice(0, m, m);
    auto sq = Make(*be_, {k, k}, t, Quantize(rng.Normal(k * k), t));
    const auto before = Read(*be_, both);
    const Backend::GemmCall dependent[2] = {{&top, false, &sq, false, &bottom}, {&bottom, false, &sq, false, &top}};
    EXPECT_THAT(std::string(be_->Gemms(dependent).message()), HasSubstr("gemms[0]: c overlaps gemms[1]'s a"));
    EXPECT_EQ(Read(*be_, both), before);
    auto wrong = Out(*be_, {m, 5}, t);
    const Backend::GemmCall bad_shape[2] = {{&x, false, &w[0], true, &together[0]}, {&x, false, &w[1], true, &wrong}};
    EXPECT_THAT(std::string(be_->Gemms(bad_shape).message()), HasSubstr("gemms[1]"));
    const Backend::GemmCall missing[1] = {{&x, false, nullptr, true, &together[0]}};
    EXPECT_THAT(std::string(be_->Gemms(missing).message()), HasSubstr("gemms[0]: a, b and c must be given"));
  }
}

// TESSERA_GEMM_TUNE: a shape's first call times cuBLASLt's candidates into a scratch
// output; the call's C (beta 1: a gradient accumulating) must get the product once, and
// the kept plan's next call once more.
TEST_P(OpTest, GemmTuningAccumulatesOnce) {
  if (cpu()) GTEST_SKIP() << "tuning is cuBLASLt's";
  Rng rng(seed_);
  const int64_t m = 1024, n = 1024, k = 512;  // 1.07 GFLOP: past the tuning threshold
  auto av = Quantize(rng.Normal(m * k), DType::kBF16), bv = Quantize(rng.Normal(n * k), DType::kBF16);
  auto cv = rng.Normal(m * n);
  std::vector<float> prod(m * n, 0.f);
  ASSERT_TRUE(kernels::GemmCpu(av.data(), true, bv.data(), false, prod.data(), m, n, k, 1.f, 0.f, DType::kF32,
                               DType::kF32).ok());
  kernels::SetGemmTuning(true);
  auto a = Make(*be_, {k, m}, DType::kBF16, av), b = Make(*be_, {k, n}, DType::kBF16, bv);
  auto c = Make(*be_, {m, n}, DType::kF32, cv);
  for (int call = 1; call <= 2; ++call) {
    SCOPED_TRACE(::testing::Message() << "call " << call << " seed=" << seed_);
    ASSERT_TRUE(be_->Gemm(a, true, b, false, c, 1.f, 1.f).ok());
    std::vector<double> ref(m * n);
    for (int64_t i = 0; i < m * n; ++i) ref[i] = double(cv[i]) + call * double(prod[i]);
    EXPECT_LT(RelErr(Read(*be_, c), ref), 1e-5);
  }
  kernels::SetGemmTuning(false);
}

TEST_P(OpTest, AdamW) {
  Rng rng(seed_);
  // On CUDA also a size past one grid-stride pass of the 16-byte vector kernel.
  std::vector<int64_t> sizes = {1, 1000, 4097};
  if (!cpu()) sizes.push_back((int64_t(9) << 20) + 4);
  for (DType gt : {DType::kF32, DType::kBF16}) {
    for (int64_t n : sizes) {
      SCOPED_TRACE(::testing::Message() << "grad " << DTypeName(gt) << " n=" << n << " seed=" << seed_);
      auto pv = rng.Normal(n), gv = Quantize(rng.Normal(n), gt), mv = rng.Normal(n, 0.1f), vv = rng.Normal(n, 0.1f);
      for (auto& x : vv) x = x * x;
      AdamWParams hp{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 7};
      hp.grad_scale = 0.625f;  // clipping, fused: g is scaled first
      auto p = Make(*be_, {n}, DType::kF32, pv), g = Make(*be_, {n}, gt, gv), m = Make(*be_, {n}, DType::kF32, mv);
      auto v = Make(*be_, {n}, DType::kF32, vv);
      auto lowp = Out(*be_, {n}, DType::kBF16);
      ASSERT_TRUE(be_->AdamW(p, g, m, v, hp, &lowp).ok());
      // Reference in double with the same (float) hyperparameters. Errors are measured
      // per element against the magnitude of the terms, since m = b1 m + (1-b1) g can cancel.
      std::vector<double> rp(n), rm(n), rv(n), sp(n), sm(n), sv(n);
      const double b1 = hp.beta1, b2 = hp.beta2, lr = hp.lr, wd = hp.weight_decay, eps = hp.eps;
      double bc1 = 1 - std::pow(b1, 7), bc2 = 1 - std::pow(b2, 7);
      for (int64_t i = 0; i < n; ++i) {
        const double gi = double(gv[i]) * hp.grad_scale;
        rm[i] = b1 * mv[i] + (1 - b1) * gi;
        rv[i] = b2 * vv[i] + (1 - b2) * gi * gi;
        double upd = (rm[i] / bc1) / (std::sqrt(rv[i] / bc2) + eps);
        rp[i] = pv[i] - lr * (upd + wd * pv[i]);
        sm[i] = std::abs(b1 * mv[i]) + std::abs((1 - b1) * gi);
        sv[i] = std::abs(rv[i]);
        // The update's scale carries m's term magnitude through the division: where m
        // cancels and v is tiny, m's rounding error divided by sqrt(v) is what p sees.
        const double den = std::sqrt(rv[i] / bc2) + eps;
        sp[i] = std::abs(pv[i]) + lr * (std::abs(upd) + (sm[i] / bc1) / den + std::abs(wd * pv[i]));
      }
      auto close = [&](const std::vector<float>& got, const std::vector<double>& ref, const std::vector<double>& sc) {
        double worst = 0;
        for (int64_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(got[i] - ref[i]) / std::max(sc[i], 1e-30));
        return worst;
      };
      // CPU: double, one rounding to f32 (1e-6). CUDA: ~10 f32 roundings plus sqrtf and a
      // division in the update (seen up to 1.2e-6 in 40 runs on H200): 5e-6.
      const double tol = cpu() ? 1e-6 : 5e-6;
      auto gp = Read(*be_, p);
      EXPECT_LT(close(gp, rp, sp), tol);
      EXPECT_LT(close(Read(*be_, m), rm, sm), tol);
      EXPECT_LT(close(Read(*be_, v), rv, sv), tol);
      auto lp = Read(*be_, lowp);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(lp[i], Bf16ToFloat(FloatToBf16(gp[i])));
    }
  }
}

TEST_P(OpTest, EmbeddingVocabParallel) {
  Rng rng(seed_);
  std::uniform_int_distribution<int32_t> id(0, 99);
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int64_t hidden : {1, 7, 256}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(t) << " hidden=" << hidden << " seed=" << seed_);
      // Vocab 100 split in two shards of 50; 33 tokens with repeats.
      std::vector<int32_t> ids(33);
      for (auto& x : ids) x = id(rng.gen);
      ids[1] = ids[0];
      auto tv = Quantize(rng.Normal(100 * hidden), t), dv = Quantize(rng.Normal(33 * hidden), t);
      const std::vector<float> prior = rng.Normal(100 * hidden);
      std::vector<double> sum_out(33 * hidden, 0.0), dtab(100 * hidden, 0.0);
      for (int shard = 0; shard < 2; ++shard) {
        std::vector<float> part(tv.begin() + shard * 50 * hidden, tv.begin() + (shard + 1) * 50 * hidden);
        auto ids_t = Ints(*be_, ids);
        auto table = Make(*be_, {50, hidden}, t, part), out = Out(*be_, {33, hidden}, t);
        ASSERT_TRUE(be_->EmbeddingForward(ids_t, table, shard * 50, out).ok());
        auto o = Read(*be_, out);
        for (size_t k = 0; k < o.size(); ++k) sum_out[k] += o[k];
        // The backward adds to dtable (a gradient accumulated over micro-batches): start
        // from values already there.
        std::vector<float> before(prior.begin() + shard * 50 * hidden, prior.begin() + (shard + 1) * 50 * hidden);
        auto dout = Make(*be_, {33, hidden}, t, dv), dtable = Make(*be_, {50, hidden}, DType::kF32, before);
        ASSERT_TRUE(be_->EmbeddingBackward(ids_t, dout, shard * 50, dtable).ok());
        auto d = Read(*be_, dtable);
        for (size_t k = 0; k < d.size(); ++k) dtab[shard * 50 * hidden + k] = d[k];
      }
      // The all-reduce of the shards' outputs is the full lookup; dtable sums repeats.
      std::vector<double> want(33 * hidden), wantd(prior.begin(), prior.end());
      for (int i = 0; i < 33; ++i)
        for (int64_t h = 0; h < hidden; ++h) {
          want[i * hidden + h] = tv[ids[i] * hidden + h];
          wantd[ids[i] * hidden + h] += dv[i * hidden + h];
        }
      std::vector<float> got(sum_out.begin(), sum_out.end()), gotd(dtab.begin(), dtab.end());
      EXPECT_EQ(RelErr(got, want), 0.0);
      EXPECT_LT(RelErr(gotd, wantd), 1e-6);
    }
  }
}

TEST_P(OpTest, RopeWithExplicitPositions) {
  Rng rng(seed_);
  std::uniform_int_distribution<int32_t> posd(0, 16383);
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (auto [tokens, heads, dim] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 2}, {5, 3, 64}, {33, 8, 128}}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(t) << " tokens=" << tokens << " heads=" << heads << " dim=" << dim
                                        << " seed=" << seed_);
      std::vector<int32_t> pos(tokens);
      for (auto& p : pos) p = posd(rng.gen);
      auto xv = Quantize(rng.Normal(tokens * heads * dim), t);
      auto x = Make(*be_, {tokens, heads, dim}, t, xv), p = Ints(*be_, pos), y = Out(*be_, {tokens, heads, dim}, t);
      // The frequencies of some rope scaling (any table) and YaRN's cos/sin factor.
      const int64_t half = dim / 2;
      std::vector<float> inv(half);
      for (int64_t i = 0; i < half; ++i) inv[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / dim) / (i % 3 == 1 ? 4 : 1));
      const float scale = dim == 64 ? 1.1386294f : 1.f;
      ASSERT_TRUE(be_->Rope(x, p, inv, scale, y).ok());
      std::vector<double> ref(xv.size());
      for (int64_t tok = 0; tok < tokens; ++tok)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t i = 0; i < half; ++i) {
            const double ang = static_cast<float>(pos[tok]) * inv[i];  // the angle rounded to f32, as transformers forms it
            const double c = scale * std::cos(ang), sn = scale * std::sin(ang);
            int64_t o = (tok * heads + h) * dim;
            ref[o + i] = xv[o + i] * c - xv[o + i + half] * sn;
            ref[o + i + half] = xv[o + i + half] * c + xv[o + i] * sn;
          }
      auto yv = Read(*be_, y);
      EXPECT_LT(RelErr(yv, ref), t == DType::kBF16 ? 1e-2 : 1e-6);
      auto back = Out(*be_, {tokens, heads, dim}, t);
      ASSERT_TRUE(be_->Rope(y, p, inv, 1.f / scale, back, /*inverse=*/true).ok());
      EXPECT_LT(RelErr(Read(*be_, back), xv), t == DType::kBF16 ? 1e-2 : 1e-6);  // a rotation is undone by its inverse
    }
  }
}

// RoPE on head columns of wider rows (a fused Q|K|V projection: [tokens, q + k + v heads,
// dim]), read from one such view and written into another: the rotated heads equal
// RoPE of a contiguous copy, and nothing outside the output view is touched.
TEST_P(OpTest, RopeOnHeadColumnsOfWiderRows) {
  Rng rng(seed_);
  std::uniform_int_distribution<int32_t> posd(0, 8191);
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (auto [tokens, total, from, heads, dim] :
         {std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>{33, 12, 8, 2, 64}, {5, 12, 0, 8, 64}, {7, 5, 1, 3, 128}}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(t) << " tokens=" << tokens << " heads " << from << ".." << from + heads
                                        << " of " << total << " dim=" << dim << " seed=" << seed_);
      std::vector<int32_t> pos(tokens);
      for (auto& p : pos) p = posd(rng.gen);
      auto wide_v = Quantize(rng.Normal(tokens * total * dim), t);
      auto wide = Make(*be_, {tokens, total, dim}, t, wide_v), p = Ints(*be_, pos);
      std::vector<float> sentinel(tokens * (total + 1) * dim, 7.f);
      auto out = Make(*be_, {tokens, total + 1, dim}, t, sentinel);  // written at heads 1..heads
      auto x = wide.Slice(1, from, heads), y = out.Slice(1, 1, heads);
      ASSERT_TRUE(x.ok() && y.ok());
      std::vector<float> inv(dim / 2);
      for (int64_t i = 0; i < dim / 2; ++i) inv[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / dim));
      ASSERT_TRUE(be_->Rope(*x, p, inv, 1.f, *y).ok());
      std::vector<float> xv(tokens * heads * dim);
      for (int64_t tok = 0; tok < tokens; ++tok)
        for (int64_t k = 0; k < heads * dim; ++k) xv[tok * heads * dim + k] = wide_v[(tok * total + from) * dim + k];
      auto xc = Make(*be_, {tokens, heads, dim}, t, xv), yc = Out(*be_, {tokens, heads, dim}, t);
      ASSERT_TRUE(be_->Rope(xc, p, inv, 1.f, yc).ok());
      auto want = Read(*be_, yc), got = Read(*be_, out);
      std::vector<float> rotated(want.size());
      for (int64_t tok = 0; tok < tokens; ++tok)
        for (int64_t h = 0; h <= total; ++h)
          for (int64_t i = 0; i < dim; ++i) {
            const float g = got[(tok * (total + 1) + h) * dim + i];
            if (h >= 1 && h <= heads) rotated[(tok * heads + h - 1) * dim + i] = g;
            else ASSERT_EQ(g, 7.f) << "token " << tok << " head " << h << " outside the view was written";
          }
      EXPECT_LT(RelErr(rotated, want), t == DType::kBF16 ? 1e-2 : 1e-6);
    }
  }
  auto y = Out(*be_, {4, 4, 8}, DType::kF32);
  auto p = Ints(*be_, std::vector<int32_t>(4, 1));
  auto cols = y.Slice(2, 0, 4);  // half of each head: not a head
  ASSERT_TRUE(cols.ok());
  auto xh = Out(*be_, {4, 4, 4}, DType::kF32);
  const std::vector<float> inv2(2, 1.f);
  EXPECT_THAT(std::string(be_->Rope(xh, p, inv2, 1.f, *cols).message()), HasSubstr("heads must be contiguous"));
  EXPECT_THAT(std::string(be_->Rope(xh, p, std::vector<float>(3, 1.f), 1.f, xh).message()),
              HasSubstr("inv_freq holds 3 frequencies; head dim 4 needs 2"));
}

TEST_P(OpTest, CrossEntropyVocabParallel) {
  Rng rng(seed_);
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (auto [n, vocab] : {std::pair<int64_t, int64_t>{1, 2}, {7, 1000}, {3, 128256}}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(t) << " n=" << n << " vocab=" << vocab << " seed=" << seed_);
      auto zv = Quantize(rng.Normal(n * vocab, 3.f), t);
      std::vector<int32_t> tg(n);
      std::uniform_int_distribution<int32_t> td(0, vocab - 1);
      for (auto& x : tg) x = td(rng.gen);
      // Two shards of the vocabulary (the second may be larger for odd sizes).
      int64_t v0 = vocab / 2, v1 = vocab - v0;
      std::vector<std::vector<std::vector<float>>> shards;
      std::vector<std::pair<int64_t, int64_t>> ranges = {{0, v0}, {v0, v1}};
      if (v0 == 0) ranges = {{0, vocab}};
      std::vector<Tensor> shard_logits;
      auto targets = Ints(*be_, tg);
      for (auto [start, len] : ranges) {
        std::vector<float> part(n * len);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < len; ++j) part[i * len + j] = zv[i * vocab + start + j];
        auto z = Make(*be_, {n, len}, t, part);
        auto mx = Out(*be_, {n}, DType::kF32), sm = Out(*be_, {n}, DType::kF32), dt = Out(*be_, {n}, DType::kF32),
             tgt = Out(*be_, {n}, DType::kF32);
        ASSERT_TRUE(be_->CrossEntropyPartials(z, targets, start, mx, sm, dt, tgt).ok());
        shards.push_back({Read(*be_, mx), Read(*be_, sm), Read(*be_, dt), Read(*be_, tgt)});
        shard_logits.push_back(z);
      }
      auto res = kernels::CombineCrossEntropy(shards);
      // Reference in double from the full logits.
      std::vector<double> loss(n), ent(n), lse(n);
      for (int64_t i = 0; i < n; ++i) {
        double m = -INFINITY;
        for (int64_t j = 0; j < vocab; ++j) m = std::max(m, double(zv[i * vocab + j]));
        double S = 0, D = 0;
        for (int64_t j = 0; j < vocab; ++j) {
          double e = std::exp(zv[i * vocab + j] - m);
          S += e;
          D += e * zv[i * vocab + j];
        }
        lse[i] = m + std::log(S);
        loss[i] = lse[i] - zv[i * vocab + tg[i]];
        ent[i] = lse[i] - D / S;
      }
      double tol = cpu() ? 1e-6 : 1e-5;  // partials are f32 on every backend; bf16 inputs are exact
      EXPECT_LT(RelErr(res.lse, lse), tol);
      EXPECT_LT(RelErr(res.loss, loss), cpu() ? 1e-5 : 1e-4);
      EXPECT_LT(RelErr(res.entropy, ent), cpu() ? 1e-5 : 1e-4);
      for (int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(res.logprob[i], -res.loss[i]);
      // Backward per shard with the global lse, against the closed form.
      std::vector<float> dl = rng.Normal(n);
      auto lse_t = Make(*be_, {n}, DType::kF32, res.lse), dloss = Make(*be_, {n}, DType::kF32, dl);
      for (size_t k = 0; k < ranges.size(); ++k) {
        auto [start, len] = ranges[k];
        auto dz = Out(*be_, {n, len}, t);
        ASSERT_TRUE(be_->CrossEntropyBackward(shard_logits[k], targets, start, lse_t, dloss, dz).ok());
        // p - onehot cancels as p -> 1 at the target: measure against |dloss| (p + onehot).
        std::vector<float> ref(n * len), scale(n * len);
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < len; ++j) {
            double pj = std::exp(zv[i * vocab + start + j] - lse[i]), hot = start + j == tg[i] ? 1.0 : 0.0;
            ref[i * len + j] = static_cast<float>(dl[i] * (pj - hot));
            scale[i * len + j] = static_cast<float>(std::abs(dl[i]) * (pj + hot));
          }
        EXPECT_LT(ErrOverScale(Read(*be_, dz), ref, scale), t == DType::kBF16 ? 2e-2 : (cpu() ? 1e-6 : 1e-5));
      }
    }
  }
}

// The loss from whole-vocabulary partials: lse and dloss per token (zero where the
// target is -1) and the sum of lse - tgt added to what loss_sum held, against double.
TEST_P(OpTest, CrossEntropyLossFromPartials) {
  Rng rng(seed_);
  for (int64_t n : {1, 7, 1025, 5000}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " seed=" << seed_);
    auto mx = rng.Normal(n, 3.f), tg = rng.Normal(n, 3.f), sm = rng.Normal(n, 1.f);
    for (auto& x : sm) x = 1.f + 100.f * std::abs(x);  // a sum of exp(z - max): >= 1
    std::vector<int32_t> targets(n);
    std::uniform_int_distribution<int32_t> td(-1, 9);  // ~1 in 11 not counted
    for (auto& x : targets) x = td(rng.gen);
    auto lse = Out(*be_, {n}, DType::kF32), dl = Out(*be_, {n}, DType::kF32);
    auto loss = Make(*be_, {1}, DType::kF32, {1.5f});
    ASSERT_TRUE(be_->CrossEntropyLoss(Make(*be_, {n}, DType::kF32, mx), Make(*be_, {n}, DType::kF32, sm),
                                      Make(*be_, {n}, DType::kF32, tg), Ints(*be_, targets), 0.25f, lse, dl, loss).ok());
    std::vector<double> want_dl(n);
    std::vector<float> want_lse(n), terms(n);
    double total = 1.5;
    for (int64_t i = 0; i < n; ++i) {
      if (targets[i] < 0) continue;
      const double l = mx[i] + std::log(double(sm[i]));
      want_lse[i] = static_cast<float>(l);
      terms[i] = std::abs(mx[i]) + static_cast<float>(std::log(double(sm[i])));
      want_dl[i] = 0.25;
      total += l - tg[i];
    }
    // max + log(sum) cancels where the max is near -log(sum): f32 rounds each term, so the
    // error is measured against the terms' size.
    EXPECT_LT(ErrOverScale(Read(*be_, lse), want_lse, terms), 1e-6);
    EXPECT_EQ(Read(*be_, dl), std::vector<float>(want_dl.begin(), want_dl.end()));
    EXPECT_NEAR(Read(*be_, loss)[0], total, 1e-6 * std::abs(total) + 1e-5);
  }
  // A vocab shard's sum rescaled to the all-reduced max.
  const std::vector<float> m = {0.f, -3.f, 2.5f}, gm = {1.f, -3.f, 4.f}, sv = {2.f, 7.f, 1.f};
  auto sum_t = Make(*be_, {3}, DType::kF32, sv);
  ASSERT_TRUE(be_->CrossEntropyRescale(Make(*be_, {3}, DType::kF32, m), Make(*be_, {3}, DType::kF32, gm), sum_t).ok());
  std::vector<double> want(3);
  for (int i = 0; i < 3; ++i) want[i] = sv[i] * std::exp(double(m[i]) - gm[i]);
  EXPECT_LT(RelErr(Read(*be_, sum_t), want), 1e-6);
  auto bad = Out(*be_, {2}, DType::kF32), one = Out(*be_, {3}, DType::kF32);
  EXPECT_FALSE(be_->CrossEntropyRescale(one, bad, one).ok());
  const absl::Status st = be_->CrossEntropyLoss(one, one, one, Ints(*be_, {0, 1, 2}), 1.f, one, one, bad);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("loss_sum"), std::string::npos) << st;
}

TEST_P(OpTest, CrossEntropyBackwardMatchesFiniteDifferences) {
  if (!cpu()) GTEST_SKIP() << "finite differences check the CPU reference";
  Rng rng(seed_);
  const int64_t n = 2, v = 9;
  auto zv = rng.Normal(n * v, 2.f);
  std::vector<int32_t> tg = {3, 8};
  auto loss = [&](const std::vector<float>& z) {
    double l = 0;
    for (int64_t i = 0; i < n; ++i) {
      double m = -INFINITY, S = 0;
      for (int64_t j = 0; j < v; ++j) m = std::max(m, double(z[i * v + j]));
      for (int64_t j = 0; j < v; ++j) S += std::exp(z[i * v + j] - m);
      l += (i + 1) * (m + std::log(S) - z[i * v + tg[i]]);  // dloss = (1, 2)
    }
    return l;
  };
  auto z = Make(*be_, {n, v}, DType::kF32, zv), targets = Ints(*be_, tg);
  auto mx = Out(*be_, {n}, DType::kF32), sm = Out(*be_, {n}, DType::kF32), dt = Out(*be_, {n}, DType::kF32),
       tgt = Out(*be_, {n}, DType::kF32);
  ASSERT_TRUE(be_->CrossEntropyPartials(z, targets, 0, mx, sm, dt, tgt).ok());
  auto res = kernels::CombineCrossEntropy({{Read(*be_, mx), Read(*be_, sm), Read(*be_, dt), Read(*be_, tgt)}});
  auto lse = Make(*be_, {n}, DType::kF32, res.lse), dl = Make(*be_, {n}, DType::kF32, {1.f, 2.f});
  auto dz = Out(*be_, {n, v}, DType::kF32);
  ASSERT_TRUE(be_->CrossEntropyBackward(z, targets, 0, lse, dl, dz).ok());
  const std::vector<double> num = CentralDifferences(zv, loss);
  EXPECT_LT(RelErr(Read(*be_, dz), num), 1e-4) << "seed " << seed_;
}

// The entropy term of the backward (RL's entropy bonus): on the CPU, central differences
// of L = sum_i dloss_i CE_i + u_i H_i; on every backend, against the CPU op over two
// vocabulary shards (each with the global lse and H), f32 and bf16, odd and
// vector-friendly widths; without the term the result is the plain backward's.
TEST_P(OpTest, CrossEntropyBackwardWithEntropy) {
  Rng rng(seed_);
  if (cpu()) {
    const int64_t n = 2, v = 9;
    auto zv = rng.Normal(n * v, 2.f);
    std::vector<int32_t> tg = {3, 8};
    const std::vector<float> dl = {1.f, 2.f}, u = {0.7f, -1.3f};
    auto loss = [&](const std::vector<float>& z) {
      double l = 0;
      for (int64_t i = 0; i < n; ++i) {
        double m = -INFINITY, S = 0, D = 0;
        for (int64_t j = 0; j < v; ++j) m = std::max(m, double(z[i * v + j]));
        for (int64_t j = 0; j < v; ++j) S += std::exp(z[i * v + j] - m), D += std::exp(z[i * v + j] - m) * z[i * v + j];
        const double lse = m + std::log(S), H = lse - D / S;
        l += dl[i] * (lse - z[i * v + tg[i]]) + u[i] * H;
      }
      return l;
    };
    auto z = Make(*be_, {n, v}, DType::kF32, zv), targets = Ints(*be_, tg);
    auto mx = Out(*be_, {n}, DType::kF32), sm = Out(*be_, {n}, DType::kF32), dt = Out(*be_, {n}, DType::kF32),
         tgt = Out(*be_, {n}, DType::kF32);
    ASSERT_TRUE(be_->CrossEntropyPartials(z, targets, 0, mx, sm, dt, tgt).ok());
    auto res = kernels::CombineCrossEntropy({{Read(*be_, mx), Read(*be_, sm), Read(*be_, dt), Read(*be_, tgt)}});
    auto lse = Make(*be_, {n}, DType::kF32, res.lse), dlt = Make(*be_, {n}, DType::kF32, dl),
         ut = Make(*be_, {n}, DType::kF32, u), ht = Make(*be_, {n}, DType::kF32, res.entropy);
    auto dz = Out(*be_, {n, v}, DType::kF32);
    ASSERT_TRUE(be_->CrossEntropyBackward(z, targets, 0, lse, dlt, dz, &ut, &ht).ok());
    const std::vector<double> num = CentralDifferences(zv, loss);
    EXPECT_LT(RelErr(Read(*be_, dz), num), 1e-4) << "seed " << seed_;
    EXPECT_THAT(std::string(be_->CrossEntropyBackward(z, targets, 0, lse, dlt, dz, &ut, nullptr).message()),
                HasSubstr("dentropy and entropy come together"));
  }
  for (DType t : {DType::kF32, DType::kBF16})
    for (int64_t v : {37, 1024}) {  // per shard
      SCOPED_TRACE(::testing::Message() << DTypeName(t) << " v=" << v);
      const int64_t n = 5;
      std::vector<int32_t> tg;
      for (int64_t i = 0; i < n; ++i) tg.push_back(static_cast<int32_t>((i * 7919) % (2 * v)));
      std::vector<float> lse(n), ent(n), dl(n), u(n);
      for (int64_t i = 0; i < n; ++i) lse[i] = 6.f + 0.1f * i, ent[i] = 3.f + 0.2f * i, dl[i] = 0.5f + i, u[i] = 1.5f - i;
      for (int shard = 0; shard < 2; ++shard) {
        const auto zv = Quantize(rng.Normal(n * v, 2.f), t);
        auto run = [&](runtime::Backend& b, bool with) {
          auto z = Make(b, {n, v}, t, zv), targets = Ints(b, tg), l = Make(b, {n}, DType::kF32, lse),
               d = Make(b, {n}, DType::kF32, dl), ut = Make(b, {n}, DType::kF32, u), ht = Make(b, {n}, DType::kF32, ent);
          auto dz = Out(b, {n, v}, t);
          auto st = with ? b.CrossEntropyBackward(z, targets, shard * v, l, d, dz, &ut, &ht)
                         : b.CrossEntropyBackward(z, targets, shard * v, l, d, dz);
          EXPECT_TRUE(st.ok()) << st;
          return Read(b, dz);
        };
        const auto got = run(*be_, true), want = run(*ref_, true), plain = run(*be_, false);
        EXPECT_LT(RelErr(got, want), t == DType::kF32 ? 1e-5 : 1e-2) << "shard " << shard;
        EXPECT_GT(RelErr(plain, want), 1e-2) << "the entropy term changed nothing";
        EXPECT_LT(RelErr(plain, run(*ref_, false)), t == DType::kF32 ? 1e-5 : 1e-2) << "without the term";
      }
    }
}

TEST_P(OpTest, SumSquaresAndScale) {
  Rng rng(seed_);
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int64_t n : {1, 1000, 1 << 20}) {
      SCOPED_TRACE(::testing::Message() << DTypeName(t) << " n=" << n << " seed=" << seed_);
      auto xv = Quantize(rng.Normal(n), t);
      auto x = Make(*be_, {n}, t, xv), out = Make(*be_, {1}, DType::kF32, {2.f});
      ASSERT_TRUE(be_->SumSquares(x, out).ok());
      double want = 2;
      for (float v : xv) want += double(v) * v;
      EXPECT_LT(RelErr(Read(*be_, out), std::vector<double>{want}), cpu() ? 1e-7 : 1e-5);
      ASSERT_TRUE(be_->Scale(x, 0.5f).ok());
      std::vector<double> half(xv.begin(), xv.end());
      for (auto& v : half) v *= 0.5;
      EXPECT_EQ(RelErr(Read(*be_, x), half), 0.0);  // scaling by a power of two is exact
    }
  }
}

// Backend::Copy between views (what weight sync re-slices TP shards with): a column block
// of a [rows, cols] matrix into a contiguous [rows, c] tensor and back into another
// column block; mismatches are refused naming the operands.
TEST_P(OpTest, CopyBetweenViews) {
  const int64_t rows = 37, cols = 24, c = 8;
  std::vector<float> v(rows * cols);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  auto whole = Make(*be_, {rows, cols}, DType::kF32, v);
  auto block = Make(*be_, {rows, c}, DType::kF32, std::vector<float>(rows * c, -1.f));
  auto src = whole.Slice(1, 2 * c, c);
  ASSERT_TRUE(src.ok());
  ASSERT_TRUE(be_->Copy(*src, block).ok());
  auto got = Read(*be_, block);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < c; ++k) ASSERT_EQ(got[r * c + k], v[r * cols + 2 * c + k]) << r << "," << k;
  auto dst = whole.Slice(1, 0, c);
  ASSERT_TRUE(be_->Copy(block, *dst).ok());
  got = Read(*be_, whole);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k)
      ASSERT_EQ(got[r * cols + k], v[r * cols + (k < c ? 2 * c + k : k)]) << r << "," << k;
  auto flat = Make(*be_, {rows * c}, DType::kF32, std::vector<float>(rows * c, 0.f));
  EXPECT_THAT(std::string(be_->Copy(block, flat).message()), ::testing::HasSubstr("must have the same shape"));
  auto bf = Make(*be_, {rows, c}, DType::kBF16, std::vector<float>(rows * c, 0.f));
  EXPECT_THAT(std::string(be_->Copy(block, bf).message()), ::testing::HasSubstr("src is f32 but dst is bf16"));
}

// Independent double reference: per sequence and head, full score matrix and softmax.
TEST_P(OpTest, AxpbyMixedDtypes) {
  Rng rng(seed_);
  for (DType tx : {DType::kF32, DType::kBF16})
    for (DType ty : {DType::kF32, DType::kBF16})
      for (int64_t n : {1, 1000, 65537}) {
        SCOPED_TRACE(::testing::Message() << DTypeName(tx) << " -> " << DTypeName(ty) << " n=" << n << " seed=" << seed_);
        auto xv = Quantize(rng.Normal(n), tx), yv = Quantize(rng.Normal(n), ty);
        auto x = Make(*be_, {n}, tx, xv), y = Make(*be_, {n}, ty, yv);
        ASSERT_TRUE(be_->Axpby(0.5f, x, -2.f, y).ok());
        std::vector<double> want(n);
        for (int64_t i = 0; i < n; ++i) want[i] = 0.5 * xv[i] - 2.0 * yv[i];
        // One rounding into y's dtype: bf16 keeps 8 mantissa bits (relative error <= 2^-9
        // per element); f32 arithmetic on CUDA vs double on the CPU.
        EXPECT_LT(RelErr(Read(*be_, y), want), ty == DType::kBF16 ? 4e-3 : (cpu() ? 1e-7 : 1e-6));
        // beta = 0 overwrites without reading y: poisoned (NaN) y must not leak through.
        auto z = Out(*be_, {n}, ty);
        ASSERT_TRUE(be_->Axpby(1.f, x, 0.f, z).ok());
        EXPECT_LT(RelErr(Read(*be_, z), std::vector<double>(xv.begin(), xv.end())), ty == DType::kBF16 ? 4e-3 : 1e-7);
      }
  auto a = *be_->Empty({4}, DType::kF32), b = *be_->Empty({5}, DType::kF32);
  EXPECT_THAT(std::string(be_->Axpby(1.f, a, 1.f, b).message()), HasSubstr("x [4] and y [5] must have the same shape"));
}

TEST_P(OpTest, ValidationNamesShapes) {
  auto x = *be_->Empty({4, 8}, DType::kF32), w = *be_->Empty({7}, DType::kF32), y = *be_->Empty({4, 8}, DType::kF32);
  auto r = *be_->Empty({4}, DType::kF32);
  EXPECT_THAT(std::string(be_->RmsNormForward(x, w, 1e-5f, y, r).message()), HasSubstr("w [7] must be [8]"));
  auto a = *be_->Empty({3, 5}, DType::kF32), b = *be_->Empty({4, 2}, DType::kF32), c = *be_->Empty({3, 2}, DType::kF32);
  EXPECT_THAT(std::string(be_->Gemm(a, false, b, false, c).message()),
              HasSubstr("inner dimensions differ: op(a) is [3, 5], op(b) is [4, 2]"));
  auto a2 = *be_->Empty({3, 4}, DType::kF32), c_in = *be_->Empty({2, 3}, DType::kF32);
  EXPECT_THAT(std::string(be_->Gemm(a2, false, b, false, c, 1.f, 1.f, &c_in).message()), HasSubstr("c_in"));
  auto w8 = *be_->Empty({8}, DType::kF32), dw8 = *be_->Empty({8}, DType::kF32), add = *be_->Empty({4, 9}, DType::kF32);
  EXPECT_THAT(std::string(be_->RmsNormBackward(x, x, w8, r, y, dw8, &add).message()), HasSubstr("add"));
  auto bf = *be_->Empty({4, 8}, DType::kBF16);
  EXPECT_THAT(std::string(be_->SwiGluForward(x, bf, y).message()), HasSubstr("gate is f32 but up is bf16"));
  auto col = *x.Slice(1, 2, 3);
  EXPECT_THAT(std::string(be_->Cast(col, col).message()), HasSubstr("is not contiguous"));
}

INSTANTIATE_TEST_SUITE_P(Backends, OpTest, ::testing::Values("cpu", "cuda"),
                         [](const auto& info) { return info.param; });

TEST(Tensor, SlicesAndAccounting) {
  auto* alloc = CpuAllocator();
  int64_t before = alloc->stats().current_bytes;
  {
    auto t = Tensor::Empty({4, 6}, DType::kF32, alloc);
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(alloc->stats().current_bytes - before, 96);
    for (int i = 0; i < 24; ++i) t->data_as<float>()[i] = i;
    auto rows = t->Slice(0, 1, 2);
    ASSERT_TRUE(rows.ok());
    EXPECT_TRUE(rows->contiguous());
    EXPECT_EQ(rows->data_as<float>()[0], 6);
    auto cols = t->Slice(1, 2, 2);
    EXPECT_FALSE(cols->contiguous());
    EXPECT_EQ(cols->data_as<float>()[0], 2);
    EXPECT_EQ(cols->strides()[0], 6);
    EXPECT_THAT(std::string(t->Slice(1, 5, 2).status().message()), HasSubstr("[5, 7) out of range for dim 1 of shape [4, 6]"));
    EXPECT_THAT(std::string(t->Reshape({5, 5}).status().message()), HasSubstr("[4, 6] has 24 elements, [5, 5] has 25"));
    EXPECT_FALSE(cols->Reshape({4}).ok());
    // Buffers of other dtypes inside one allocation: aligned, inside, of a contiguous one.
    auto ints = t->View(DType::kI64, {2, 3}, 40);
    ASSERT_TRUE(ints.ok()) << ints.status();
    EXPECT_EQ(ints->dtype(), DType::kI64);
    EXPECT_EQ(ints->strides()[0], 3);
    EXPECT_EQ(static_cast<char*>(ints->data()) - static_cast<char*>(t->data()), 40);
    EXPECT_THAT(std::string(t->View(DType::kI64, {2}, 4).status().message()), HasSubstr("[2] i64 at byte 4 does not fit aligned in 96"));
    EXPECT_FALSE(t->View(DType::kF32, {25}, 0).ok());
    EXPECT_FALSE(t->View(DType::kF32, {2}, 92).ok());
    EXPECT_THAT(std::string(cols->View(DType::kF32, {2}, 0).status().message()), HasSubstr("not contiguous"));
  }
  EXPECT_EQ(alloc->stats().current_bytes, before);
  EXPECT_GE(alloc->stats().peak_bytes, 96);
}

}  // namespace
}  // namespace tessera::runtime::test
