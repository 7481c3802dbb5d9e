// The RL objectives' arithmetic (common/rl.h) against hand computations, and the policy
// loss's gradients against central differences.
#include "common/rl.h"

#include <cmath>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tessera::rl {
namespace {

using ::testing::HasSubstr;

// PPO's advantages by hand: rewards [0, 1] (the outcome on the last token), values
// [0.5, 0.25], gamma = lambda = 1: delta_1 = 1 - 0.25, A_1 = 0.75, R_1 = 1;
// delta_0 = 0.25 - 0.5, A_0 = 0.5, R_0 = 1. With the k1 penalty 0.1 (old - ref) =
// 0.1 [0.5, -1]: rewards [-0.05, 1.1], A_1 = 0.85, R_1 = 1.1, A_0 = -0.3 + 0.85 = 0.55,
// R_0 = 1.05, mean k1 -0.25. Whitened: mean 0 and unbiased deviation 1 over all tokens.
TEST(PpoAdvantages, GaeWithTheKlPenaltyAndWhitening) {
  PpoResponse r{1.0, {0.5, 0.25}, {-1, -2}, {-1.5, -1}};
  auto plain = ComputePpoAdvantages({r}, {.gamma = 1, .lambda = 1, .kl_reward_coef = 0, .whiten = false});
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_THAT(plain->advantages[0], ::testing::ElementsAre(::testing::DoubleNear(0.5, 1e-12), ::testing::DoubleNear(0.75, 1e-12)));
  EXPECT_THAT(plain->returns[0], ::testing::ElementsAre(::testing::DoubleNear(1.0, 1e-12), ::testing::DoubleNear(1.0, 1e-12)));
  EXPECT_EQ(plain->reward_kl, 0);
  auto kl = ComputePpoAdvantages({r}, {.gamma = 1, .lambda = 1, .kl_reward_coef = 0.1, .whiten = false});
  ASSERT_TRUE(kl.ok()) << kl.status();
  EXPECT_THAT(kl->advantages[0], ::testing::ElementsAre(::testing::DoubleNear(0.55, 1e-12), ::testing::DoubleNear(0.85, 1e-12)));
  EXPECT_THAT(kl->returns[0], ::testing::ElementsAre(::testing::DoubleNear(1.05, 1e-12), ::testing::DoubleNear(1.1, 1e-12)));
  EXPECT_DOUBLE_EQ(kl->reward_kl, -0.25);
  PpoResponse empty{0.0, {}, {}, {}}, other{0.0, {0.1}, {-1}, {-1}};
  auto w = ComputePpoAdvantages({r, empty, other}, {.gamma = 1, .lambda = 1, .kl_reward_coef = 0.1, .whiten = true});
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->advantages[1].size(), 0u);
  std::vector<double> all = {w->advantages[0][0], w->advantages[0][1], w->advantages[2][0]};
  double mean = 0, sq = 0;
  for (double v : all) mean += v / 3;
  for (double v : all) sq += (v - mean) * (v - mean) / 2;
  EXPECT_NEAR(mean, 0, 1e-12);
  EXPECT_NEAR(sq, 1, 1e-6);
  EXPECT_GT(w->advantages[0][1], w->advantages[0][0]);  // the order kept: 0.85 > 0.55 > -0.1
  EXPECT_NEAR(w->returns[0][1], 1.1, 1e-12);  // the returns are not whitened
  r.ref_logp.pop_back();
  EXPECT_THAT(std::string(ComputePpoAdvantages({r}, {.kl_reward_coef = 0.1}).status().message()),
              HasSubstr("responses[0]: 2 old and 1 reference log-probs for 2 values"));
}

TEST(GroupAdvantages, NormalizeWithinEachGroup) {
  // Group 1: mean 0.5, unbiased std sqrt(1/3); group 2: all equal, so all 0.
  auto a = GroupNormalizedAdvantages({1, 0, 1, 0, 2, 2, 2, 2}, {.group_size = 4, .eps = 0});
  ASSERT_TRUE(a.ok()) << a.status();
  const double z = 0.5 / std::sqrt(1.0 / 3.0);  // 0.866...
  const std::vector<double> want = {z, -z, z, -z, 0, 0, 0, 0};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR((*a)[i], want[i], 1e-12) << i;
  auto centered = GroupNormalizedAdvantages({1, 0, 1, 0}, {.group_size = 2, .scale_by_std = false});
  ASSERT_TRUE(centered.ok());
  EXPECT_EQ(*centered, (std::vector<double>{0.5, -0.5, 0.5, -0.5}));
  // eps keeps an all-equal group finite; the default eps barely moves the others.
  auto eps = GroupNormalizedAdvantages({3, 1}, {.group_size = 2});
  ASSERT_TRUE(eps.ok());
  EXPECT_NEAR((*eps)[0], 1 / (std::sqrt(2.0) + 1e-6), 1e-12);
}

TEST(GroupAdvantages, RejectsBadGroups) {
  EXPECT_THAT(std::string(GroupNormalizedAdvantages({1, 2}, {.group_size = 1}).status().message()),
              HasSubstr("group_size: 1"));
  EXPECT_THAT(std::string(GroupNormalizedAdvantages({1, 2, 3}, {.group_size = 2}).status().message()),
              HasSubstr("rewards: 3 values do not split into groups of 2"));
}

TEST(Gae, MatchesHandComputation) {
  // gamma = lambda = 1: the advantages are the reward-to-go minus the value, and the
  // returns the whole reward.
  auto g = ComputeGae({0, 0, 1}, {0.5, 0.6, 0.7}, 1, 1);
  ASSERT_TRUE(g.ok()) << g.status();
  const std::vector<double> a1 = {0.5, 0.4, 0.3}, r1 = {1, 1, 1};
  for (int t = 0; t < 3; ++t) {
    EXPECT_NEAR(g->advantages[t], a1[t], 1e-12) << t;
    EXPECT_NEAR(g->returns[t], r1[t], 1e-12) << t;
  }
  // gamma 0.9, lambda 0.5: deltas 0.04, 0.03, 0.3; A2 = 0.3, A1 = 0.03 + 0.45 * 0.3,
  // A0 = 0.04 + 0.45 * A1.
  g = ComputeGae({0, 0, 1}, {0.5, 0.6, 0.7}, 0.9, 0.5);
  ASSERT_TRUE(g.ok());
  EXPECT_NEAR(g->advantages[2], 0.3, 1e-12);
  EXPECT_NEAR(g->advantages[1], 0.165, 1e-12);
  EXPECT_NEAR(g->advantages[0], 0.11425, 1e-12);
  EXPECT_NEAR(g->returns[0], 0.61425, 1e-12);
  // A bootstrap value after the last token (a truncated response).
  g = ComputeGae({1}, {0.2}, 0.5, 1, 2.0);
  ASSERT_TRUE(g.ok());
  EXPECT_NEAR(g->advantages[0], 1 + 0.5 * 2.0 - 0.2, 1e-12);
  EXPECT_THAT(std::string(ComputeGae({1, 2}, {0.5}, 1, 1).status().message()), HasSubstr("values: 1 for 2 rewards"));
  EXPECT_THAT(std::string(ComputeGae({1}, {0.5}, 1.5, 1).status().message()), HasSubstr("gamma: 1.5"));
}

TEST(Kl, EstimatorsAndTheirGradients) {
  const double logp = -1, ref = -1.5;  // logp - ref = 0.5
  EXPECT_NEAR(Kl(KlEstimator::kK1, logp, ref), 0.5, 1e-12);
  EXPECT_NEAR(Kl(KlEstimator::kK2, logp, ref), 0.125, 1e-12);
  EXPECT_NEAR(Kl(KlEstimator::kK3, logp, ref), std::exp(-0.5) - 0.5, 1e-12);
  EXPECT_NEAR(KlGrad(KlEstimator::kK3, logp, ref), 1 - std::exp(-0.5), 1e-12);
  EXPECT_EQ(Kl(KlEstimator::kK3, -2, -2), 0);  // k3 vanishes on equal policies, and is never negative
  EXPECT_GT(Kl(KlEstimator::kK3, -3, -1), 0);
  for (KlEstimator k : {KlEstimator::kK1, KlEstimator::kK2, KlEstimator::kK3}) {
    const double h = 1e-6, fd = (Kl(k, logp + h, ref) - Kl(k, logp - h, ref)) / (2 * h);
    EXPECT_NEAR(KlGrad(k, logp, ref), fd, 1e-8) << static_cast<int>(k);
  }
}

// verl's low_var_kl: k3 where the policies are close; far apart, ref - logp is clamped to
// 20 and the value to 10, with no gradient there. The names parse, '-' for '_' too.
TEST(Kl, LowVarianceK3ClampsFarApartPolicies) {
  EXPECT_NEAR(Kl(KlEstimator::kLowVarK3, -1, -1.5), std::exp(-0.5) - 0.5, 1e-12);
  EXPECT_NEAR(KlGrad(KlEstimator::kLowVarK3, -1, -1.5), 1 - std::exp(-0.5), 1e-12);
  EXPECT_NEAR(Kl(KlEstimator::kLowVarK3, -1, -5), std::exp(-4) + 3, 1e-12);  // 3.018: inside the clamp
  EXPECT_EQ(Kl(KlEstimator::kLowVarK3, -30, -1), 10);  // exp(29) - 30: clamped
  EXPECT_EQ(KlGrad(KlEstimator::kLowVarK3, -30, -1), 0);
  EXPECT_EQ(*ParseKlEstimator("low-var-kl"), KlEstimator::kLowVarK3);
  EXPECT_EQ(*ParseKlEstimator("k2"), KlEstimator::kK2);
  EXPECT_THAT(std::string(ParseKlEstimator("k4").status().message()), HasSubstr("'k4': expected k1, k2, k3 or low_var_kl"));
  EXPECT_STREQ(KlEstimatorName(KlEstimator::kLowVarK3), "low_var_kl");
}

std::vector<OutcomeResponse> Outcomes(const std::vector<double>& rewards, const std::vector<size_t>& tokens) {
  std::vector<OutcomeResponse> out;
  for (size_t i = 0; i < rewards.size(); ++i) out.push_back({rewards[i], tokens[i], {}, {}});
  return out;
}

// grpo's and rloo's advantages by hand, every token of a response getting its response's.
TEST(OutcomeAdvantages, GrpoDrGrpoAndRloo) {
  const auto in = Outcomes({1, 0, 1, 0}, {2, 1, 3, 1});
  auto grpo = ComputeOutcomeAdvantages(in, {.estimator = AdvantageEstimator::kGrpo, .group_size = 4, .eps = 0});
  ASSERT_TRUE(grpo.ok()) << grpo.status();
  const double z = 0.5 / std::sqrt(1.0 / 3.0);
  EXPECT_THAT(grpo->advantages[0], ::testing::ElementsAre(::testing::DoubleNear(z, 1e-12), ::testing::DoubleNear(z, 1e-12)));
  EXPECT_THAT(grpo->advantages[1], ::testing::ElementsAre(::testing::DoubleNear(-z, 1e-12)));
  EXPECT_EQ(grpo->advantages[2].size(), 3u);
  auto dr = ComputeOutcomeAdvantages(in, {.estimator = AdvantageEstimator::kGrpo, .group_size = 4, .scale_by_std = false});
  ASSERT_TRUE(dr.ok());
  EXPECT_EQ(dr->advantages[2], (std::vector<double>{0.5, 0.5, 0.5}));
  EXPECT_EQ(dr->advantages[3], (std::vector<double>{-0.5}));
  // rloo, a group of 3: 1 - (0 + 0.5) / 2, 0 - (1 + 0.5) / 2, 0.5 - (1 + 0) / 2.
  auto rloo = ComputeOutcomeAdvantages(Outcomes({1, 0, 0.5}, {1, 2, 1}), {.estimator = AdvantageEstimator::kRloo, .group_size = 3});
  ASSERT_TRUE(rloo.ok()) << rloo.status();
  EXPECT_EQ(rloo->advantages[0], (std::vector<double>{0.75}));
  EXPECT_EQ(rloo->advantages[1], (std::vector<double>{-0.75, -0.75}));
  EXPECT_EQ(rloo->advantages[2], (std::vector<double>{0}));
  EXPECT_THAT(std::string(ComputeOutcomeAdvantages(Outcomes({1, 0, 0.5}, {1, 1, 1}),
                                                   {.estimator = AdvantageEstimator::kRloo, .group_size = 2})
                              .status()
                              .message()),
              HasSubstr("3 values do not split into groups of 2"));
  EXPECT_THAT(std::string(ComputeOutcomeAdvantages(in, {.estimator = AdvantageEstimator::kGae}).status().message()),
              HasSubstr("gae needs a critic"));
}

// The KL penalty in the reward (k1, coefficient 0.1): response 0 (reward 1) has k1 0.5 and
// -1 on its tokens, so its score is 1 - 0.1 (0.5 - 1) = 1.05; response 1 (reward 0) has
// k1 0: score 0. Dr. GRPO's centering: +-0.525. The mean k1 over the 3 tokens is -1/6.
// With k2 the penalty is 0.1 (0.125 + 0.5): score 0.9375.
TEST(OutcomeAdvantages, KlPenaltyInTheReward) {
  std::vector<OutcomeResponse> in = {{1, 2, {-1, -2}, {-1.5, -1}}, {0, 1, {-1}, {-1}}};
  OutcomeAdvantageOptions o{.estimator = AdvantageEstimator::kGrpo, .group_size = 2, .scale_by_std = false,
                            .kl_reward_coef = 0.1};
  auto a = ComputeOutcomeAdvantages(in, o);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_THAT(a->advantages[0], ::testing::ElementsAre(::testing::DoubleNear(0.525, 1e-12), ::testing::DoubleNear(0.525, 1e-12)));
  EXPECT_THAT(a->advantages[1], ::testing::ElementsAre(::testing::DoubleNear(-0.525, 1e-12)));
  EXPECT_NEAR(a->reward_kl, -1.0 / 6, 1e-12);
  o.kl_reward = KlEstimator::kK2;
  a = ComputeOutcomeAdvantages(in, o);
  ASSERT_TRUE(a.ok());
  EXPECT_NEAR(a->advantages[0][0], 0.9375 / 2, 1e-12);
  in[0].ref_logp.pop_back();
  EXPECT_THAT(std::string(ComputeOutcomeAdvantages(in, o).status().message()),
              HasSubstr("responses[0]: 2 old and 1 reference log-probs for 2 tokens"));
}

// REINFORCE++: per-token discounted returns, whitened over all the tokens. gamma 1:
// returns [1, 1] and [0]: mean 2/3, unbiased deviation sqrt(1/3). gamma 0.5: [0.5, 1]
// and [0, 0]: mean 0.375, unbiased variance 0.6875 / 3.
TEST(OutcomeAdvantages, ReinforcePlusPlusWhitensDiscountedReturns) {
  OutcomeAdvantageOptions o{.estimator = AdvantageEstimator::kReinforcePlusPlus};
  auto a = ComputeOutcomeAdvantages(Outcomes({1, 0}, {2, 1}), o);
  ASSERT_TRUE(a.ok()) << a.status();
  const double sd = std::sqrt(1.0 / 3 + 1e-8);
  EXPECT_NEAR(a->advantages[0][0], (1 - 2.0 / 3) / sd, 1e-9);
  EXPECT_NEAR(a->advantages[0][1], (1 - 2.0 / 3) / sd, 1e-9);
  EXPECT_NEAR(a->advantages[1][0], (0 - 2.0 / 3) / sd, 1e-9);
  o.gamma = 0.5;
  a = ComputeOutcomeAdvantages(Outcomes({1, 0}, {2, 2}), o);
  ASSERT_TRUE(a.ok());
  const double sd2 = std::sqrt(0.6875 / 3 + 1e-8);
  const std::vector<double> want = {(0.5 - 0.375) / sd2, (1 - 0.375) / sd2, -0.375 / sd2, -0.375 / sd2};
  EXPECT_NEAR(a->advantages[0][0], want[0], 1e-9);
  EXPECT_NEAR(a->advantages[0][1], want[1], 1e-9);
  EXPECT_NEAR(a->advantages[1][0], want[2], 1e-9);
  EXPECT_NEAR(a->advantages[1][1], want[3], 1e-9);
}

// DAPO's overlong penalty: max 100, buffer 20: nothing up to 80 tokens, -0.5 at 90, -1
// at 100 and beyond; half the factor halves it; no buffer, no penalty.
TEST(OutcomeAdvantages, OverlongPenalty) {
  const OverlongOptions o{.max_length = 100, .buffer = 20, .factor = 1.0};
  EXPECT_EQ(OverlongPenalty(80, o), 0);
  EXPECT_EQ(OverlongPenalty(90, o), -0.5);
  EXPECT_EQ(OverlongPenalty(100, o), -1);
  EXPECT_EQ(OverlongPenalty(120, o), -1);
  EXPECT_EQ(OverlongPenalty(90, {.max_length = 100, .buffer = 20, .factor = 0.5}), -0.25);
  EXPECT_EQ(OverlongPenalty(100, {.max_length = 100, .buffer = 0, .factor = 1}), 0);
}

// The aggregations' weights and denominators on a packed batch of three sequences:
// 2 counted tokens, 1, and none (it counts for nothing).
TEST(LossAggregation, WeightsAndUnits) {
  const std::vector<double> mask = {0, 1, 1, 0, 1, 0, 0};
  const std::vector<int32_t> cu = {0, 3, 5, 7};
  auto tm = ComputeLossWeights(mask, cu, LossAggregation::kTokenMean, 0);
  ASSERT_TRUE(tm.ok()) << tm.status();
  EXPECT_EQ(tm->weight, mask);
  EXPECT_EQ(tm->units, 3);
  auto ts = ComputeLossWeights(mask, cu, LossAggregation::kSeqMeanTokenSum, 0);
  ASSERT_TRUE(ts.ok());
  EXPECT_EQ(ts->weight, mask);
  EXPECT_EQ(ts->units, 2);
  auto mm = ComputeLossWeights(mask, cu, LossAggregation::kSeqMeanTokenMean, 0);
  ASSERT_TRUE(mm.ok());
  EXPECT_EQ(mm->weight, (std::vector<double>{0, 0.5, 0.5, 0, 1, 0, 0}));
  EXPECT_EQ(mm->units, 2);
  auto norm = ComputeLossWeights(mask, cu, LossAggregation::kSeqMeanTokenSumNorm, 4);
  ASSERT_TRUE(norm.ok());
  EXPECT_EQ(norm->weight, mask);
  EXPECT_EQ(norm->units, 8);
  EXPECT_THAT(std::string(ComputeLossWeights(mask, cu, LossAggregation::kSeqMeanTokenSumNorm, 0).status().message()),
              HasSubstr("norm_length: 0, expected > 0"));
  EXPECT_THAT(std::string(ComputeLossWeights(mask, {0, 3}, LossAggregation::kTokenMean, 0).status().message()),
              HasSubstr("cu_seqlens: expected boundaries 0 ... 7"));
  EXPECT_EQ(*ParseLossAggregation("seq-mean-token-sum-norm"), LossAggregation::kSeqMeanTokenSumNorm);
  EXPECT_THAT(std::string(ParseLossAggregation("sum").status().message()), HasSubstr("'sum': expected token_mean"));
  EXPECT_EQ(*ParseAdvantageEstimator("reinforce-plus-plus"), AdvantageEstimator::kReinforcePlusPlus);
  EXPECT_THAT(std::string(ParseAdvantageEstimator("ppo").status().message()), HasSubstr("'ppo': expected grpo, rloo"));
}

// Five tokens, the last masked out:
//   t0  A = +1, ratio 1.5: clipped at 1.2 (pg -1.2, no gradient)
//   t1  A = +1, ratio 1.1: inside (pg -1.1, d/dlogp = -1.1)
//   t2  A = -1, ratio 0.5: clipped at 0.8 (pg 0.8, no gradient)
//   t3  A = -1, ratio 4:   unclipped 4, capped by the dual clip at 3 (no gradient)
PolicyTokens FiveTokens() {
  PolicyTokens in;
  in.old_logp = {-1, -2, -0.5, -3, -1};
  const std::vector<double> ratio = {1.5, 1.1, 0.5, 4, 2};
  for (size_t t = 0; t < ratio.size(); ++t) in.logp.push_back(in.old_logp[t] + std::log(ratio[t]));
  in.advantage = {1, 1, -1, -1, 5};
  in.mask = {1, 1, 1, 1, 0};
  return in;
}

TEST(PolicyLoss, ClippedSurrogateWithDualClip) {
  auto l = ComputePolicyLoss(FiveTokens(), {});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_NEAR(l->pg_loss, (-1.2 - 1.1 + 0.8 + 3) / 4, 1e-12);
  EXPECT_NEAR(l->loss, l->pg_loss, 1e-12);
  EXPECT_NEAR(l->clip_fraction, 0.5, 1e-12);  // t0 and t2; the dual clip is not a ratio clip
  const std::vector<double> want = {0, -1.1 / 4, 0, 0, 0};
  for (int t = 0; t < 5; ++t) EXPECT_NEAR(l->dlogp[t], want[t], 1e-12) << t;
  // Without the dual clip t3 keeps its unclipped 4, with gradient -A ratio = 4.
  PolicyLossOptions no_dual;
  no_dual.dual_clip = 0;
  l = ComputePolicyLoss(FiveTokens(), no_dual);
  ASSERT_TRUE(l.ok());
  EXPECT_NEAR(l->pg_loss, (-1.2 - 1.1 + 0.8 + 4) / 4, 1e-12);
  EXPECT_NEAR(l->dlogp[3], 4.0 / 4, 1e-12);
}

// Truncated importance weights scale each token's surrogate and its gradient: t0 (clipped,
// -1.2) by 2, t1 (inside, -1.1) by 0.5; TisWeight caps exp(old - rollout).
TEST(PolicyLoss, ImportanceWeightsScaleTheSurrogate) {
  PolicyTokens in = FiveTokens();
  in.is_weight = {2, 0.5, 1, 1, 1};
  auto l = ComputePolicyLoss(in, {});
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_NEAR(l->pg_loss, (-2.4 - 0.55 + 0.8 + 3) / 4, 1e-12);
  EXPECT_NEAR(l->dlogp[1], -0.55 / 4, 1e-12);
  EXPECT_NEAR(l->clip_fraction, 0.5, 1e-12);
  EXPECT_NEAR(TisWeight(-1, -1.5, 2), std::exp(0.5), 1e-12);
  EXPECT_EQ(TisWeight(-1, -2, 2), 2);
  in.is_weight.pop_back();
  EXPECT_THAT(std::string(ComputePolicyLoss(in, {}).status().message()), HasSubstr("is_weight: 4 values for 5 tokens"));
}

TEST(PolicyLoss, KlTermAndEntropyBonus) {
  PolicyTokens in = FiveTokens();
  for (double lp : in.logp) in.ref_logp.push_back(lp - 0.5);
  in.entropy = {1, 2, 3, 4, 100};
  PolicyLossOptions o;
  o.kl_coef = 0.1, o.entropy_coef = 0.01;  // k3
  auto l = ComputePolicyLoss(in, o);
  ASSERT_TRUE(l.ok()) << l.status();
  const double k3 = std::exp(-0.5) - 0.5, dk3 = 1 - std::exp(-0.5);
  EXPECT_NEAR(l->kl, k3, 1e-12);
  EXPECT_NEAR(l->entropy, 2.5, 1e-12);  // the masked token's 100 does not count
  EXPECT_NEAR(l->loss, (-1.2 - 1.1 + 0.8 + 3) / 4 + 0.1 * k3 - 0.01 * 2.5, 1e-12);
  EXPECT_NEAR(l->dlogp[0], 0.1 * dk3 / 4, 1e-12);
  EXPECT_NEAR(l->dlogp[1], (-1.1 + 0.1 * dk3) / 4, 1e-12);
  EXPECT_EQ(l->dlogp[4], 0);
  EXPECT_NEAR(l->dentropy[2], -0.01 / 4, 1e-15);
  EXPECT_EQ(l->dentropy[4], 0);
}

TEST(PolicyLoss, GradientsMatchCentralDifferences) {
  // Ratios away from the clip bounds and the dual-clip cap, so the loss is smooth there.
  PolicyTokens in;
  in.old_logp = {-1, -2, -0.7, -1.3};
  const std::vector<double> ratio = {1.05, 0.9, 1.5, 0.6};
  for (size_t t = 0; t < ratio.size(); ++t) in.logp.push_back(in.old_logp[t] + std::log(ratio[t]));
  in.advantage = {0.7, -0.4, 1.3, -2};
  in.mask = {1, 1, 1, 1};
  in.ref_logp = {-1.2, -1.8, -0.9, -1.0};
  in.entropy = {0.5, 1.5, 2.5, 3.5};
  for (KlEstimator k : {KlEstimator::kK1, KlEstimator::kK2, KlEstimator::kK3}) {
    PolicyLossOptions o;
    o.kl_coef = 0.05, o.kl = k, o.entropy_coef = 0.02;
    auto l = ComputePolicyLoss(in, o);
    ASSERT_TRUE(l.ok()) << l.status();
    for (size_t t = 0; t < in.logp.size(); ++t) {
      const double h = 1e-6;
      PolicyTokens up = in, down = in;
      up.logp[t] += h, down.logp[t] -= h;
      const double fd = (ComputePolicyLoss(up, o)->loss - ComputePolicyLoss(down, o)->loss) / (2 * h);
      EXPECT_NEAR(l->dlogp[t], fd, 1e-7) << "token " << t << " estimator " << static_cast<int>(k);
      up = in, down = in;
      up.entropy[t] += h, down.entropy[t] -= h;
      const double fde = (ComputePolicyLoss(up, o)->loss - ComputePolicyLoss(down, o)->loss) / (2 * h);
      EXPECT_NEAR(l->dentropy[t], fde, 1e-7) << "entropy of token " << t;
    }
  }
}

TEST(PolicyLoss, NothingCountedAndBadInput) {
  PolicyTokens in = FiveTokens();
  in.mask.assign(5, 0);
  auto l = ComputePolicyLoss(in, {});
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->loss, 0);
  EXPECT_EQ(l->dlogp, std::vector<double>(5, 0.0));
  in = FiveTokens();
  in.advantage.pop_back();
  EXPECT_THAT(std::string(ComputePolicyLoss(in, {}).status().message()), HasSubstr("advantage: 4 values for 5 tokens"));
  PolicyLossOptions o;
  o.kl_coef = 0.1;
  EXPECT_THAT(std::string(ComputePolicyLoss(FiveTokens(), o).status().message()), HasSubstr("ref_logp (kl_coef > 0)"));
  o = {};
  o.clip_low = 1;
  EXPECT_THAT(std::string(ComputePolicyLoss(FiveTokens(), o).status().message()), HasSubstr("clip_low / clip_high"));
}

// Clipped value loss by hand: token 0 inside the clip range (both terms equal), token 1
// beyond the range but away from the return (the unclipped term is the larger), token 2
// masked out; then a token where the clipped term wins; then central differences.
TEST(ValueLoss, ClippedValueLossByHand) {
  ValueTokens in;
  in.value = {1.0, 3.0, 7.0};
  in.old_value = {0.9, 1.0, 0.0};
  in.returns = {2.0, 0.0, 0.0};
  in.mask = {1, 1, 0};
  auto out = ComputeValueLoss(in, 0.5);
  ASSERT_TRUE(out.ok()) << out.status();
  // t0: v 1.0 in [0.4, 1.4]: unclipped 0.5, clipped the same -> 0.5, grad -1.
  // t1: v 3.0, v_clip 1.5: unclipped 4.5, clipped 1.125 -> unclipped wins (max) 4.5, grad 3.
  EXPECT_NEAR(out->loss, (0.5 + 4.5) / 2, 1e-12);
  EXPECT_NEAR(out->dvalue[0], -1.0 / 2, 1e-12);
  EXPECT_NEAR(out->dvalue[1], 3.0 / 2, 1e-12);
  EXPECT_EQ(out->dvalue[2], 0.0);
  EXPECT_EQ(out->clip_fraction, 0.0);
  // The clipped term wins when v moved towards the return by more than c: old 1.0, v 2.9
  // (v_clip 1.5), return 3.0: unclipped 0.005, clipped 1.125 -> 1.125, gradient 0 (the
  // critic may not move further this epoch).
  in.value = {2.9};
  in.old_value = {1.0};
  in.returns = {3.0};
  in.mask = {1};
  out = ComputeValueLoss(in, 0.5);
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(out->loss, 1.125, 1e-12);
  EXPECT_EQ(out->dvalue[0], 0.0);
  EXPECT_EQ(out->clip_fraction, 1.0);
  out = ComputeValueLoss(in, 0);  // no clipping
  ASSERT_TRUE(out.ok());
  EXPECT_NEAR(out->loss, 0.005, 1e-12);
  EXPECT_NEAR(out->dvalue[0], -0.1, 1e-12);
  // Gradient against central differences on a mixed batch.
  in.value = {0.3, -1.2, 2.0, 0.7};
  in.old_value = {0.0, -0.5, 2.6, 0.7};
  in.returns = {1.0, -2.0, 1.0, 0.2};
  in.mask = {1, 1, 1, 0.5};
  out = ComputeValueLoss(in, 0.4);
  ASSERT_TRUE(out.ok());
  for (size_t t = 0; t < in.value.size(); ++t) {
    ValueTokens up = in, down = in;
    up.value[t] += 1e-6, down.value[t] -= 1e-6;
    const double numeric = (ComputeValueLoss(up, 0.4)->loss - ComputeValueLoss(down, 0.4)->loss) / 2e-6;
    EXPECT_NEAR(out->dvalue[t], numeric, 1e-6) << "token " << t;
  }
  EXPECT_THAT(std::string(ComputeValueLoss(ValueTokens{{1}, {1, 2}, {1}, {1}}, 0.2).status().message()),
              HasSubstr("old_value: 2 values for 1 tokens"));
}

TEST(Verifier, FinalAnswerAfterTheLastMarkOrTheWholeCompletion) {
  EXPECT_EQ(FinalAnswer("48 + 24 = 72 clips.\n#### 72"), "72");
  EXPECT_EQ(FinalAnswer("#### 5 then #### 7 \n"), "7");  // the last mark counts
  EXPECT_EQ(FinalAnswer(" 32\n"), "32");                  // no mark: the whole completion
  EXPECT_EQ(FinalAnswer("####"), "");
  EXPECT_EQ(ExactAnswerReward("so #### 72\n", "72"), 1.0);
  EXPECT_EQ(ExactAnswerReward("so #### 72\n", " 72\n"), 1.0);
  EXPECT_EQ(ExactAnswerReward("so #### 720", "72"), 0.0);
  EXPECT_EQ(ExactAnswerReward("72 #### ", "72"), 0.0);  // an empty final answer
  EXPECT_EQ(ExactAnswerReward("", ""), 1.0);
}

// \boxed{} before "####"; the last box whose braces close; math answers compare without
// $...$, spaces and thin spaces, and as numbers where both are one.
TEST(Verifier, BoxedAnswersAndMathComparison) {
  EXPECT_EQ(FinalAnswer("so x = 3, and \\boxed{3}."), "3");
  EXPECT_EQ(FinalAnswer("\\boxed{1} then \\boxed{\\frac{1}{2}}"), "\\frac{1}{2}");  // nested braces, the last box
  EXPECT_EQ(FinalAnswer("\\boxed{7} #### 9"), "7");                            // a box wins over the mark
  EXPECT_EQ(FinalAnswer("\\boxed {12}"), "12");
  EXPECT_EQ(FinalAnswer("\\boxed{5} and \\boxed{6"), "5");                   // an unclosed box does not count
  EXPECT_EQ(FinalAnswer("\\boxed"), "\\boxed");                              // no box: the whole completion
  EXPECT_TRUE(SameAnswer("1,000", "1000.0"));
  EXPECT_TRUE(SameAnswer("$-3$", "-3.00"));
  EXPECT_TRUE(SameAnswer("x + 1", "x+1"));
  EXPECT_TRUE(SameAnswer("10\\,000", "10000"));
  EXPECT_FALSE(SameAnswer("72", "720"));
  EXPECT_FALSE(SameAnswer("1,00", "100.5"));
  EXPECT_FALSE(SameAnswer("3x", "3"));
  EXPECT_FALSE(SameAnswer("inf", "inf2"));
  EXPECT_EQ(ExactAnswerReward("The total is \\boxed{1,250}.", "1250"), 1.0);
  EXPECT_EQ(ExactAnswerReward("The total is \\boxed{1,250}.", "\\boxed{1250}"), 1.0);
  EXPECT_EQ(ExactAnswerReward("The total is \\boxed{125}.", "Natalia sold 1250 clips.\n#### 1250"), 0.0);
  EXPECT_EQ(ExactAnswerReward("#### 1250", "Natalia sold 1250 clips.\n#### 1250"), 1.0);
}

}  // namespace
}  // namespace tessera::rl
