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
//    relative error would be meaningless): 1e-6 on the CPU (double), 5e-6 on CUDA (f32).
//  - Cancelling results (RMSNorm dx, cross-entropy dlogits at p -> 1) are measured
//    against the size of their terms, not of the result.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "kernels/cross_entropy/cross_entropy.h"
#include "worker/runtime/backend.h"

namespace tessera::runtime {
namespace {

using ::testing::HasSubstr;

struct Rng {
  explicit Rng(uint64_t seed) : gen(seed) {}
  std::vector<float> Normal(size_t n, float scale = 1.f) {
    std::normal_distribution<float> d(0.f, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = d(gen);
    return v;
  }
  std::mt19937_64 gen;
};

uint64_t Seed() {
  static uint64_t s = std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
  return s++;
}

// Rounds values through the dtype so that every backend and reference sees the same inputs.
std::vector<float> Quantize(std::vector<float> v, DType t) {
  if (t == DType::kBF16) for (auto& x : v) x = Bf16ToFloat(FloatToBf16(x));
  return v;
}

Tensor Make(Backend& b, std::vector<int64_t> shape, DType t, const std::vector<float>& vals) {
  auto ten = b.Empty(shape, t);
  EXPECT_TRUE(ten.ok()) << ten.status();
  std::vector<char> bytes(vals.size() * DTypeSize(t));
  for (size_t i = 0; i < vals.size(); ++i) {
    if (t == DType::kF32) std::memcpy(&bytes[i * 4], &vals[i], 4);
    else { uint16_t h = FloatToBf16(vals[i]); std::memcpy(&bytes[i * 2], &h, 2); }
  }
  EXPECT_TRUE(b.CopyFromHost(bytes.data(), *ten).ok());
  return *ten;
}

Tensor Ints(Backend& b, const std::vector<int32_t>& v) {
  auto t = b.Empty({static_cast<int64_t>(v.size())}, DType::kI32);
  EXPECT_TRUE(t.ok());
  EXPECT_TRUE(b.CopyFromHost(v.data(), *t).ok());
  return *t;
}

Tensor Out(Backend& b, std::vector<int64_t> shape, DType t) {
  auto ten = b.Empty(shape, t);
  EXPECT_TRUE(ten.ok());
  EXPECT_TRUE(b.Fill(*ten, 0xff).ok());  // poison
  return *ten;
}

std::vector<float> Read(Backend& b, const Tensor& t) {
  std::vector<char> bytes(t.nbytes());
  EXPECT_TRUE(b.CopyToHost(t, bytes.data()).ok());
  std::vector<float> v(t.numel());
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.dtype() == DType::kF32) std::memcpy(&v[i], &bytes[i * 4], 4);
    else { uint16_t h; std::memcpy(&h, &bytes[i * 2], 2); v[i] = Bf16ToFloat(h); }
  }
  return v;
}

double RelErr(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;  // NaN from poison or overflow never passes
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}
double RelErr(const std::vector<float>& got, const std::vector<float>& ref) {
  return RelErr(got, std::vector<double>(ref.begin(), ref.end()));
}

// ||got - ref|| / ||scale||: for results that cancel, relative to the size of the terms.
double ErrOverScale(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<float>& scale) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += double(got[i] - ref[i]) * (got[i] - ref[i]);
    den += double(scale[i]) * scale[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// ---- double-precision references ----
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

class OpTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto b = MakeBackend(GetParam() == "cpu" ? Device::Cpu() : Device::Cuda(0));
    if (!b.ok()) GTEST_SKIP() << GetParam() << ": " << b.status();
    be_ = std::move(*b);
    ref_ = MakeCpuBackend();
    seed_ = Seed();
  }
  bool cpu() const { return GetParam() == "cpu"; }
  double Tol(DType t) const { return t == DType::kBF16 ? 2e-2 : (cpu() ? 1e-6 : 1e-5); }
  std::unique_ptr<Backend> be_, ref_;
  uint64_t seed_ = 0;
};

TEST_P(OpTest, Cast) {
  Rng rng(seed_);
  for (int64_t n : {1, 7, 1000, 65537}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n << " seed=" << seed_);
    auto v = rng.Normal(n, 3.f);
    auto x = Make(*be_, {n}, DType::kF32, v);
    auto y = Out(*be_, {n}, DType::kBF16);
    ASSERT_TRUE(be_->Cast(x, y).ok());
    auto got = Read(*be_, y);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], Bf16ToFloat(FloatToBf16(v[i]))) << i;  // exact RNE
    auto back = Out(*be_, {n}, DType::kF32);
    ASSERT_TRUE(be_->Cast(y, back).ok());
    EXPECT_EQ(Read(*be_, back), got);
  }
}

TEST_P(OpTest, RmsNormForwardAndBackward) {
  Rng rng(seed_);
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {17, 33}, {64, 1000}, {5, 4097}, {2, 8192},
                              {33, 2048}, {9, 512}, {3, 4096}}) {
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
    }
  }
  // Finite differences of the double forward confirm the derivative formula.
  double g0 = 0.7, u0 = -1.3, h = 1e-5, s = 1 / (1 + std::exp(-g0));
  EXPECT_NEAR((Silu(g0 + h) - Silu(g0 - h)) / (2 * h) * u0, u0 * s * (1 + g0 * (1 - s)), 1e-8);
}

TEST_P(OpTest, Gemm) {
  Rng rng(seed_);
  struct G { int64_t m, n, k; };
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (G g : {G{1, 1, 1}, G{7, 5, 3}, G{33, 17, 65}, G{128, 256, 64}, G{100, 300, 257}}) {
      for (int tr = 0; tr < 4; ++tr) {
        bool ta = tr & 1, tb = tr & 2;
        SCOPED_TRACE(::testing::Message() << DTypeName(t) << " m=" << g.m << " n=" << g.n << " k=" << g.k << " ta=" << ta
                                          << " tb=" << tb << " seed=" << seed_);
        auto av = Quantize(rng.Normal(g.m * g.k), t), bv = Quantize(rng.Normal(g.k * g.n), t);
        auto cv = Quantize(rng.Normal(g.m * g.n), t);
        std::vector<int64_t> as = ta ? std::vector<int64_t>{g.k, g.m} : std::vector<int64_t>{g.m, g.k};
        std::vector<int64_t> bs = tb ? std::vector<int64_t>{g.n, g.k} : std::vector<int64_t>{g.k, g.n};
        auto a = Make(*be_, as, t, av), b = Make(*be_, bs, t, bv), c = Make(*be_, {g.m, g.n}, t, cv);
        ASSERT_TRUE(be_->Gemm(a, ta, b, tb, c, 0.5f, 0.25f).ok());
        std::vector<double> ref(g.m * g.n);
        for (int64_t i = 0; i < g.m; ++i)
          for (int64_t j = 0; j < g.n; ++j) {
            double acc = 0;
            for (int64_t p = 0; p < g.k; ++p)
              acc += double(av[ta ? p * g.m + i : i * g.k + p]) * bv[tb ? j * g.k + p : p * g.n + j];
            ref[i * g.n + j] = 0.5 * acc + 0.25 * cv[i * g.n + j];
          }
        EXPECT_LT(RelErr(Read(*be_, c), ref), t == DType::kBF16 ? 2e-2 : 1e-5);
      }
    }
  }
}

TEST_P(OpTest, AdamW) {
  Rng rng(seed_);
  for (DType gt : {DType::kF32, DType::kBF16}) {
    for (int64_t n : {1, 1000, 4097}) {
      SCOPED_TRACE(::testing::Message() << "grad " << DTypeName(gt) << " n=" << n << " seed=" << seed_);
      auto pv = rng.Normal(n), gv = Quantize(rng.Normal(n), gt), mv = rng.Normal(n, 0.1f), vv = rng.Normal(n, 0.1f);
      for (auto& x : vv) x = x * x;
      AdamWParams hp{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, 7};
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
        rm[i] = b1 * mv[i] + (1 - b1) * gv[i];
        rv[i] = b2 * vv[i] + (1 - b2) * double(gv[i]) * gv[i];
        double upd = (rm[i] / bc1) / (std::sqrt(rv[i] / bc2) + eps);
        rp[i] = pv[i] - lr * (upd + wd * pv[i]);
        sm[i] = std::abs(b1 * mv[i]) + std::abs((1 - b1) * gv[i]);
        sv[i] = std::abs(rv[i]);
        sp[i] = std::abs(pv[i]) + lr * (std::abs(upd) + std::abs(wd * pv[i]));
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
      std::vector<double> sum_out(33 * hidden, 0.0), dtab(100 * hidden, 0.0);
      for (int shard = 0; shard < 2; ++shard) {
        std::vector<float> part(tv.begin() + shard * 50 * hidden, tv.begin() + (shard + 1) * 50 * hidden);
        auto ids_t = Ints(*be_, ids);
        auto table = Make(*be_, {50, hidden}, t, part), out = Out(*be_, {33, hidden}, t);
        ASSERT_TRUE(be_->EmbeddingForward(ids_t, table, shard * 50, out).ok());
        auto o = Read(*be_, out);
        for (size_t k = 0; k < o.size(); ++k) sum_out[k] += o[k];
        auto dout = Make(*be_, {33, hidden}, t, dv), dtable = Out(*be_, {50, hidden}, DType::kF32);
        ASSERT_TRUE(be_->EmbeddingBackward(ids_t, dout, shard * 50, dtable).ok());
        auto d = Read(*be_, dtable);
        for (size_t k = 0; k < d.size(); ++k) dtab[shard * 50 * hidden + k] = d[k];
      }
      // The all-reduce of the shards' outputs is the full lookup; dtable sums repeats.
      std::vector<double> want(33 * hidden), wantd(100 * hidden, 0.0);
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
      ASSERT_TRUE(be_->Rope(x, p, 10000.f, y).ok());
      std::vector<double> ref(xv.size());
      int64_t half = dim / 2;
      for (int64_t tok = 0; tok < tokens; ++tok)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t i = 0; i < half; ++i) {
            double ang = pos[tok] * std::pow(10000.0, -2.0 * i / dim);
            int64_t o = (tok * heads + h) * dim;
            ref[o + i] = xv[o + i] * std::cos(ang) - xv[o + i + half] * std::sin(ang);
            ref[o + i + half] = xv[o + i + half] * std::cos(ang) + xv[o + i] * std::sin(ang);
          }
      auto yv = Read(*be_, y);
      EXPECT_LT(RelErr(yv, ref), t == DType::kBF16 ? 1e-2 : 1e-6);
      auto back = Out(*be_, {tokens, heads, dim}, t);
      ASSERT_TRUE(be_->Rope(y, p, 10000.f, back, /*inverse=*/true).ok());
      EXPECT_LT(RelErr(Read(*be_, back), xv), t == DType::kBF16 ? 1e-2 : 1e-6);  // a rotation is undone by its inverse
    }
  }
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
  std::vector<double> num(n * v);
  const double h = 1e-3;
  for (int64_t k = 0; k < n * v; ++k) {
    auto p = zv, m = zv;
    p[k] += h, m[k] -= h;
    num[k] = (loss(p) - loss(m)) / (2 * h);
  }
  EXPECT_LT(RelErr(Read(*be_, dz), num), 1e-4) << "seed " << seed_;
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

// Independent double reference: per sequence and head, full score matrix and softmax.
void AttentionRef(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                  const std::vector<int32_t>& cu, int64_t hq, int64_t hkv, int64_t dim, bool causal,
                  std::vector<double>& out, std::vector<double>& lse) {
  int64_t T = cu.back();
  out.assign(T * hq * dim, 0.0);
  lse.assign(T * hq, 0.0);
  double scale = 1.0 / std::sqrt(double(dim));
  for (size_t b = 0; b + 1 < cu.size(); ++b)
    for (int64_t h = 0; h < hq; ++h) {
      int64_t g = h / (hq / hkv);
      for (int64_t i = cu[b]; i < cu[b + 1]; ++i) {
        std::vector<double> sc;
        for (int64_t j = cu[b]; j < cu[b + 1]; ++j) {
          if (causal && j > i) break;
          double dot = 0;
          for (int64_t c = 0; c < dim; ++c) dot += double(q[(i * hq + h) * dim + c]) * k[(j * hkv + g) * dim + c];
          sc.push_back(dot * scale);
        }
        double m = *std::max_element(sc.begin(), sc.end()), z = 0;
        for (double x : sc) z += std::exp(x - m);
        lse[i * hq + h] = m + std::log(z);
        for (size_t jj = 0; jj < sc.size(); ++jj)
          for (int64_t c = 0; c < dim; ++c)
            out[(i * hq + h) * dim + c] += std::exp(sc[jj] - m) / z * v[((cu[b] + jj) * hkv + g) * dim + c];
      }
    }
}

TEST_P(OpTest, AttentionForwardVarlenGqaCausal) {
  Rng rng(seed_);
  struct C { std::vector<int32_t> lens; int64_t hq, hkv, dim; };
  for (DType t : {DType::kF32, DType::kBF16}) {
    // Flash path (bf16, d 64/128): tiles of 128 queries x 64 keys, so 130, 200 and 300 cross
    // tile edges inside and between packed sequences.
    for (C c : {C{{1}, 1, 1, 8}, C{{3, 5}, 4, 2, 64}, C{{7, 1, 16}, 8, 1, 128}, C{{130}, 2, 2, 64},
                C{{200, 77, 300}, 4, 2, 64}, C{{130, 1, 200}, 4, 1, 128}}) {
      for (bool causal : {true, false}) {
        std::vector<int32_t> cu = {0};
        for (int32_t l : c.lens) cu.push_back(cu.back() + l);
        int64_t T = cu.back();
        SCOPED_TRACE(::testing::Message() << DTypeName(t) << " T=" << T << " hq=" << c.hq << " hkv=" << c.hkv << " d=" << c.dim
                                          << " causal=" << causal << " seed=" << seed_);
        auto qv = Quantize(rng.Normal(T * c.hq * c.dim), t), kv = Quantize(rng.Normal(T * c.hkv * c.dim), t),
             vv = Quantize(rng.Normal(T * c.hkv * c.dim), t);
        auto q = Make(*be_, {T, c.hq, c.dim}, t, qv), k = Make(*be_, {T, c.hkv, c.dim}, t, kv),
             v = Make(*be_, {T, c.hkv, c.dim}, t, vv), cut = Ints(*be_, cu);
        auto out = Out(*be_, {T, c.hq, c.dim}, t), lse = Out(*be_, {T, c.hq}, DType::kF32);
        auto st = be_->AttentionForward(q, k, v, cut, causal, out, lse);
        ASSERT_TRUE(st.ok()) << st;
        std::vector<double> ro, rl;
        AttentionRef(qv, kv, vv, cu, c.hq, c.hkv, c.dim, causal, ro, rl);
        EXPECT_LT(RelErr(Read(*be_, out), ro), t == DType::kBF16 ? 2e-2 : (cpu() ? 1e-6 : 1e-5));
        EXPECT_LT(RelErr(Read(*be_, lse), rl), cpu() ? 1e-6 : 1e-5);
      }
    }
  }
}

TEST_P(OpTest, AttentionBackward) {
  Rng rng(seed_);
  const std::vector<int32_t> cu = {0, 3, 7};
  const int64_t T = 7, hq = 2, hkv = 1, dim = 4;
  auto qv = rng.Normal(T * hq * dim), kv = rng.Normal(T * hkv * dim), vv = rng.Normal(T * hkv * dim), rv = rng.Normal(T * hq * dim);
  auto q = Make(*be_, {T, hq, dim}, DType::kF32, qv), k = Make(*be_, {T, hkv, dim}, DType::kF32, kv),
       v = Make(*be_, {T, hkv, dim}, DType::kF32, vv), cut = Ints(*be_, cu), dout = Make(*be_, {T, hq, dim}, DType::kF32, rv);
  auto out = Out(*be_, {T, hq, dim}, DType::kF32), lse = Out(*be_, {T, hq}, DType::kF32);
  ASSERT_TRUE(be_->AttentionForward(q, k, v, cut, true, out, lse).ok());
  auto dq = Out(*be_, {T, hq, dim}, DType::kF32), dk = Out(*be_, {T, hkv, dim}, DType::kF32), dv = Out(*be_, {T, hkv, dim}, DType::kF32);
  auto st = be_->AttentionBackward(q, k, v, cut, true, out, dout, lse, dq, dk, dv);
  ASSERT_TRUE(st.ok()) << st;
  // Finite differences of L = sum(out * r) through the double reference.
  auto loss = [&](const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& c) {
    std::vector<double> o, l;
    AttentionRef(a, b, c, cu, hq, hkv, dim, true, o, l);
    double s = 0;
    for (size_t i = 0; i < o.size(); ++i) s += o[i] * rv[i];
    return s;
  };
  const double h = 1e-3;
  auto fd = [&](int which) {
    std::vector<std::vector<float>> in = {qv, kv, vv};
    std::vector<double> g(in[which].size());
    for (size_t i = 0; i < g.size(); ++i) {
      auto p = in, m = in;
      p[which][i] += h, m[which][i] -= h;
      g[i] = (loss(p[0], p[1], p[2]) - loss(m[0], m[1], m[2])) / (2 * h);
    }
    return g;
  };
  EXPECT_LT(RelErr(Read(*be_, dq), fd(0)), 1e-4) << "seed " << seed_;
  EXPECT_LT(RelErr(Read(*be_, dk), fd(1)), 1e-4) << "seed " << seed_;
  EXPECT_LT(RelErr(Read(*be_, dv), fd(2)), 1e-4) << "seed " << seed_;
}

// CUDA backward (flash for bf16 d 64/128, generic otherwise) against the CPU backward on
// the same inputs (the CPU backward itself is checked by finite differences above).
// Tolerance: f32 1e-4 (__expf and f32 sums over up to 300 keys vs double); bf16 3e-2
// (P and dS are rounded to bf16 before their MMAs, as in FlashAttention-2, on top of
// bf16 outputs).
TEST_P(OpTest, AttentionBackwardMatchesCpu) {
  if (cpu()) GTEST_SKIP() << "the CPU backward is the reference";
  auto ref = MakeCpuBackend();
  Rng rng(seed_);
  struct C { DType t; std::vector<int32_t> lens; int64_t hq, hkv, dim; };
  for (C c : {C{DType::kF32, {3, 5}, 4, 2, 8}, C{DType::kBF16, {5, 3}, 2, 1, 48}, C{DType::kBF16, {1, 70, 130}, 4, 2, 64},
              C{DType::kBF16, {200, 9}, 2, 1, 128}, C{DType::kBF16, {300}, 2, 2, 128}}) {
    for (bool causal : {true, false}) {
      std::vector<int32_t> cu = {0};
      for (int32_t l : c.lens) cu.push_back(cu.back() + l);
      const int64_t T = cu.back();
      SCOPED_TRACE(::testing::Message() << DTypeName(c.t) << " T=" << T << " hq=" << c.hq << " hkv=" << c.hkv
                                        << " d=" << c.dim << " causal=" << causal << " seed=" << seed_);
      auto qv = Quantize(rng.Normal(T * c.hq * c.dim), c.t), kv = Quantize(rng.Normal(T * c.hkv * c.dim), c.t),
           vv = Quantize(rng.Normal(T * c.hkv * c.dim), c.t), gv = Quantize(rng.Normal(T * c.hq * c.dim), c.t);
      std::vector<std::vector<float>> grads[2];
      for (int side = 0; side < 2; ++side) {
        Backend& b = side == 0 ? *be_ : *ref;
        // cu_seqlens on the host (causal cases) or on the device (the others): both paths.
        auto q = Make(b, {T, c.hq, c.dim}, c.t, qv), k = Make(b, {T, c.hkv, c.dim}, c.t, kv),
             v = Make(b, {T, c.hkv, c.dim}, c.t, vv), g = Make(b, {T, c.hq, c.dim}, c.t, gv),
             cut = Ints(causal ? *ref : b, cu);
        auto out = Out(b, {T, c.hq, c.dim}, c.t), lse = Out(b, {T, c.hq}, DType::kF32);
        ASSERT_TRUE(b.AttentionForward(q, k, v, cut, causal, out, lse).ok());
        auto dq = Out(b, {T, c.hq, c.dim}, c.t), dk = Out(b, {T, c.hkv, c.dim}, c.t), dv = Out(b, {T, c.hkv, c.dim}, c.t);
        auto st = b.AttentionBackward(q, k, v, cut, causal, out, g, lse, dq, dk, dv);
        ASSERT_TRUE(st.ok()) << st;
        grads[side] = {Read(b, dq), Read(b, dk), Read(b, dv)};
      }
      const double tol = c.t == DType::kBF16 ? 3e-2 : 1e-4;
      EXPECT_LT(RelErr(grads[0][0], grads[1][0]), tol) << "dq";
      EXPECT_LT(RelErr(grads[0][1], grads[1][1]), tol) << "dk";
      EXPECT_LT(RelErr(grads[0][2], grads[1][2]), tol) << "dv";
    }
  }
}

TEST_P(OpTest, AttentionRejectsBadSeqlens) {
  auto q = *be_->Empty({5, 2, 8}, DType::kF32), k = *be_->Empty({5, 1, 8}, DType::kF32), v = *be_->Empty({5, 1, 8}, DType::kF32);
  auto out = *be_->Empty({5, 2, 8}, DType::kF32), lse = *be_->Empty({5, 2}, DType::kF32);
  auto bad_end = Ints(*be_, {0, 3, 6});
  EXPECT_THAT(std::string(be_->AttentionForward(q, k, v, bad_end, true, out, lse).message()),
              HasSubstr("must start at 0 and end at tokens=5, got 0 ... 6"));
  auto not_inc = Ints(*be_, {0, 3, 3, 5});
  EXPECT_THAT(std::string(be_->AttentionForward(q, k, v, not_inc, true, out, lse).message()),
              HasSubstr("strictly increasing; entry 2 is 3 after 3"));
  auto host = MakeCpuBackend();
  auto host_bad = Ints(*host, {0, 2, 2, 5});  // a host cu_seqlens is validated in place
  EXPECT_THAT(std::string(be_->AttentionForward(q, k, v, host_bad, true, out, lse).message()),
              HasSubstr("strictly increasing; entry 2 is 2 after 2"));
  auto k3 = *be_->Empty({5, 3, 8}, DType::kF32);
  auto ok_cu = Ints(*be_, {0, 5});
  EXPECT_THAT(std::string(be_->AttentionForward(q, k3, k3, ok_cu, true, out, lse).message()),
              HasSubstr("query heads (2) must be a multiple of kv heads (3)"));
}

Tensor I64(Backend& b, const std::vector<int64_t>& v) {
  auto t = b.Empty({static_cast<int64_t>(v.size())}, DType::kI64);
  EXPECT_TRUE(b.CopyFromHost(v.data(), *t).ok());
  return *t;
}
template <typename T>
std::vector<T> ReadRaw(Backend& b, const Tensor& t) {
  std::vector<T> v(t.numel());
  EXPECT_TRUE(b.CopyToHost(t, v.data()).ok());
  return v;
}

struct SampleCase {
  std::vector<float> temp, top_p;
  std::vector<int32_t> top_k;
  std::vector<int64_t> seed, offset;
};

// Runs Sample on `b` and returns (tokens, logprobs).
std::pair<std::vector<int32_t>, std::vector<float>> RunSample(Backend& b, const std::vector<float>& z, int64_t n, int64_t v,
                                                              DType t, const SampleCase& c) {
  auto logits = Make(b, {n, v}, t, z), temp = Make(b, {n}, DType::kF32, c.temp), top_p = Make(b, {n}, DType::kF32, c.top_p);
  auto top_k = Ints(b, c.top_k), seed = I64(b, c.seed), offset = I64(b, c.offset);
  auto tok = Out(b, {n}, DType::kI32), lp = Out(b, {n}, DType::kF32);
  auto st = b.Sample(logits, temp, top_k, top_p, seed, offset, tok, lp);
  EXPECT_TRUE(st.ok()) << st;
  return {ReadRaw<int32_t>(b, tok), Read(b, lp)};
}

TEST_P(OpTest, SamplingGreedyAndReproducible) {
  Rng rng(seed_);
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (int64_t v : {1, 7, 1000, 32003}) {
      const int64_t n = 64;
      SCOPED_TRACE(::testing::Message() << DTypeName(t) << " v=" << v << " seed=" << seed_);
      auto z = Quantize(rng.Normal(n * v, 2.f), t);
      SampleCase c;
      for (int64_t i = 0; i < n; ++i) {
        c.temp.push_back(i % 4 == 0 ? 0.f : 0.7f + 0.1f * (i % 5));
        c.top_k.push_back(i % 3 == 0 ? 0 : 1 + i % 50);
        c.top_p.push_back(i % 2 == 0 ? 1.f : 0.9f);
        c.seed.push_back(1000 + i);
        c.offset.push_back(i % 7);
      }
      auto [tok, lp] = RunSample(*be_, z, n, v, t, c);
      auto [rtok, rlp] = RunSample(*ref_, z, n, v, t, c);
      int same = 0;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_GE(tok[i], 0);
        ASSERT_LT(tok[i], v);
        if (c.temp[i] == 0) {  // greedy: the argmax, lowest id on ties
          int64_t arg = 0;
          for (int64_t j = 1; j < v; ++j) if (z[i * v + j] > z[i * v + arg]) arg = j;
          EXPECT_EQ(tok[i], arg) << "row " << i;
        }
        // logprob of the chosen token under softmax(z / T), in double.
        double T = c.temp[i] > 0 ? c.temp[i] : 1.0, m = -INFINITY, s = 0;
        for (int64_t j = 0; j < v; ++j) m = std::max(m, double(z[i * v + j]));
        for (int64_t j = 0; j < v; ++j) s += std::exp((z[i * v + j] - m) / T);
        double want = (z[i * v + tok[i]] - m) / T - std::log(s);
        EXPECT_NEAR(lp[i], want, 1e-4 * std::max(1.0, std::abs(want))) << "row " << i;
        same += tok[i] == rtok[i];
      }
      // The same (seed, offset) draws the same u on every backend; only draws within
      // rounding of a CDF boundary may differ between f32 (CUDA) and double (CPU).
      EXPECT_GE(same, cpu() ? n : n - 2);
      auto [again, lp2] = RunSample(*be_, z, n, v, t, c);
      EXPECT_EQ(again, tok);  // replay is exact
    }
  }
}

TEST_P(OpTest, SamplingFollowsTheTruncatedDistribution) {
  // One row drawn 4000 times (offsets 0..3999): frequencies match softmax(z/T) restricted
  // to top-k then top-p, renormalized (chi-square with a generous bound), and nothing
  // outside the kept set is ever drawn.
  const int64_t v = 12, draws = 4000;
  std::vector<float> row = {2.0f, 1.5f, 1.4f, 1.0f, 0.5f, 0.3f, 0.0f, -0.5f, -1.0f, -2.0f, -3.0f, 0.9f};
  std::vector<float> z;
  SampleCase c;
  for (int64_t d = 0; d < draws; ++d) {
    z.insert(z.end(), row.begin(), row.end());
    c.temp.push_back(0.8f);
    c.top_k.push_back(6);
    c.top_p.push_back(0.8f);
    c.seed.push_back(42);
    c.offset.push_back(d);
  }
  auto [tok, lp] = RunSample(*be_, z, draws, v, DType::kF32, c);
  std::vector<double> p(v);
  double s = 0;
  for (int64_t j = 0; j < v; ++j) s += p[j] = std::exp(row[j] / 0.8);
  for (auto& x : p) x /= s;
  std::vector<int64_t> order(v);
  for (int64_t j = 0; j < v; ++j) order[j] = j;
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return p[a] > p[b]; });
  std::vector<bool> keep(v, false);
  double kept_total = 0;
  for (int j = 0; j < 6; ++j) kept_total += p[order[j]];
  double cum = 0, mass = 0;
  for (int j = 0; j < 6; ++j) {
    keep[order[j]] = true;
    cum += p[order[j]];
    mass += p[order[j]];
    if (cum >= 0.8 * kept_total) break;
  }
  std::vector<int64_t> count(v, 0);
  for (int32_t t : tok) count[t]++;
  double chi2 = 0;
  int dof = -1;
  for (int64_t j = 0; j < v; ++j) {
    if (!keep[j]) {
      EXPECT_EQ(count[j], 0) << "token " << j << " is outside the kept set";
      continue;
    }
    double e = draws * p[j] / mass;
    chi2 += (count[j] - e) * (count[j] - e) / e;
    dof++;
  }
  EXPECT_LT(chi2, 30.0) << "chi-square " << chi2 << " with " << dof << " degrees of freedom";  // p < 1e-5 for dof <= 5
}

TEST_P(OpTest, PagedDecodeAttention) {
  Rng rng(seed_);
  // The second shape has a long context (CUDA: split across CTAs and merged), d = 128 and
  // a GQA group of 8; the first, short ones of every length class around a block.
  struct C { std::vector<int32_t> lens; int64_t hq, hkv, dim, blocks, maxb; };
  for (DType t : {DType::kF32, DType::kBF16})
  for (const C& c : {C{{1, 16, 17, 100, 128}, 8, 2, 64, 40, 8}, C{{1000, 300, 1}, 16, 2, 128, 90, 64}}) {
    const int64_t B = static_cast<int64_t>(c.lens.size()), hq = c.hq, hkv = c.hkv, dim = c.dim, bs = 16,
                  blocks = c.blocks, maxb = c.maxb;
    const std::vector<int32_t>& lens = c.lens;
    SCOPED_TRACE(::testing::Message() << DTypeName(t) << " dim=" << dim << " seed=" << seed_);
    // Each sequence gets distinct blocks in a shuffled order (as an allocator would).
    std::vector<int32_t> perm(blocks);
    for (int i = 0; i < blocks; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng.gen);
    std::vector<int32_t> tables(B * maxb, -1);
    int next = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < (lens[b] + bs - 1) / bs; ++i) tables[b * maxb + i] = perm[next++];
    auto qv = Quantize(rng.Normal(B * hq * dim), t), kv = Quantize(rng.Normal(blocks * bs * hkv * dim), t),
         vv = Quantize(rng.Normal(blocks * bs * hkv * dim), t);
    auto q = Make(*be_, {B, hq, dim}, t, qv), kc = Make(*be_, {blocks, bs, hkv, dim}, t, kv),
         vc = Make(*be_, {blocks, bs, hkv, dim}, t, vv), bt = *be_->Empty({B, maxb}, DType::kI32), cl = Ints(*be_, lens);
    ASSERT_TRUE(be_->CopyFromHost(tables.data(), bt).ok());
    auto out = Out(*be_, {B, hq, dim}, t), lse = Out(*be_, {B, hq}, DType::kF32);
    auto st = be_->PagedAttention(q, kc, vc, bt, cl, out, lse);
    ASSERT_TRUE(st.ok()) << st;
    // Reference: gather each sequence's tokens, then plain softmax attention in double.
    std::vector<double> ro(B * hq * dim, 0.0), rl(B * hq);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < hq; ++h) {
        int64_t g = h / (hq / hkv);
        std::vector<double> sc(lens[b]);
        for (int64_t tok = 0; tok < lens[b]; ++tok) {
          int64_t base = ((int64_t(tables[b * maxb + tok / bs]) * bs + tok % bs) * hkv + g) * dim;
          double dot = 0;
          for (int64_t k = 0; k < dim; ++k) dot += double(qv[(b * hq + h) * dim + k]) * kv[base + k];
          sc[tok] = dot / std::sqrt(double(dim));
        }
        double m = *std::max_element(sc.begin(), sc.end()), z = 0;
        for (double x : sc) z += std::exp(x - m);
        rl[b * hq + h] = m + std::log(z);
        for (int64_t tok = 0; tok < lens[b]; ++tok) {
          int64_t base = ((int64_t(tables[b * maxb + tok / bs]) * bs + tok % bs) * hkv + g) * dim;
          for (int64_t k = 0; k < dim; ++k) ro[(b * hq + h) * dim + k] += std::exp(sc[tok] - m) / z * vv[base + k];
        }
      }
    // bf16 on CUDA: P is rounded to bf16 before the P V product (as in flash attention).
    EXPECT_LT(RelErr(Read(*be_, out), ro), t == DType::kBF16 ? 2e-2 : (cpu() ? 1e-6 : 1e-5));
    EXPECT_LT(RelErr(Read(*be_, lse), rl), cpu() ? 1e-6 : 1e-5);
    if (!cpu()) {  // host tables and lengths give the same result
      auto host = MakeCpuBackend();
      auto hbt = *host->Empty({B, maxb}, DType::kI32);
      std::copy(tables.begin(), tables.end(), hbt.data_as<int32_t>());
      auto first = Read(*be_, out);
      auto out2 = Out(*be_, {B, hq, dim}, t);
      ASSERT_TRUE(be_->PagedAttention(q, kc, vc, hbt, Ints(*host, lens), out2, lse).ok());
      EXPECT_EQ(RelErr(Read(*be_, out2), first), 0.0);
    }
    // A table entry outside the cache is refused, not read.
    std::vector<int32_t> bad = tables;
    bad[(B - 2) * maxb + 2] = static_cast<int32_t>(blocks + 7);
    ASSERT_TRUE(be_->CopyFromHost(bad.data(), bt).ok());
    EXPECT_THAT(std::string(be_->PagedAttention(q, kc, vc, bt, cl, out, lse).message()),
                HasSubstr(absl::StrCat("block_tables[", B - 2, "][2] = ", blocks + 7, " is not a block of the cache (",
                                       blocks, " blocks)")));
  }
}

TEST_P(OpTest, ValidationNamesShapes) {
  auto x = *be_->Empty({4, 8}, DType::kF32), w = *be_->Empty({7}, DType::kF32), y = *be_->Empty({4, 8}, DType::kF32);
  auto r = *be_->Empty({4}, DType::kF32);
  EXPECT_THAT(std::string(be_->RmsNormForward(x, w, 1e-5f, y, r).message()), HasSubstr("w [7] must be [8]"));
  auto a = *be_->Empty({3, 5}, DType::kF32), b = *be_->Empty({4, 2}, DType::kF32), c = *be_->Empty({3, 2}, DType::kF32);
  EXPECT_THAT(std::string(be_->Gemm(a, false, b, false, c).message()),
              HasSubstr("inner dimensions differ: op(a) is [3, 5], op(b) is [4, 2]"));
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
  }
  EXPECT_EQ(alloc->stats().current_bytes, before);
  EXPECT_GE(alloc->stats().peak_bytes, 96);
}

}  // namespace
}  // namespace tessera::runtime
