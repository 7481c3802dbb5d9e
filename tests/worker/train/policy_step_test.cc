// Trainer::PolicyStep (the RL actor's update) on the CPU backend: it moves the policy the
// way the advantages say, and dp2 (ZeRO 0 and 1) and tp2 (threads, Gloo) equal one rank
// — per-step policy losses, KL, clip fractions, gradient norms and the final weights
// within 1e-5 relative.
#include <cmath>
#include <functional>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/util.h"
#include "tests/common/mem_store.h"
#include "tests/worker/model/model_test_util.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/train/trainer.h"

namespace tessera::engine {
namespace {
using ::testing::HasSubstr;
using model::Llama;
using model::TokenBatch;

model::LlamaConfig Config() {
  model::LlamaConfig c = model::test::TinyConfig(32, /*tied=*/true, /*bias=*/false);
  c.hidden = 32, c.ffn = 48;
  return c;
}

// Two micro-batches of two "prompt + response" sequences each; the response is the last
// `resp` tokens, and the mask counts the targets that are response tokens.
std::vector<TokenBatch> MicroBatches() {
  return {model::test::RandomBatch(32, 1, {9, 6}), model::test::RandomBatch(32, 2, {7, 8})};
}
std::vector<double> ResponseMask(const TokenBatch& b, int resp) {
  std::vector<double> mask(b.size(), 0.0);
  for (size_t s = 0; s + 1 < b.cu_seqlens.size(); ++s)
    for (int32_t t = std::max(b.cu_seqlens[s], b.cu_seqlens[s + 1] - 1 - resp); t < b.cu_seqlens[s + 1] - 1; ++t) mask[t] = 1;
  return mask;
}

struct Trace {
  std::vector<Trainer::PolicyStats> steps;
  std::map<std::string, std::vector<float>> weights;
};

// Three policy steps on the micro-batches `mine` (indices into MicroBatches()); old
// log-probs from the policy before each step, advantages +1 on the first sequence of a
// micro-batch and -0.5 on the second, a k3 KL term against the initial policy and an
// entropy bonus (its gradient goes through the vocabulary-parallel softmax under TP).
void RunPolicy(comm::Communicator* tp, comm::Communicator* dp, int zero, const std::vector<int>& mine, Trace& out) {
  auto be = runtime::MakeCpuBackend();
  auto m = Llama::Create(Config(), be.get(), tp);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE((*m)->InitRandom(4, 0.2f).ok());
  OptimizerOptions o;
  o.lr = 2e-2f, o.min_lr = 2e-2f, o.warmup_steps = 0, o.total_steps = 3, o.clip_norm = 1.f, o.zero = zero;
  auto t = Trainer::Create(m->get(), be.get(), dp, tp, o);
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<TokenBatch> all = MicroBatches();
  std::vector<TokenBatch> batches;
  for (int i : mine) batches.push_back(all[i]);
  std::vector<Trainer::PolicyTokens> ref(batches.size());
  for (size_t i = 0; i < batches.size(); ++i) {
    auto st = (*m)->TokenLogProbs(batches[i]);
    ASSERT_TRUE(st.ok()) << st.status();
    ref[i].ref_logp.assign(st->logprob.begin(), st->logprob.end());
  }
  rl::PolicyLossOptions po;
  po.kl_coef = 0.1, po.clip_low = po.clip_high = 0.2, po.entropy_coef = 0.05;
  for (int step = 0; step < 3; ++step) {
    std::vector<Trainer::PolicyTokens> tokens(batches.size());
    for (size_t i = 0; i < batches.size(); ++i) {
      const TokenBatch& b = batches[i];
      auto st = (*m)->TokenLogProbs(b);
      ASSERT_TRUE(st.ok()) << st.status();
      // The old policy: this step's log-probs, shifted on later steps so that ratios clip.
      for (float lp : st->logprob) tokens[i].old_logp.push_back(lp + 0.3 * step * ((&lp - st->logprob.data()) % 2 ? 1 : -1));
      tokens[i].mask = ResponseMask(b, 3);
      tokens[i].ref_logp = ref[i].ref_logp;
      for (int32_t t = 0; t < static_cast<int32_t>(b.size()); ++t) tokens[i].advantage.push_back(t < b.cu_seqlens[1] ? 1.0 : -0.5);
    }
    auto s = (*t)->PolicyStep(batches, tokens, po);
    ASSERT_TRUE(s.ok()) << s.status();
    out.steps.push_back(*s);
  }
  for (auto& p : (*m)->params()) out.weights[p.name()] = *(*m)->GatherGlobal(p, /*grad=*/false);
}

void ExpectSame(const Trace& got, const Trace& one) {
  ASSERT_EQ(got.steps.size(), one.steps.size());
  for (size_t s = 0; s < one.steps.size(); ++s) {
    SCOPED_TRACE(::testing::Message() << "step " << s + 1);
    EXPECT_NEAR(got.steps[s].loss, one.steps[s].loss, 1e-5 * std::abs(one.steps[s].loss) + 1e-7);
    EXPECT_NEAR(got.steps[s].kl, one.steps[s].kl, 1e-5 * std::abs(one.steps[s].kl) + 1e-9);
    EXPECT_NEAR(got.steps[s].clip_fraction, one.steps[s].clip_fraction, 1e-6);
    EXPECT_NEAR(got.steps[s].entropy, one.steps[s].entropy, 1e-5 * one.steps[s].entropy);
    EXPECT_NEAR(got.steps[s].grad_norm, one.steps[s].grad_norm, 1e-5 * one.steps[s].grad_norm);
    EXPECT_EQ(got.steps[s].tokens, one.steps[s].tokens);
  }
  for (auto& [name, w] : one.weights) EXPECT_LT(model::test::RelDiff(got.weights.at(name), w), 1e-5) << name;
}

// The two-rank layouts the RL steps are checked in, each rank on a Gloo thread: under
// TP both ranks take both micro-batches, under DP one each.
struct TwoRanks {
  const char* name;
  int tp, dp, zero;
};
constexpr TwoRanks kTwoRankLayouts[] = {{"dp2", 1, 2, 0}, {"dp2_zero1", 1, 2, 1}, {"tp2", 2, 1, 0}};
void OnTwoRanks(const TwoRanks& l,
                const std::function<void(comm::Communicator* tp, comm::Communicator* dp, const std::vector<int>& mine,
                                         int rank)>& body) {
  tessera::testing::MemStore store;
  const std::string key = RandomHex(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      auto c = comm::MakeGlooCommunicator(l.name, key, r, 2, &store, {"127.0.0.1", 60000});
      ASSERT_TRUE(c.ok()) << c.status();
      if (l.tp == 2) body(c->get(), nullptr, {0, 1}, r);
      else body(nullptr, c->get(), {r}, r);
    });
  for (auto& t : threads) t.join();
}

TEST(PolicyStep, DpAndTpEqualOneRank) {
  Trace one;
  RunPolicy(nullptr, nullptr, 0, {0, 1}, one);
  ASSERT_EQ(one.steps.size(), 3u);
  EXPECT_GT(one.steps[2].clip_fraction, 0);  // the shifted old policy clips some ratios
  EXPECT_GT(one.steps[2].kl, 0);              // the policy moved away from the reference
  EXPECT_GT(one.steps[0].entropy, 0);
  for (TwoRanks l : kTwoRankLayouts) {
    SCOPED_TRACE(l.name);
    Trace ranks[2];
    OnTwoRanks(l, [&](comm::Communicator* tp, comm::Communicator* dp, const std::vector<int>& mine, int r) {
      RunPolicy(tp, dp, l.zero, mine, ranks[r]);
    });
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE(::testing::Message() << "rank " << r);
      ExpectSame(ranks[r], one);
    }
  }
}

// PPO's critic: three ValueSteps on returns with a clipped value loss (old values from
// the critic before each step; shifted by +-shift x step so that some clip); dp2 (ZeRO 0
// and 1) and tp2 equal one rank (losses, clip fractions, gradient norms, final weights
// within 1e-5); unshifted, as PPO runs one epoch, the values move toward the returns.
struct CriticTrace {
  std::vector<Trainer::ValueStats> steps;
  std::map<std::string, std::vector<float>> weights;
  double error_before = 0, error_after = 0;  // mean squared (value - return) over the mask
};
void RunCritic(comm::Communicator* tp, comm::Communicator* dp, int zero, const std::vector<int>& mine, double shift,
               CriticTrace& out) {
  auto be = runtime::MakeCpuBackend();
  model::LlamaConfig c = Config();
  c.tie_embeddings = false, c.value_head = true;
  auto m = Llama::Create(c, be.get(), tp);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE((*m)->InitRandom(4, 0.2f).ok());
  OptimizerOptions o;
  o.lr = 5e-3f, o.min_lr = 5e-3f, o.warmup_steps = 0, o.total_steps = 3, o.clip_norm = 1.f, o.zero = zero;
  auto t = Trainer::Create(m->get(), be.get(), dp, tp, o);
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<TokenBatch> all = MicroBatches();
  std::vector<TokenBatch> batches;
  for (int i : mine) batches.push_back(all[i]);
  auto returns_of = [](const TokenBatch& b, size_t k) { return k < static_cast<size_t>(b.cu_seqlens[1]) ? 1.0 : -0.5; };
  auto error = [&]() {
    double e = 0, n = 0;
    for (const TokenBatch& b : batches) {
      auto v = (*m)->TokenValues(b);
      EXPECT_TRUE(v.ok()) << v.status();
      const auto mask = ResponseMask(b, 3);
      for (size_t k = 0; v.ok() && k < v->size(); ++k) e += mask[k] * std::pow((*v)[k] - returns_of(b, k), 2), n += mask[k];
    }
    return e / n;
  };
  out.error_before = error();
  for (int step = 0; step < 3; ++step) {
    std::vector<Trainer::ValueTokens> tokens(batches.size());
    for (size_t i = 0; i < batches.size(); ++i) {
      const TokenBatch& b = batches[i];
      auto v = (*m)->TokenValues(b);
      ASSERT_TRUE(v.ok()) << v.status();
      for (size_t k = 0; k < v->size(); ++k) {
        tokens[i].old_value.push_back((*v)[k] + shift * step * (k % 2 ? 1 : -1));
        tokens[i].returns.push_back(returns_of(b, k));
      }
      tokens[i].mask = ResponseMask(b, 3);
    }
    auto s = (*t)->ValueStep(batches, tokens, 0.2);
    ASSERT_TRUE(s.ok()) << s.status();
    out.steps.push_back(*s);
  }
  out.error_after = error();
  for (auto& p : (*m)->params()) out.weights[p.name()] = *(*m)->GatherGlobal(p, /*grad=*/false);
}

TEST(ValueStep, DpAndTpEqualOneRankAndTheCriticFitsTheReturns) {
  CriticTrace fit;
  RunCritic(nullptr, nullptr, 0, {0, 1}, 0.0, fit);
  ASSERT_EQ(fit.steps.size(), 3u);
  EXPECT_LT(fit.error_after, 0.5 * fit.error_before);  // the values move toward the returns
  EXPECT_LT(fit.steps[2].loss, fit.steps[0].loss);
  CriticTrace one;
  RunCritic(nullptr, nullptr, 0, {0, 1}, 0.3, one);
  ASSERT_EQ(one.steps.size(), 3u);
  EXPECT_GT(one.steps[2].clip_fraction, 0);
  EXPECT_EQ(one.steps[0].tokens, 12);
  for (TwoRanks l : kTwoRankLayouts) {
    SCOPED_TRACE(l.name);
    CriticTrace ranks[2];
    OnTwoRanks(l, [&](comm::Communicator* tp, comm::Communicator* dp, const std::vector<int>& mine, int r) {
      RunCritic(tp, dp, l.zero, mine, 0.3, ranks[r]);
    });
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE(::testing::Message() << "rank " << r);
      ASSERT_EQ(ranks[r].steps.size(), 3u);
      for (int s = 0; s < 3; ++s) {
        EXPECT_NEAR(ranks[r].steps[s].loss, one.steps[s].loss, 1e-5 * one.steps[s].loss);
        EXPECT_NEAR(ranks[r].steps[s].clip_fraction, one.steps[s].clip_fraction, 1e-6);
        EXPECT_NEAR(ranks[r].steps[s].value, one.steps[s].value, 1e-5 * std::abs(one.steps[s].value) + 1e-6);
        EXPECT_NEAR(ranks[r].steps[s].grad_norm, one.steps[s].grad_norm, 1e-5 * one.steps[s].grad_norm);
      }
      for (auto& [name, w] : one.weights) EXPECT_LT(model::test::RelDiff(ranks[r].weights.at(name), w), 1e-5) << name;
    }
  }
  // Bad input names the field; a model without a value head is refused.
  auto be = runtime::MakeCpuBackend();
  model::LlamaConfig c = Config();
  c.tie_embeddings = false, c.value_head = true;
  auto m = Llama::Create(c, be.get());
  ASSERT_TRUE(m.ok());
  auto t = Trainer::Create(m->get(), be.get(), nullptr, nullptr, OptimizerOptions());
  ASSERT_TRUE(t.ok());
  const TokenBatch b = MicroBatches()[0];
  Trainer::ValueTokens v{std::vector<double>(b.size(), 0.0), std::vector<double>(b.size() - 1, 0.0), ResponseMask(b, 3)};
  EXPECT_THAT(std::string((*t)->ValueStep({b}, {v}, 0.2).status().message()),
              HasSubstr("micro-batch 0 has 15 tokens; old_value, returns and mask need one value each"));
  auto lm = Llama::Create(Config(), be.get());
  ASSERT_TRUE(lm.ok());
  auto tl = Trainer::Create(lm->get(), be.get(), nullptr, nullptr, OptimizerOptions());
  ASSERT_TRUE(tl.ok());
  v.returns.push_back(0.0);
  EXPECT_THAT(std::string((*tl)->ValueStep({b}, {v}, 0.2).status().message()), HasSubstr("values need a critic"));
}

// One rank's actor for single-step checks: the tiny policy, AdamW at a constant lr 1e-2.
struct OneRank {
  std::unique_ptr<runtime::Backend> be = runtime::MakeCpuBackend();
  std::unique_ptr<Llama> model;
  std::unique_ptr<Trainer> trainer;
  OneRank() {
    auto m = Llama::Create(Config(), be.get());
    if (!m.ok() || !(*m)->InitRandom(4, 0.2f).ok()) return;
    model = std::move(*m);
    OptimizerOptions o;
    o.lr = 1e-2f, o.min_lr = 1e-2f, o.warmup_steps = 0, o.total_steps = 1;
    auto t = Trainer::Create(model.get(), be.get(), nullptr, nullptr, o);
    if (t.ok()) trainer = std::move(*t);
  }
};

// A micro-batch's policy inputs before any update: the model's own log-probs as the old
// policy's, and the response mask from position 4 on (advantages left to the test).
Trainer::PolicyTokens OnPolicy(const Llama::TokenStats& before, const TokenBatch& b) {
  Trainer::PolicyTokens p;
  p.old_logp.assign(before.logprob.begin(), before.logprob.end());
  p.mask = ResponseMask(b, 4);
  return p;
}

// The entropy bonus alone (advantages 0, so the surrogate has no gradient) raises the
// predictive entropy of the counted tokens; PolicyStats::entropy is their mean before.
TEST(PolicyStep, EntropyBonusRaisesTheEntropy) {
  OneRank r;
  ASSERT_NE(r.trainer, nullptr);
  const TokenBatch b = model::test::RandomBatch(32, 6, {10, 10});
  auto before = r.model->TokenLogProbs(b);
  ASSERT_TRUE(before.ok());
  Trainer::PolicyTokens p = OnPolicy(*before, b);
  p.advantage.assign(b.size(), 0.0);
  auto mean_entropy = [&](const Llama::TokenStats& st) {
    double sum = 0, n = 0;
    for (size_t i = 0; i < p.mask.size(); ++i) sum += p.mask[i] * st.entropy[i], n += p.mask[i];
    return sum / n;
  };
  rl::PolicyLossOptions ent;
  ent.entropy_coef = 1.0;
  auto s = r.trainer->PolicyStep({b}, {p}, ent);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_NEAR(s->entropy, mean_entropy(*before), 1e-5 * mean_entropy(*before));
  EXPECT_NEAR(s->loss, -s->entropy, 1e-5 * s->entropy);  // no surrogate, no KL: L = -H
  auto after = r.model->TokenLogProbs(b);
  ASSERT_TRUE(after.ok());
  EXPECT_GT(mean_entropy(*after), mean_entropy(*before) + 1e-3);
}

// One step with positive advantages on one sequence's response and negative on the
// other's raises the first's log-probs and lowers the second's.
TEST(PolicyStep, FollowsTheAdvantages) {
  OneRank r;
  ASSERT_NE(r.trainer, nullptr);
  const TokenBatch b = model::test::RandomBatch(32, 5, {10, 10});
  auto before = r.model->TokenLogProbs(b);
  ASSERT_TRUE(before.ok());
  Trainer::PolicyTokens p = OnPolicy(*before, b);
  for (int32_t i = 0; i < static_cast<int32_t>(b.size()); ++i) p.advantage.push_back(i < 10 ? 1.0 : -1.0);
  auto s = r.trainer->PolicyStep({b}, {p}, {});
  ASSERT_TRUE(s.ok()) << s.status();
  auto after = r.model->TokenLogProbs(b);
  ASSERT_TRUE(after.ok());
  double up = 0, down = 0;
  for (size_t i = 0; i < p.mask.size(); ++i)
    if (p.mask[i] > 0) (i < 10 ? up : down) += after->logprob[i] - before->logprob[i];
  EXPECT_GT(up, 0);
  EXPECT_LT(down, 0);
  // Bad input names what is wrong; nothing is updated.
  Trainer::PolicyTokens short_mask = p;
  short_mask.mask.pop_back();
  EXPECT_THAT(std::string(r.trainer->PolicyStep({b}, {short_mask}, {}).status().message()),
              HasSubstr("micro-batch 0 has 20 tokens; old_logp, advantage, mask need one value each"));
  Trainer::PolicyTokens none = p;
  std::fill(none.mask.begin(), none.mask.end(), 0.0);
  EXPECT_THAT(std::string(r.trainer->PolicyStep({b}, {none}, {}).status().message()), HasSubstr("no counted"));
  EXPECT_EQ(r.trainer->step(), 1);
}

// The loss aggregations against the token mean, one step from the same start each. Every
// sequence of the micro-batches counts 3 response tokens (N = 12 tokens, S = 4
// responses): seq_mean_token_sum is N / S = 3 times the token mean — loss and gradient
// norm —, seq_mean_token_mean equals it, seq_mean_token_sum_norm over 6 tokens is half.
// Under DP (each rank one micro-batch) the denominators span the ranks: the same numbers.
TEST(PolicyStep, LossAggregationsScaleTheTokenMean) {
  auto one_step = [](rl::LossAggregation a, comm::Communicator* dp, const std::vector<int>& mine) {
    Trainer::PolicyStats out;
    auto be = runtime::MakeCpuBackend();
    auto m = Llama::Create(Config(), be.get());
    EXPECT_TRUE(m.ok() && (*m)->InitRandom(4, 0.2f).ok());
    if (!m.ok()) return out;
    OptimizerOptions o;
    o.lr = 1e-2f, o.min_lr = 1e-2f, o.warmup_steps = 0, o.total_steps = 1;
    auto t = Trainer::Create(m->get(), be.get(), dp, nullptr, o);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return out;
    struct {
      Llama* model;
      Trainer* trainer;
    } r{m->get(), t->get()};
    const std::vector<TokenBatch> all = MicroBatches();
    std::vector<TokenBatch> batches;
    std::vector<Trainer::PolicyTokens> tokens;
    for (int i : mine) {
      batches.push_back(all[i]);
      auto before = r.model->TokenLogProbs(all[i]);
      EXPECT_TRUE(before.ok());
      Trainer::PolicyTokens p;
      p.old_logp.assign(before->logprob.begin(), before->logprob.end());
      p.mask = ResponseMask(all[i], 3);
      for (int32_t t = 0; t < static_cast<int32_t>(all[i].size()); ++t) p.advantage.push_back(t < all[i].cu_seqlens[1] ? 1.0 : -0.5);
      tokens.push_back(std::move(p));
    }
    rl::PolicyLossOptions po;
    po.aggregation = a, po.norm_length = 6;
    auto s = r.trainer->PolicyStep(batches, tokens, po);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : out;
  };
  const Trainer::PolicyStats mean = one_step(rl::LossAggregation::kTokenMean, nullptr, {0, 1});
  ASSERT_EQ(mean.tokens, 12);
  ASSERT_GT(mean.grad_norm, 0);
  const std::pair<rl::LossAggregation, double> modes[] = {{rl::LossAggregation::kSeqMeanTokenSum, 3.0},
                                                          {rl::LossAggregation::kSeqMeanTokenMean, 1.0},
                                                          {rl::LossAggregation::kSeqMeanTokenSumNorm, 0.5}};
  for (auto [mode, scale] : modes) {
    SCOPED_TRACE(static_cast<int>(mode));
    const Trainer::PolicyStats got = one_step(mode, nullptr, {0, 1});
    EXPECT_NEAR(got.loss, scale * mean.loss, 1e-5 * std::abs(scale * mean.loss));
    EXPECT_NEAR(got.grad_norm, scale * mean.grad_norm, 1e-5 * scale * mean.grad_norm);
    EXPECT_NEAR(got.clip_fraction, mean.clip_fraction, 1e-7);
    EXPECT_EQ(got.tokens, 12);
    Trainer::PolicyStats ranks[2];
    OnTwoRanks(kTwoRankLayouts[0], [&](comm::Communicator*, comm::Communicator* dp, const std::vector<int>& mine, int r) {
      ranks[r] = one_step(mode, dp, mine);
    });
    for (const Trainer::PolicyStats& rank : ranks) {
      EXPECT_NEAR(rank.loss, got.loss, 1e-5 * std::abs(got.loss));
      EXPECT_NEAR(rank.grad_norm, got.grad_norm, 1e-5 * got.grad_norm);
      EXPECT_EQ(rank.tokens, 12);
    }
  }
}

// seq_mean_token_mean with responses of different lengths weighs each response's tokens
// 1 / (S n_i): the same step as the token mean with advantages scaled by N / (S n_i) —
// responses of 4 and 2 counted tokens (N = 6, S = 2): x0.75 and x1.5 — to the last weight.
TEST(PolicyStep, SeqMeanTokenMeanWeighsResponsesEqually) {
  const TokenBatch b = model::test::RandomBatch(32, 7, {10, 10});
  Trainer::PolicyStats stats[2];
  std::map<std::string, std::vector<float>> weights[2];
  for (int run = 0; run < 2; ++run) {
    OneRank r;
    ASSERT_NE(r.trainer, nullptr);
    auto before = r.model->TokenLogProbs(b);
    ASSERT_TRUE(before.ok());
    Trainer::PolicyTokens p = OnPolicy(*before, b);
    std::fill(p.mask.begin(), p.mask.end(), 0.0);
    for (int t : {4, 5, 6, 7, 14, 15}) p.mask[t] = 1;
    for (int32_t t = 0; t < static_cast<int32_t>(b.size()); ++t) {
      const double a = t < 10 ? 1.0 : -1.0;
      p.advantage.push_back(run == 0 ? a : a * (t < 10 ? 0.75 : 1.5));
    }
    rl::PolicyLossOptions po;
    if (run == 0) po.aggregation = rl::LossAggregation::kSeqMeanTokenMean;
    auto s = r.trainer->PolicyStep({b}, {p}, po);
    ASSERT_TRUE(s.ok()) << s.status();
    stats[run] = *s;
    for (auto& param : r.model->params()) weights[run][param.name()] = *r.model->GatherGlobal(param, /*grad=*/false);
  }
  EXPECT_NEAR(stats[0].grad_norm, stats[1].grad_norm, 1e-5 * stats[1].grad_norm);
  EXPECT_NEAR(stats[0].loss, stats[1].loss, 1e-6);
  for (auto& [name, w] : weights[1]) EXPECT_LT(model::test::RelDiff(weights[0].at(name), w), 1e-5) << name;
}

}  // namespace
}  // namespace tessera::engine
