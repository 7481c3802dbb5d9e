// The decode step's fused ops (kernels/decode) on every backend: DecodeLinear against a
// double-precision reference of the ops it fuses (the norm's output rounded to the dtype,
// as the unfused norm rounds it), QkRopeCache against the ops it fuses run one after the
// other on the same backend, and sampling over vocabularies that split into segments
// against the softmax it draws from. Tolerances as in op_test.cc.
#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "tests/kernels/op_harness.h"

namespace tessera::runtime::test {
namespace {

// The tensor-core decode GEMM (kernels/decode/decode_gemm_cuda.cu, 5 to 128 rows on Hopper)
// is opt-in; these tests run it wherever the GPU takes it (set before any call reads it).
const int kDecodeGemmOn = setenv("TESSERA_DECODE_GEMM", "1", /*overwrite=*/0);

struct LinearCase {
  int64_t m, k;
  std::vector<int64_t> n;
  bool norm, bias, residual, swiglu;
};

// The reference: x (normalized and rounded to t when `norm`), then each part's sums.
std::vector<std::vector<double>> LinearRef(const LinearCase& c, DType t, const std::vector<float>& x,
                                           const std::vector<float>& nw, const std::vector<std::vector<float>>& w,
                                           const std::vector<std::vector<float>>& bias, const std::vector<float>& res) {
  std::vector<double> xn(x.begin(), x.end());
  if (c.norm)
    for (int64_t r = 0; r < c.m; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < c.k; ++i) ss += double(x[r * c.k + i]) * x[r * c.k + i];
      const double rs = 1 / std::sqrt(ss / c.k + 1e-5);
      for (int64_t i = 0; i < c.k; ++i) {
        const float v = static_cast<float>(x[r * c.k + i] * rs * nw[i]);
        xn[r * c.k + i] = t == DType::kBF16 ? Bf16ToFloat(FloatToBf16(v)) : v;
      }
    }
  auto dot = [&](size_t j, int64_t r, int64_t i) {
    double s = 0;
    for (int64_t p = 0; p < c.k; ++p) s += xn[r * c.k + p] * w[j][i * c.k + p];
    return s + (c.bias ? bias[j][i] : 0.0);
  };
  std::vector<std::vector<double>> out(c.n.size());
  for (size_t j = 0; j < c.n.size(); ++j)
    for (int64_t r = 0; r < c.m; ++r)
      for (int64_t i = 0; i < c.n[j]; ++i) {
        if (c.swiglu) {
          if (j == 1) continue;
          auto round = [&](double v) { return t == DType::kBF16 ? double(Bf16ToFloat(FloatToBf16(float(v)))) : v; };
          const double g = round(dot(0, r, i)), u = round(dot(1, r, i));
          out[0].push_back(g / (1 + std::exp(-g)) * u);
        } else {
          out[j].push_back(dot(j, r, i) + (c.residual ? res[r * c.n[j] + i] : 0.0));
        }
      }
  return out;
}

TEST_P(OpTest, DecodeLinearMatchesTheOpsItFuses) {
  Rng rng(seed_);
  const std::vector<LinearCase> cases = {
      {1, 64, {40, 24, 24}, true, true, false, false},    // q, k, v with bias and the input norm
      {3, 264, {96, 32, 32}, true, false, false, false},  // odd rows, k not a multiple of 256
      {8, 2048, {512, 128, 128}, true, true, false, false},
      {1, 2048, {2048}, false, false, true, false},  // an output projection with its residual
      {5, 520, {300}, false, false, true, false},
      {1, 2048, {1536, 1536}, true, false, false, true},  // gate and up: SwiGLU
      {7, 128, {33, 33}, true, false, false, true},
      {2, 1024, {5003}, true, false, false, false},  // an LM head of odd rows
      {4, 8192, {72}, true, false, false, false},    // a long row with the norm (x and the norm's weights near the bound)
      {5, 8192, {40}, false, false, true, false},    // a down projection at 5 rows (where the backend takes it)
      {1, 8192, {2048}, false, false, true, false},  // a down projection at 1 row: each row's chunks shared by warps
      {2, 6000, {64, 64}, true, false, false, true},  // SwiGLU over shares of a row that are not whole batches
      // Past 4 rows (the tensor-core kernel on Hopper): each width of x's tile, K split over
      // a cluster or not, K and n not multiples of the tiles.
      {5, 2048, {512, 128, 128}, true, true, false, false},
      {16, 520, {300}, false, false, true, false},
      {33, 2048, {2048}, false, false, true, false},
      {64, 2048, {2048, 512, 512}, true, true, false, false},
      {64, 2048, {1536, 1536}, true, false, false, true},
      {100, 1024, {704, 704}, true, false, false, true},
      {128, 8192, {256}, false, false, true, false},
      {77, 264, {96, 40, 40}, true, false, false, false},
  };
  for (DType t : {DType::kF32, DType::kBF16}) {
    for (const LinearCase& c : cases) {
      if (!be_->DecodeLinearSupported(c.m, c.k, t)) continue;
      SCOPED_TRACE(::testing::Message() << DTypeName(t) << " m=" << c.m << " k=" << c.k << " parts=" << c.n.size()
                                        << " swiglu=" << c.swiglu << " seed=" << seed_);
      auto xv = Quantize(rng.Normal(c.m * c.k), t), nv = Quantize(rng.Normal(c.k, 0.5f), t);
      for (auto& v : nv) v += 1.f;
      auto x = Make(*be_, {c.m, c.k}, t, xv), nw = Make(*be_, {c.k}, t, nv);
      std::vector<std::vector<float>> wv, bv;
      std::vector<Tensor> w, b, y;
      for (int64_t n : c.n) {
        wv.push_back(Quantize(rng.Normal(n * c.k, 1.f / std::sqrt(float(c.k))), t));
        bv.push_back(Quantize(rng.Normal(n), t));
        w.push_back(Make(*be_, {n, c.k}, t, wv.back()));
        b.push_back(Make(*be_, {n}, t, bv.back()));
        y.push_back(Out(*be_, {c.m, n}, t));
      }
      const auto rv = Quantize(rng.Normal(c.m * c.n[0]), t);
      auto res = Make(*be_, {c.m, c.n[0]}, t, rv);
      std::vector<Backend::LinearPart> parts;
      for (size_t j = 0; j < c.n.size(); ++j) parts.push_back({&w[j], c.bias ? &b[j] : nullptr, &y[j]});
      ASSERT_TRUE(be_->DecodeLinear(x, c.norm ? &nw : nullptr, 1e-5f, parts, c.residual ? &res : nullptr, c.swiglu).ok());
      const auto ref = LinearRef(c, t, xv, nv, wv, bv, rv);
      for (size_t j = 0; j < c.n.size(); ++j) {
        if (c.swiglu && j == 1) continue;
        EXPECT_LT(RelErr(Read(*be_, y[j]), ref[j]), t == DType::kBF16 ? 1e-2 : (cpu() ? 1e-6 : 1e-5)) << "part " << j;
      }
    }
  }
}

TEST_P(OpTest, DecodeLinearNamesWhatIsWrong) {
  const DType t = DType::kBF16;
  auto x = Out(*be_, {2, 64}, t), w = Out(*be_, {16, 64}, t), w2 = Out(*be_, {16, 32}, t), y = Out(*be_, {2, 16}, t);
  auto wrong_y = Out(*be_, {3, 16}, t), nw = Out(*be_, {32}, t);
  const Backend::LinearPart ok{&w, nullptr, &y}, bad_k{&w2, nullptr, &y}, bad_y{&w, nullptr, &wrong_y};
  EXPECT_THAT(std::string(be_->DecodeLinear(x, nullptr, 0, {&bad_k, 1}, nullptr, false).message()),
              HasSubstr("weights[0] [16, 32] must be [n, 64]"));
  EXPECT_THAT(std::string(be_->DecodeLinear(x, nullptr, 0, {&bad_y, 1}, nullptr, false).message()),
              HasSubstr("outputs[0] [3, 16] must be [2, 16]"));
  EXPECT_THAT(std::string(be_->DecodeLinear(x, &nw, 1e-5f, {&ok, 1}, nullptr, false).message()), HasSubstr("norm [32] must be [64]"));
  EXPECT_THAT(std::string(be_->DecodeLinear(x, nullptr, 0, {&ok, 1}, nullptr, true).message()),
              HasSubstr("swiglu takes two weights"));
  auto bias = Out(*be_, {16}, t);
  const Backend::LinearPart gate{&w, &bias, &y}, up{&w, nullptr, nullptr}, gate_up[2] = {gate, up};
  EXPECT_THAT(std::string(be_->DecodeLinear(x, nullptr, 0, gate_up, nullptr, true).message()),
              HasSubstr("biases[0]: swiglu's gate and up take no bias"));
  const int64_t past = std::max(kernels::kDecodeMaxRows, kernels::kDecodeGemmMaxRows) + 1;  // past every backend's rows
  auto big = Out(*be_, {past, 64}, t), ybig = Out(*be_, {past, 16}, t);
  const Backend::LinearPart many{&w, nullptr, &ybig};
  EXPECT_THAT(std::string(be_->DecodeLinear(big, nullptr, 0, {&many, 1}, nullptr, false).message()),
              HasSubstr("is not a size this backend's decode linear takes"));
}

// The fused pass equals RMSNorm per head (when given), RoPE and KvCacheWrite run one after
// the other on the same backend: head dims of the fused kernel (64, 96, 128) and one it
// hands to those ops (80), with and without the q/k norm, keys also out for a prefill.
TEST_P(OpTest, QkRopeCacheEqualsNormRopeAndCacheWrite) {
  Rng rng(seed_);
  const int64_t tokens = 7, hq = 8, hkv = 2, blocks = 6, bs = 4;
  std::vector<int32_t> slots = {3, 17, 0, 22, 9, 12, 5}, pos = {0, 5, 17, 300, 4095, 2, 77};
  for (DType t : {DType::kF32, DType::kBF16})
    for (int64_t d : {64, 80, 96, 128})
      for (bool norm : {false, true}) {
        SCOPED_TRACE(::testing::Message() << DTypeName(t) << " d=" << d << " norm=" << norm << " seed=" << seed_);
        std::vector<float> inv(d / 2);
        for (int64_t i = 0; i < d / 2; ++i) inv[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / d));
        auto qv = Quantize(rng.Normal(tokens * hq * d), t), kv = Quantize(rng.Normal(tokens * hkv * d), t);
        auto vv = Quantize(rng.Normal(tokens * hkv * d), t), qn = Quantize(rng.Normal(d, 0.3f), t), kn = Quantize(rng.Normal(d, 0.3f), t);
        auto q = Make(*be_, {tokens, hq, d}, t, qv), k = Make(*be_, {tokens, hkv, d}, t, kv), v = Make(*be_, {tokens, hkv, d}, t, vv);
        auto qnw = Make(*be_, {d}, t, qn), knw = Make(*be_, {d}, t, kn);
        auto p = Ints(*be_, pos), s = Ints(*be_, slots);
        const auto cache0 = Quantize(rng.Normal(blocks * bs * hkv * d), t);
        auto kc = Make(*be_, {blocks, bs, hkv, d}, t, cache0), vc = Make(*be_, {blocks, bs, hkv, d}, t, cache0);
        auto qo = Out(*be_, {tokens, hq, d}, t), ko = Out(*be_, {tokens, hkv, d}, t);
        ASSERT_TRUE(be_->QkRopeCache(q, k, v, p, s, norm ? &qnw : nullptr, norm ? &knw : nullptr, 1e-6f, inv, 1.f, qo, kc, vc, &ko).ok());
        // The same through the ops it fuses.
        auto q2 = q, k2 = k;
        if (norm) {
          auto qf = Out(*be_, {tokens * hq, d}, t), kf = Out(*be_, {tokens * hkv, d}, t);
          auto r1 = Out(*be_, {tokens * hq}, DType::kF32), r2 = Out(*be_, {tokens * hkv}, DType::kF32);
          ASSERT_TRUE(be_->RmsNormForward(*q.Reshape({tokens * hq, d}), qnw, 1e-6f, qf, r1).ok());
          ASSERT_TRUE(be_->RmsNormForward(*k.Reshape({tokens * hkv, d}), knw, 1e-6f, kf, r2).ok());
          q2 = *qf.Reshape({tokens, hq, d}), k2 = *kf.Reshape({tokens, hkv, d});
        }
        auto qr = Out(*be_, {tokens, hq, d}, t), kr = Out(*be_, {tokens, hkv, d}, t);
        ASSERT_TRUE(be_->Rope(q2, p, inv, 1.f, qr).ok());
        ASSERT_TRUE(be_->Rope(k2, p, inv, 1.f, kr).ok());
        auto kc2 = Make(*be_, {blocks, bs, hkv, d}, t, cache0), vc2 = Make(*be_, {blocks, bs, hkv, d}, t, cache0);
        ASSERT_TRUE(be_->KvCacheWrite(kr, v, s, kc2, vc2).ok());
        // In bf16 only a norm's sum (another order) may move a rounding, so without one the
        // results are exact; f32 keeps the last bits of the rotation's products (contracted
        // into fused multiply-adds in one kernel and not the other).
        const double tol = t == DType::kBF16 ? (norm ? 1e-2 : 0.0) : 1e-6;
        EXPECT_LE(RelErr(Read(*be_, qo), Read(*be_, qr)), tol);
        EXPECT_LE(RelErr(Read(*be_, ko), Read(*be_, kr)), tol);
        EXPECT_LE(RelErr(Read(*be_, kc), Read(*be_, kc2)), tol);
        EXPECT_EQ(Read(*be_, vc), Read(*be_, vc2));
      }
}

TEST_P(OpTest, QkRopeCacheRefusesSlotsOutsideTheCache) {
  const DType t = DType::kBF16;
  auto q = Out(*be_, {2, 4, 64}, t), k = Out(*be_, {2, 2, 64}, t), v = Out(*be_, {2, 2, 64}, t), qo = Out(*be_, {2, 4, 64}, t);
  auto kc = Out(*be_, {2, 4, 2, 64}, t), vc = Out(*be_, {2, 4, 2, 64}, t);
  const std::vector<float> inv(32, 1.f);
  auto p = Ints(*be_, {0, 1});
  EXPECT_THAT(std::string(be_->QkRopeCache(q, k, v, p, Ints(*be_, {1, 8}), nullptr, nullptr, 0, inv, 1.f, qo, kc, vc).message()),
              HasSubstr("slot 8 is outside the cache (8 slots)"));
  EXPECT_THAT(std::string(be_->QkRopeCache(q, k, v, p, Ints(*be_, {1, 2}), nullptr, nullptr, 0, std::vector<float>(31, 1.f), 1.f,
                                           qo, kc, vc).message()),
              HasSubstr("head dim 64 needs 32 frequencies (got 31)"));
}

// A decode step's q/k pass inside its attention equals QkRopeCache then PagedAttention on
// the same backend: out, lse and both caches alike, bit for bit (the same roundings in the
// same order). Shapes of the 1B Llama (head dim 64, groups of 4) and of Qwen3 (128, with the
// q/k norm), contexts from the new token alone through tile and block edges to more splits
// than a cluster holds, blocks shuffled.
TEST_P(OpTest, DecodeAttentionEqualsQkRopeCacheThenPagedAttention) {
  Rng rng(seed_);
  struct C { std::vector<int32_t> lens; int64_t hq, hkv, dim; bool norm; };
  const int64_t bs = 16;
  for (DType t : {DType::kF32, DType::kBF16})
    for (const C& c : {C{{1, 16, 17, 64, 65, 300}, 8, 2, 64, false}, C{{1000, 2, 129}, 4, 2, 128, true}, C{{257}, 32, 8, 64, false}}) {
      const int64_t B = static_cast<int64_t>(c.lens.size()), hq = c.hq, hkv = c.hkv, d = c.dim;
      SCOPED_TRACE(::testing::Message() << DTypeName(t) << " d=" << d << " B=" << B << " seed=" << seed_);
      int64_t maxb = 1, blocks = 0;
      for (int32_t l : c.lens) maxb = std::max<int64_t>(maxb, (l + bs - 1) / bs), blocks += (l + bs - 1) / bs;
      blocks += 3;
      std::vector<int32_t> perm(blocks), tables(B * maxb, -1), slots, pos;
      for (int64_t i = 0; i < blocks; ++i) perm[i] = static_cast<int32_t>(i);
      std::shuffle(perm.begin(), perm.end(), rng.gen);
      int next = 0;
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t i = 0; i < (c.lens[b] + bs - 1) / bs; ++i) tables[b * maxb + i] = perm[next++];
        const int64_t last = c.lens[b] - 1;
        slots.push_back(static_cast<int32_t>(tables[b * maxb + last / bs] * bs + last % bs));
        pos.push_back(static_cast<int32_t>(last + 5 * b));  // RoPE positions need not be the context's
      }
      std::vector<float> inv(d / 2);
      for (int64_t i = 0; i < d / 2; ++i) inv[i] = static_cast<float>(std::pow(500000.0, -2.0 * i / d));
      auto qv = Quantize(rng.Normal(B * hq * d), t), kv = Quantize(rng.Normal(B * hkv * d), t), vv = Quantize(rng.Normal(B * hkv * d), t);
      auto qn = Quantize(rng.Normal(d, 0.3f), t), kn = Quantize(rng.Normal(d, 0.3f), t);
      const auto cache0 = Quantize(rng.Normal(blocks * bs * hkv * d), t), cache1 = Quantize(rng.Normal(blocks * bs * hkv * d), t);
      auto q = Make(*be_, {B, hq, d}, t, qv), k = Make(*be_, {B, hkv, d}, t, kv), v = Make(*be_, {B, hkv, d}, t, vv);
      auto qnw = Make(*be_, {d}, t, qn), knw = Make(*be_, {d}, t, kn);
      auto p = Ints(*be_, pos), s = Ints(*be_, slots), cl = Ints(*be_, c.lens), bt = Ints(*be_, tables);
      ASSERT_TRUE(bt.Reshape({B, maxb}).ok());
      bt = *bt.Reshape({B, maxb});
      const Tensor* qnp = c.norm ? &qnw : nullptr;
      const Tensor* knp = c.norm ? &knw : nullptr;
      auto kc = Make(*be_, {blocks, bs, hkv, d}, t, cache0), vc = Make(*be_, {blocks, bs, hkv, d}, t, cache1);
      auto qo = Out(*be_, {B, hq, d}, t), out = Out(*be_, {B, hq, d}, t), lse = Out(*be_, {B, hq}, DType::kF32);
      // With weights to warm into L2 meanwhile (a hint: the same results): one over several
      // of the kernel's pieces, one not a multiple of 16 bytes, one empty.
      auto w1 = Make(*be_, {300 * 1024}, t, Quantize(rng.Normal(300 * 1024), t)), w2 = Make(*be_, {999}, t, Quantize(rng.Normal(999), t));
      const Backend::Warm warm[3] = {{&w1, int64_t(w1.nbytes())}, {&w2, 1001}, {&w1, 0}};
      auto st = be_->DecodeAttention(q, k, v, p, s, qnp, knp, 1e-6f, inv, 1.25f, qo, kc, vc, bt, cl, out, lse, warm);
      ASSERT_TRUE(st.ok()) << st;
      auto kc2 = Make(*be_, {blocks, bs, hkv, d}, t, cache0), vc2 = Make(*be_, {blocks, bs, hkv, d}, t, cache1);
      auto qo2 = Out(*be_, {B, hq, d}, t), out2 = Out(*be_, {B, hq, d}, t), lse2 = Out(*be_, {B, hq}, DType::kF32);
      ASSERT_TRUE(be_->QkRopeCache(q, k, v, p, s, qnp, knp, 1e-6f, inv, 1.25f, qo2, kc2, vc2).ok());
      ASSERT_TRUE(be_->PagedAttention(qo2, kc2, vc2, bt, cl, out2, lse2).ok());
      EXPECT_EQ(Read(*be_, out), Read(*be_, out2));
      EXPECT_EQ(Read(*be_, lse), Read(*be_, lse2));
      EXPECT_EQ(Read(*be_, kc), Read(*be_, kc2));
      EXPECT_EQ(Read(*be_, vc), Read(*be_, vc2));
      // A slot that is not the context's last token is refused by row, and nothing is written.
      std::vector<int32_t> wrong = slots;
      wrong[B - 1] = slots[B - 1] == 0 ? 1 : slots[B - 1] - 1;
      const auto before = Read(*be_, kc);
      EXPECT_THAT(std::string(be_->DecodeAttention(q, k, v, p, Ints(*be_, wrong), qnp, knp, 1e-6f, inv, 1.25f, qo, kc, vc, bt,
                                                   cl, out, lse).message()),
                  HasSubstr(absl::StrCat("slots[", B - 1, "] = ", wrong[B - 1], " is not the slot of the context's last token")));
      EXPECT_EQ(Read(*be_, kc), before);
      // A range past its tensor, one without a tensor, and too many ranges, each refused by name.
      auto attend = [&](absl::Span<const Backend::Warm> w) {
        return std::string(be_->DecodeAttention(q, k, v, p, s, qnp, knp, 1e-6f, inv, 1.25f, qo, kc, vc, bt, cl, out, lse, w).message());
      };
      const Backend::Warm past[2] = {{&w1, 16}, {&w2, int64_t(w2.nbytes()) + 16}};
      EXPECT_THAT(attend(past), HasSubstr(absl::StrCat("warm[1]: ", w2.nbytes() + 16, " bytes, expected 0 to the tensor's ", w2.nbytes())));
      const Backend::Warm none[1] = {{nullptr, 16}};
      EXPECT_THAT(attend(none), HasSubstr("warm[0] names no tensor"));
      const Backend::Warm many[5] = {{&w1, 16}, {&w1, 16}, {&w1, 16}, {&w1, 16}, {&w1, 16}};
      EXPECT_THAT(attend(many), HasSubstr("warm: 5 ranges, at most 4"));
      EXPECT_EQ(Read(*be_, kc), before);
    }
}

// A step's tokens: each from the step before's samples (still on the device) or from the
// host; a source that is not an index of them is refused by name.
TEST_P(OpTest, SelectTakesTokensFromTheDeviceOrTheHost) {
  auto from = Ints(*be_, {70, 71, 72, 73}), values = Ints(*be_, {5, 6, 7, 8, 9});
  auto out = Out(*be_, {5}, DType::kI32);
  auto host = MakeCpuBackend();
  ASSERT_TRUE(be_->Select(Ints(*host, {-1, 3, 0, -1, 3}), from, values, out).ok());
  std::vector<int32_t> got(5);
  ASSERT_TRUE(be_->CopyToHost(out, got.data()).ok());
  EXPECT_EQ(got, (std::vector<int32_t>{5, 73, 70, 8, 73}));
  ASSERT_TRUE(be_->Select(Ints(*be_, {2, -1, -1, 1, 0}), from, values, out).ok());  // sources on the device
  ASSERT_TRUE(be_->CopyToHost(out, got.data()).ok());
  EXPECT_EQ(got, (std::vector<int32_t>{72, 6, 7, 71, 70}));
  EXPECT_THAT(std::string(be_->Select(Ints(*host, {-1, 4, 0, 0, 0}), from, values, out).message()),
              HasSubstr("src[1] = 4 is neither -1 nor an index of from [4]"));
}

// A row sampled at temperature alone over a vocabulary of several segments (the GPU splits
// 16 rows of 6200 tokens into 4 segments each): the frequencies of 6000 draws follow
// softmax(z / T), within a chi-square bound over the tokens that carry the mass, which lie
// in different segments.
TEST_P(OpTest, SamplingAcrossSegmentsFollowsTheSoftmax) {
  const int64_t v = 6200, draws = 6000;
  std::vector<float> row(v, -30.f);
  const std::vector<std::pair<int64_t, float>> heavy = {{5, 2.f}, {2100, 1.5f}, {4500, 1.f}, {6100, 1.2f}};
  for (auto [j, z] : heavy) row[j] = z;
  std::vector<int64_t> counts(v, 0);
  const int64_t chunk = 16;  // draws per call: one row repeated, offsets advancing
  for (int64_t d0 = 0; d0 < draws; d0 += chunk) {
    std::vector<float> z, temp(chunk, 0.9f), top_p(chunk, 1.f);
    std::vector<int32_t> top_k(chunk, 0);
    std::vector<int64_t> seed(chunk, 7), offset(chunk);
    for (int64_t i = 0; i < chunk; ++i) z.insert(z.end(), row.begin(), row.end()), offset[i] = d0 + i;
    auto zl = Make(*be_, {chunk, v}, DType::kF32, z);
    auto tt = Make(*be_, {chunk}, DType::kF32, temp), tp = Make(*be_, {chunk}, DType::kF32, top_p), tk = Ints(*be_, top_k);
    auto sd = Out(*be_, {chunk}, DType::kI64), of = Out(*be_, {chunk}, DType::kI64);
    ASSERT_TRUE(be_->CopyFromHost(seed.data(), sd).ok());
    ASSERT_TRUE(be_->CopyFromHost(offset.data(), of).ok());
    auto tok = Out(*be_, {chunk}, DType::kI32), lp = Out(*be_, {chunk}, DType::kF32);
    ASSERT_TRUE(be_->Sample(zl, tt, tk, tp, sd, of, tok, lp).ok());
    std::vector<int32_t> got(chunk);
    ASSERT_TRUE(be_->CopyToHost(tok, got.data()).ok());
    for (int32_t g : got) {
      ASSERT_GE(g, 0);
      ASSERT_LT(g, v);
      ++counts[g];
    }
  }
  double s = 0;
  for (int64_t j = 0; j < v; ++j) s += std::exp(row[j] / 0.9);
  double chi2 = 0;
  int64_t in_heavy = 0;
  for (auto [j, z] : heavy) {
    const double want = draws * std::exp(z / 0.9) / s;
    chi2 += (counts[j] - want) * (counts[j] - want) / want;
    in_heavy += counts[j];
  }
  EXPECT_LT(chi2, 22.0) << "3 degrees of freedom: 22 is far past p = 0.001";
  EXPECT_GE(in_heavy, draws - 5);  // the rest of the vocabulary holds about 1e-12 of the mass
}

}  // namespace
}  // namespace tessera::runtime::test
