// The single-rank Llama on the CPU backend: configuration and batch validation, the
// backward against directional finite differences of the forward for every parameter
// (plain, and tied embeddings + QKV bias), a few AdamW steps that fit a fixed batch, and
// activation recomputation (same gradients, less memory).
#include "worker/model/llama.h"

#include <cmath>
#include <functional>
#include <iostream>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/worker/model/model_test_util.h"

namespace tessera::model {
namespace {
using ::testing::HasSubstr;
using runtime::Tensor;

LlamaConfig Tiny(bool tied, bool bias) { return test::TinyConfig(13, tied, bias); }
// Three sequences (5, 3, 4 tokens): 9 targets.
TokenBatch MakeBatch(int64_t vocab, uint64_t seed) { return test::RandomBatch(vocab, seed, {5, 3, 4}); }

std::vector<float> Read(runtime::Backend& b, const Tensor& t) {
  std::vector<float> v(t.numel());
  EXPECT_TRUE(b.CopyToHost(t, v.data()).ok());
  return v;
}

TEST(LlamaConfigTest, RejectsBadSizesNamingTheField) {
  LlamaConfig c = Tiny(false, false);
  c.kv_heads = 3;
  EXPECT_THAT(std::string(c.Validate().message()), HasSubstr("heads (4) must be a multiple of kv_heads (3)"));
  c = Tiny(false, false);
  c.ffn = 0;
  EXPECT_THAT(std::string(c.Validate().message()), HasSubstr("ffn must be > 0"));
  c = Tiny(false, false);
  c.hidden = 18;
  EXPECT_THAT(std::string(c.Validate().message()), HasSubstr("hidden (18) must be a multiple of heads (4)"));
  c = Tiny(false, false);
  c.head_dim = 5;
  EXPECT_THAT(std::string(c.Validate().message()), HasSubstr("head_dim must be even"));
  EXPECT_TRUE(Tiny(true, true).Validate().ok());
}

TEST(LlamaConfigTest, ParamSpecsFollowHuggingFaceNames) {
  const auto specs = LlamaParamSpecs(Tiny(false, true));
  ASSERT_EQ(specs.size(), 1 + 2 * 12 + 2u);  // embedding, 12 per layer with biases, norm, head
  EXPECT_EQ(specs[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(specs[2].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(specs[2].shape, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(specs[3].shape, (std::vector<int64_t>{8, 16}));  // k_proj: 2 kv heads x 4
  EXPECT_EQ(specs[5].name, "model.layers.0.self_attn.q_proj.bias");
  EXPECT_EQ(specs.back().name, "lm_head.weight");
  EXPECT_EQ(LlamaParamSpecs(Tiny(true, false)).back().name, "model.norm.weight");
  EXPECT_EQ(Tiny(true, false).NumParams(), 13 * 16 + 2 * (16 + 16 * 16 + 2 * 8 * 16 + 16 * 16 + 16 + 3 * 24 * 16) + 16);
}

TEST(LlamaTest, RejectsBadBatches) {
  auto be = runtime::MakeCpuBackend();
  auto m = Llama::Create(Tiny(false, false), be.get());
  ASSERT_TRUE(m.ok()) << m.status();
  TokenBatch b = MakeBatch(13, 1);
  b.tokens[2] = 13;
  EXPECT_THAT(std::string((*m)->Forward(b).status().message()), HasSubstr("token 2 = 13 is outside [0, 13)"));
  b = MakeBatch(13, 1);
  b.cu_seqlens = {0, 5, 5, 12};
  EXPECT_THAT(std::string((*m)->Forward(b).status().message()), HasSubstr("cu_seqlens must increase strictly"));
  b = MakeBatch(13, 1);
  b.targets.pop_back();
  EXPECT_THAT(std::string((*m)->Forward(b).status().message()), HasSubstr("must have one size"));
}

// Randomizes every parameter (norm weights around 1, biases small) so every term of the
// backward matters; the full tensors are drawn, so every layout gets the same model.
void Randomize(Llama& m, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (auto& p : m.params()) {
    int64_t n = 1;
    for (int64_t d : p.spec.shape) n *= d;
    std::vector<float> v(n);
    const bool norm = p.name().find("norm") != std::string::npos;
    for (auto& x : v) x = norm ? 1.f + 0.2f * normal(rng) : 0.3f * normal(rng);
    ASSERT_TRUE(m.SetGlobal(p, v).ok());
  }
}

class LlamaGradTest : public ::testing::TestWithParam<std::pair<bool, bool>> {};

// For every parameter: d/de L(theta + e v) at e = 0 by central differences (v a random
// unit direction in that parameter) against grad . v, the gradients being what the
// model's grads hold now. The loss is a sum of ~9 token terms of O(1) in f32: rounding
// ~1e-6 / (2 e) = 5e-5 absolute, truncation ~e^2 = 1e-4 relative; tolerance 2e-3
// relative + 2e-4 absolute (seen: <= 2e-4 relative).
void ExpectGradientsMatchFiniteDifferences(Llama& m, runtime::Backend& be, const std::function<double()>& loss,
                                           uint64_t seed, float eps = 1e-2f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (auto& p : m.params()) {
    SCOPED_TRACE(p.name());
    const auto theta = Read(be, p.value), grad = Read(be, p.grad);
    std::vector<float> v(theta.size());
    double norm = 0, analytic = 0;
    for (auto& x : v) x = normal(rng), norm += double(x) * x;
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(v[i] / std::sqrt(norm)), analytic += double(grad[i]) * v[i];
    auto loss_at = [&](float e) {
      std::vector<float> shifted(theta.size());
      for (size_t i = 0; i < theta.size(); ++i) shifted[i] = theta[i] + e * v[i];
      EXPECT_TRUE(be.CopyFromHost(shifted.data(), p.value).ok());
      return loss();
    };
    const double numeric = (loss_at(eps) - loss_at(-eps)) / (2 * eps);
    ASSERT_TRUE(be.CopyFromHost(theta.data(), p.value).ok());
    EXPECT_NEAR(analytic, numeric, 2e-3 * std::abs(numeric) + 2e-4) << "analytic " << analytic << " numeric " << numeric;
  }
}

TEST_P(LlamaGradTest, BackwardMatchesFiniteDifferences) {
  auto [tied, bias] = GetParam();
  auto be = runtime::MakeCpuBackend();
  auto made = Llama::Create(Tiny(tied, bias), be.get());
  ASSERT_TRUE(made.ok()) << made.status();
  Llama& m = **made;
  Randomize(m, 7);
  const TokenBatch batch = MakeBatch(13, 3);
  ASSERT_TRUE(m.ZeroGrads().ok());
  auto base = m.ForwardBackward(batch, 1.f);
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_EQ(base->tokens, 9);
  ExpectGradientsMatchFiniteDifferences(m, *be, [&] {
    auto l = m.Forward(batch);
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? l->sum : NAN;
  }, 11);
}
// RL's actor update: a loss given through dL/dlogprob per token. With dL/dlogprob = -1
// on every target (the cross-entropy sum) it gives ForwardBackward's gradients exactly;
// with random weights w, L = sum_t w_t logprob_t, its gradient matches central
// differences of TokenLogProbs (same tolerance as above).
TEST_P(LlamaGradTest, LogProbGradientIsTheWeightedLogProbsGradient) {
  auto [tied, bias] = GetParam();
  auto be = runtime::MakeCpuBackend();
  auto made = Llama::Create(Tiny(tied, bias), be.get());
  ASSERT_TRUE(made.ok()) << made.status();
  Llama& m = **made;
  Randomize(m, 8);
  const TokenBatch batch = MakeBatch(13, 4);
  const int64_t t = batch.size();
  ASSERT_TRUE(m.ZeroGrads().ok());
  ASSERT_TRUE(m.ForwardBackward(batch, 1.f).ok());
  std::map<std::string, std::vector<float>> ce;
  for (auto& p : m.params()) ce[p.name()] = Read(*be, p.grad);
  ASSERT_TRUE(m.ZeroGrads().ok());
  auto st = m.ForwardBackwardLogProbs(batch, [&](const Llama::TokenStats& s) -> absl::StatusOr<Llama::TokenGrads> {
    EXPECT_EQ(static_cast<int64_t>(s.logprob.size()), t);
    return Llama::TokenGrads{std::vector<float>(t, -1.f), {}};
  });
  ASSERT_TRUE(st.ok()) << st.status();
  for (auto& p : m.params()) EXPECT_EQ(Read(*be, p.grad), ce[p.name()]) << p.name();

  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> w(t);
  for (auto& x : w) x = normal(rng);
  ASSERT_TRUE(m.ZeroGrads().ok());
  ASSERT_TRUE(m.ForwardBackwardLogProbs(batch, [&](const Llama::TokenStats&) -> absl::StatusOr<Llama::TokenGrads> {
                 return Llama::TokenGrads{w, {}};
               }).ok());
  ExpectGradientsMatchFiniteDifferences(m, *be, [&] {
    auto s = m.TokenLogProbs(batch);
    EXPECT_TRUE(s.ok()) << s.status();
    double l = 0;
    for (int64_t i = 0; i < t; ++i) l += s.ok() ? double(w[i]) * s->logprob[i] : NAN;
    return l;
  }, 12);
  // A gradient of the wrong length is refused, naming it.
  auto bad = m.ForwardBackwardLogProbs(batch, [&](const Llama::TokenStats&) -> absl::StatusOr<Llama::TokenGrads> {
    return Llama::TokenGrads{std::vector<float>(3, 0.f), {}};
  });
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr(absl::StrCat("dL/dlogprob: 3 values for ", t, " tokens")));
  bad = m.ForwardBackwardLogProbs(batch, [&](const Llama::TokenStats&) -> absl::StatusOr<Llama::TokenGrads> {
    return Llama::TokenGrads{std::vector<float>(t, 0.f), std::vector<float>(2, 0.f)};
  });
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr(absl::StrCat("dL/dentropy: 2 values for ", t, " tokens")));
}

// The entropy bonus's gradient: L = sum_t (w_t logprob_t + u_t H_t) over the tokens with a
// target (H: the predictive entropy over the whole vocabulary) matches central
// differences of TokenLogProbs' log-probs and entropies, untied and tied (the LM head is
// the embedding there); u on a token without a target is ignored.
TEST_P(LlamaGradTest, EntropyGradientMatchesFiniteDifferences) {
  auto [tied, bias] = GetParam();
  auto be = runtime::MakeCpuBackend();
  auto made = Llama::Create(Tiny(tied, bias), be.get());
  ASSERT_TRUE(made.ok()) << made.status();
  Llama& m = **made;
  Randomize(m, 9);
  const TokenBatch batch = MakeBatch(13, 5);
  const int64_t t = batch.size();
  std::mt19937_64 rng(6);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> w(t), u(t);
  for (auto& x : w) x = normal(rng);
  for (auto& x : u) x = 2.f * normal(rng);
  ASSERT_TRUE(m.ZeroGrads().ok());
  ASSERT_TRUE(m.ForwardBackwardLogProbs(batch, [&](const Llama::TokenStats&) -> absl::StatusOr<Llama::TokenGrads> {
                 return Llama::TokenGrads{w, u};
               }).ok());
  ExpectGradientsMatchFiniteDifferences(m, *be, [&] {
    auto s = m.TokenLogProbs(batch);
    EXPECT_TRUE(s.ok()) << s.status();
    double l = 0;
    for (int64_t i = 0; i < t; ++i)
      if (batch.targets[i] >= 0) l += s.ok() ? double(w[i]) * s->logprob[i] + double(u[i]) * s->entropy[i] : NAN;
    return l;
  }, 13);
}

// A critic (value head): L = sum_t w_t v_t through ForwardBackwardValues matches central
// differences of TokenValues; its parameters are the causal LM's with score.weight [1,
// hidden] for the LM head; each model refuses the other's calls, by name.
TEST_P(LlamaGradTest, CriticValueGradientMatchesFiniteDifferences) {
  auto [tied, bias] = GetParam();
  LlamaConfig c = Tiny(false, bias);
  c.value_head = true;
  auto be = runtime::MakeCpuBackend();
  auto made = Llama::Create(c, be.get());
  ASSERT_TRUE(made.ok()) << made.status();
  Llama& m = **made;
  EXPECT_NE(m.Find("score.weight"), nullptr);
  EXPECT_EQ(m.Find("lm_head.weight"), nullptr);
  EXPECT_EQ(m.Find("score.weight")->weight().shape(), (std::vector<int64_t>{1, c.hidden}));
  Randomize(m, 10);
  const TokenBatch batch = MakeBatch(13, 6);
  const int64_t t = batch.size();
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> w(t);
  for (auto& x : w) x = normal(rng);
  ASSERT_TRUE(m.ZeroGrads().ok());
  auto v = m.ForwardBackwardValues(batch, [&](const std::vector<float>& values) -> absl::StatusOr<std::vector<float>> {
    EXPECT_EQ(static_cast<int64_t>(values.size()), t);
    return w;
  });
  ASSERT_TRUE(v.ok()) << v.status();
  auto again = m.TokenValues(batch);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *v);
  ExpectGradientsMatchFiniteDifferences(m, *be, [&] {
    auto s = m.TokenValues(batch);
    EXPECT_TRUE(s.ok()) << s.status();
    double l = 0;
    for (int64_t i = 0; i < t; ++i) l += s.ok() ? double(w[i]) * (*s)[i] : NAN;
    return l;
  }, 14, 5e-3f);  // half the step: along k_proj the values curve enough that 1e-2's truncation error (4x at 2e-2) shows
  EXPECT_THAT(std::string(m.Forward(batch).status().message()), HasSubstr("a critic (value head) gives values"));
  EXPECT_THAT(std::string(m.TokenLogProbs(batch).status().message()), HasSubstr("a critic (value head) gives values"));
  auto bad = m.ForwardBackwardValues(batch, [&](const std::vector<float>&) -> absl::StatusOr<std::vector<float>> {
    return std::vector<float>(2, 0.f);
  });
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr(absl::StrCat("dL/dvalue: 2 values for ", t, " tokens")));
  auto lm = Llama::Create(Tiny(tied, bias), be.get());
  ASSERT_TRUE(lm.ok());
  EXPECT_THAT(std::string((*lm)->TokenValues(batch).status().message()), HasSubstr("values need a critic"));
  c.tie_embeddings = true;
  EXPECT_THAT(std::string(Llama::Create(c, be.get()).status().message()), HasSubstr("value head is not tied"));
}

INSTANTIATE_TEST_SUITE_P(Variants, LlamaGradTest,
                         ::testing::Values(std::pair{false, false}, std::pair{true, true}),
                         [](const auto& info) {
                           return std::string(info.param.first ? "tied" : "untied") + (info.param.second ? "_bias" : "");
                         });

// Token-mean loss over the batch, AdamW on every parameter: 40 steps fit 9 tokens.
TEST(LlamaTest, AdamWStepsFitABatch) {
  auto be = runtime::MakeCpuBackend();
  auto made = Llama::Create(Tiny(false, true), be.get());
  ASSERT_TRUE(made.ok()) << made.status();
  Llama& m = **made;
  ASSERT_TRUE(m.InitRandom(5, 0.1f).ok());
  const TokenBatch batch = MakeBatch(13, 4);
  std::vector<Tensor> mom, var;
  for (auto& p : m.params()) {
    mom.push_back(*be->Empty(p.value.shape(), tessera::DType::kF32));
    var.push_back(*be->Empty(p.value.shape(), tessera::DType::kF32));
    ASSERT_TRUE(be->Fill(mom.back(), 0).ok() && be->Fill(var.back(), 0).ok());
  }
  double first = 0, last = 0;
  for (int step = 1; step <= 40; ++step) {
    ASSERT_TRUE(m.ZeroGrads().ok());
    auto l = m.ForwardBackward(batch, 1.f / 9);
    ASSERT_TRUE(l.ok()) << l.status();
    (step == 1 ? first : last) = l->sum / l->tokens;
    runtime::AdamWParams hp{3e-2f, 0.9f, 0.95f, 1e-8f, 0.f, step};
    for (size_t i = 0; i < m.params().size(); ++i)
      ASSERT_TRUE(be->AdamW(m.params()[i].value, m.params()[i].grad, mom[i], var[i], hp).ok());
  }
  EXPECT_NEAR(first, std::log(13.0), 0.3);  // near uniform at a small init
  EXPECT_LT(last, 0.25 * first) << "first " << first << " last " << last;
}

// Activation recomputation changes nothing but memory: the same loss and gradients, bit
// for bit, and a lower peak (8 layers: the forward keeps one input per layer instead of
// every activation).
TEST(LlamaTest, RecomputeGivesTheSameGradientsWithLessMemory) {
  auto c = Tiny(true, true);
  c.layers = 8, c.ffn = 64;
  const TokenBatch batch = test::RandomBatch(13, 2, {40, 30, 50});
  struct Run {
    double loss = 0;
    std::vector<std::vector<float>> grads;
    int64_t peak = 0, base = 0;
  } runs[2];
  for (int r = 0; r < 2; ++r) {
    auto be = runtime::MakeCpuBackend();
    auto made = Llama::Create(c, be.get());
    ASSERT_TRUE(made.ok()) << made.status();
    Llama& m = **made;
    ASSERT_TRUE(m.InitRandom(5, 0.3f).ok());
    m.set_recompute(r == 1);
    be->allocator()->ResetPeak();  // the CPU allocator is the process's
    runs[r].base = be->allocator()->stats().current_bytes;  // parameters and gradients
    auto l = m.ForwardBackward(batch, 1.f);
    ASSERT_TRUE(l.ok()) << l.status();
    runs[r].loss = l->sum;
    runs[r].peak = be->allocator()->stats().peak_bytes;
    for (auto& p : m.params()) runs[r].grads.push_back(Read(*be, p.grad));
  }
  EXPECT_EQ(runs[1].loss, runs[0].loss);
  EXPECT_EQ(runs[1].grads, runs[0].grads);
  const int64_t act_plain = runs[0].peak - runs[0].base, act_recompute = runs[1].peak - runs[1].base;
  EXPECT_LT(act_recompute, act_plain / 2) << "activation peak " << act_recompute << " vs " << act_plain << " bytes";
  std::cout << "peak above the weights: " << act_plain << " bytes plain, " << act_recompute << " with recomputation\n";
}

// A forward with no backward after it (log-probs, values) holds one layer's activations at
// a time: its peak above the weights does not grow with the layers, and stays below a
// training forward's of the same model.
TEST(LlamaTest, ForwardOnlyKeepsNoLayersActivations) {
  const TokenBatch batch = test::RandomBatch(13, 2, {40, 30, 50});
  std::map<int64_t, int64_t> above;  // layers -> peak above the weights
  for (int64_t layers : {2, 8}) {
    for (bool critic : {false, true}) {
      auto c = Tiny(false, true);
      c.layers = layers, c.ffn = 64, c.value_head = critic;
      auto be = runtime::MakeCpuBackend();
      auto made = Llama::Create(c, be.get());
      ASSERT_TRUE(made.ok()) << made.status();
      ASSERT_TRUE((*made)->InitRandom(5, 0.3f).ok());
      be->allocator()->ResetPeak();
      const int64_t base = be->allocator()->stats().current_bytes;
      if (critic) {
        ASSERT_TRUE((*made)->TokenValues(batch).ok());
      } else {
        ASSERT_TRUE((*made)->TokenLogProbs(batch).ok());
      }
      const int64_t fwd = be->allocator()->stats().peak_bytes - base;
      if (!critic) above[layers] = fwd;
      be->allocator()->ResetPeak();
      if (critic) {
        ASSERT_TRUE((*made)->ForwardBackwardValues(batch, [](const std::vector<float>& v) {
                          return absl::StatusOr<std::vector<float>>(std::vector<float>(v.size(), 1.f));
                        }).ok());
      } else {
        ASSERT_TRUE((*made)->ForwardBackward(batch, 1.f).ok());
      }
      const int64_t train = be->allocator()->stats().peak_bytes - base;
      if (layers == 8) {
        EXPECT_LT(fwd, train / 2) << (critic ? "values" : "log-probs") << ": " << fwd << " vs " << train;
      }
    }
  }
  EXPECT_EQ(above[8], above[2]) << "a forward's peak grew with the layers";
}

}  // namespace
}  // namespace tessera::model

namespace tessera::model {
namespace {
// Mixed precision: the logits come back as f32 whatever the compute dtype, and the bf16
// forward stays within bf16 rounding of the f32 one (1e-2 of the logits' norm; the same
// weights, bf16 compute copies and activations).
TEST(LlamaTest, MixedPrecisionLogitsTrackF32) {
  auto be = runtime::MakeCpuBackend();
  LlamaConfig c = test::TinyConfig(64, /*tied=*/true, /*bias=*/true);
  std::vector<std::vector<float>> logits;
  for (auto dtype : {tessera::DType::kF32, tessera::DType::kBF16}) {
    c.dtype = dtype;
    auto m = Llama::Create(c, be.get());
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE((*m)->InitRandom(5, 0.1f).ok());
    auto l = (*m)->ForwardLogits(test::RandomBatch(64, 3, {9, 4}));
    ASSERT_TRUE(l.ok()) << l.status();
    logits.push_back(*l);
  }
  ASSERT_EQ(logits[1].size(), logits[0].size());
  EXPECT_LT(test::RelDiff(logits[1], logits[0]), 1e-2);
}

// Per-token log-probs and entropies (RL's reference / old-policy log-probs) equal a
// log-softmax of the model's own logits computed here in double; tokens without a
// target (each sequence's last) get logprob 0.
TEST(LlamaTest, TokenLogProbsEqualLogSoftmaxOfTheLogits) {
  auto be = runtime::MakeCpuBackend();
  const LlamaConfig c = test::TinyConfig(64, /*tied=*/true, /*bias=*/true);
  auto m = Llama::Create(c, be.get());
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE((*m)->InitRandom(5, 0.3f).ok());
  const TokenBatch batch = test::RandomBatch(64, 7, {9, 4});
  auto logits = (*m)->ForwardLogits(batch);
  auto stats = (*m)->TokenLogProbs(batch);
  ASSERT_TRUE(logits.ok() && stats.ok()) << stats.status();
  const int64_t t = batch.size(), v = c.vocab;
  ASSERT_EQ(stats->logprob.size(), static_cast<size_t>(t));
  ASSERT_EQ(stats->entropy.size(), static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) {
    const float* z = logits->data() + i * v;
    double mx = z[0];
    for (int64_t j = 1; j < v; ++j) mx = std::max<double>(mx, z[j]);
    double s = 0, pz = 0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(z[j] - mx);
    const double lse = mx + std::log(s);
    for (int64_t j = 0; j < v; ++j) pz += std::exp(z[j] - lse) * z[j];
    const double want_lp = batch.targets[i] < 0 ? 0.0 : z[batch.targets[i]] - lse;
    EXPECT_NEAR(stats->logprob[i], want_lp, 1e-5 * (1 + std::abs(want_lp))) << "token " << i;
    EXPECT_NEAR(stats->entropy[i], lse - pz, 1e-5 * (1 + lse)) << "token " << i;
    EXPECT_GT(stats->entropy[i], 0);
    EXPECT_LE(stats->entropy[i], std::log(static_cast<double>(v)) + 1e-5);
  }
  EXPECT_EQ(stats->logprob[8], 0.f);  // the first sequence's last token has no target
}
}  // namespace
}  // namespace tessera::model

namespace tessera::model {
namespace {
// A frozen model (RL's reference) gives the same log-probs from its bf16 compute copies,
// holds 2 bytes per parameter instead of 10 (f32 value and gradient dropped), and
// refuses a backward or a weight write by name.
TEST(LlamaTest, FreezeKeepsTheForwardAndDropsWhatOnlyTrainingNeeds) {
  auto be = runtime::MakeCpuBackend();
  LlamaConfig c = test::TinyConfig(64, /*tied=*/true, /*bias=*/true);
  c.dtype = tessera::DType::kBF16;
  auto m = Llama::Create(c, be.get());
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE((*m)->InitRandom(5, 0.3f).ok());
  const TokenBatch batch = test::RandomBatch(64, 7, {9, 4});
  auto before = (*m)->TokenLogProbs(batch);
  ASSERT_TRUE(before.ok()) << before.status();
  int64_t params = 0;
  for (auto& p : (*m)->params()) params += p.value.numel();
  const int64_t held = be->allocator()->stats().current_bytes;
  ASSERT_TRUE((*m)->Freeze().ok());
  EXPECT_TRUE((*m)->frozen());
  EXPECT_LE(be->allocator()->stats().current_bytes, held - 8 * params);
  auto after = (*m)->TokenLogProbs(batch);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->logprob, before->logprob);
  EXPECT_EQ(after->entropy, before->entropy);
  auto bwd = (*m)->ForwardBackward(batch, 1.f);
  ASSERT_FALSE(bwd.ok());
  EXPECT_EQ(bwd.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(bwd.status().message(), HasSubstr("frozen"));
  EXPECT_EQ((*m)->SetGlobal((*m)->params()[0], std::vector<float>((*m)->params()[0].spec.shape[0] *
                                                                   (*m)->params()[0].spec.shape[1])).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*m)->GatherGlobal((*m)->params()[0], false).status().code(), absl::StatusCode::kFailedPrecondition);
}
}  // namespace
}  // namespace tessera::model
