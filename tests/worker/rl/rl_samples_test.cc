// An RL step's micro-batches (worker/rl/rl_samples.h, PlanMicroBatches) on the CPU
// backend: every sample of a mini-batch lands in exactly one micro-batch of at most the
// token budget (a longer sample alone), balanced by length; a GRPO update over several
// micro-batches per mini-batch equals the one over one packed micro-batch; and two DP
// ranks under ZeRO-3 whose samples need different micro-batch counts agree on the
// larger (the rank with fewer samples runs a pad micro-batch) and equal one rank holding
// every sample — per-step losses, KL, gradient norms and the final weights within 1e-5.
// A reward model's score of a sample is its value at the sample's last token, however
// the samples are packed.
#include "worker/rl/rl_samples.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/util.h"
#include "tests/common/mem_store.h"
#include "tests/worker/model/model_test_util.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/rl/grpo.h"

namespace tessera::engine {
namespace {

// Samples of one-token prompts whose completions have the given lengths (a sample's
// batch: the prompt and the completion, 1 + length tokens, the last one's target -1).
std::vector<RlSample> Samples(const std::vector<int>& completion_lengths) {
  std::vector<RlSample> out;
  for (size_t i = 0; i < completion_lengths.size(); ++i) {
    std::vector<int32_t> completion(completion_lengths[i]);
    for (int t = 0; t < completion_lengths[i]; ++t) completion[t] = static_cast<int32_t>((i * 7 + t * 3) % 16);
    out.push_back(MakeRlSample({static_cast<int32_t>(i % 16)}, completion));
  }
  return out;
}

TEST(MicroBatches, WithinTheBudgetBalancedByLength) {
  const std::vector<RlSample> samples = Samples({9, 3, 14, 5, 5, 20, 7, 2, 11, 6, 4, 8});
  for (int64_t budget : {int64_t{0}, int64_t{12}, int64_t{16}, int64_t{40}}) {
    for (int minis : {1, 2, 3}) {
      SCOPED_TRACE(::testing::Message() << "budget " << budget << ", " << minis << " mini-batches");
      auto plan = PlanMicroBatches(nullptr, samples, minis, budget);
      ASSERT_TRUE(plan.ok()) << plan.status();
      ASSERT_EQ(plan->size(), static_cast<size_t>(minis));
      for (int mb = 0; mb < minis; ++mb) {
        const size_t begin = samples.size() * mb / minis, end = samples.size() * (mb + 1) / minis;
        std::vector<size_t> seen;
        int64_t longest = 0, least = INT64_MAX, most = 0, tokens = 0;
        for (const MicroBatch& m : (*plan)[mb]) {
          EXPECT_FALSE(m.pad);
          EXPECT_TRUE(std::is_sorted(m.samples.begin(), m.samples.end()));
          int64_t load = 0;
          for (size_t i : m.samples) {
            seen.push_back(i);
            load += static_cast<int64_t>(samples[i].batch.size());
            longest = std::max<int64_t>(longest, samples[i].batch.size());
          }
          if (budget > 0 && m.samples.size() > 1) {
            EXPECT_LE(load, budget);
          }
          least = std::min(least, load), most = std::max(most, load), tokens += load;
          EXPECT_EQ(PackSamples(samples, m).size(), static_cast<size_t>(load));
        }
        std::sort(seen.begin(), seen.end());
        std::vector<size_t> want;
        for (size_t i = begin; i < end; ++i) want.push_back(i);
        EXPECT_EQ(seen, want);
        if (budget == 0) {
          EXPECT_EQ((*plan)[mb].size(), 1u);
        } else {
          EXPECT_GE(static_cast<int64_t>((*plan)[mb].size()) * budget, tokens);
        }
        EXPECT_LE(most - least, longest);  // longest first onto the least loaded
      }
    }
  }
  EXPECT_FALSE(PlanMicroBatches(nullptr, samples, 13, 16).ok());
}

model::LlamaConfig Config() {
  model::LlamaConfig c = model::test::TinyConfig(16, /*tied=*/false, /*bias=*/false);
  c.hidden = 32, c.ffn = 48;
  return c;
}

struct Trace {
  std::vector<GrpoStats> steps;
  std::map<std::string, std::vector<float>> weights;
};

// Three GRPO updates (groups of 2, kl 0.05 to the initial policy, entropy bonus) of a
// tiny actor on fixed samples: samples [begin, end) of Samples(lengths), rewarded by
// their completion's first token.
void RunGrpo(comm::Communicator* dp, int zero, const std::vector<int>& lengths, size_t begin, size_t end, int64_t budget,
             Trace& out) {
  auto be = runtime::MakeCpuBackend();
  auto actor = model::Llama::Create(Config(), be.get());
  auto ref = model::Llama::Create(Config(), be.get());
  ASSERT_TRUE(actor.ok() && ref.ok());
  ASSERT_TRUE((*actor)->InitRandom(8, 0.2f).ok());
  ASSERT_TRUE((*ref)->InitRandom(8, 0.2f).ok());
  OptimizerOptions o;
  o.lr = o.min_lr = 2e-2f, o.warmup_steps = 0, o.total_steps = 3, o.clip_norm = 1.f, o.zero = zero;
  auto trainer = Trainer::Create(actor->get(), be.get(), dp, nullptr, o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  GrpoOptions g;
  g.group_size = 2, g.loss.kl_coef = 0.05, g.loss.entropy_coef = 0.01, g.max_tokens_per_micro_batch = budget;
  for (int step = 0; step < 3; ++step) {
    const std::vector<RlSample> made = Samples(lengths);
    std::vector<std::vector<int32_t>> prompts, completions;
    std::vector<double> rewards;
    for (size_t i = begin; i < end; ++i) {
      const RlSample& s = made[i];
      prompts.push_back({s.batch.tokens[0]});
      completions.emplace_back(s.batch.tokens.begin() + 1, s.batch.tokens.end());
      rewards.push_back(completions.back()[0] % 3 + 0.25 * step);
    }
    Rollouts got = MakeRollouts(prompts, completions, rewards);
    auto st = GrpoUpdate(**actor, **trainer, ref->get(), got, g);
    ASSERT_TRUE(st.ok()) << st.status();
    out.steps.push_back(*st);
  }
  ASSERT_TRUE((*trainer)->GatherParams().ok());
  for (auto& p : (*actor)->params()) out.weights[p.name()] = *(*actor)->GatherGlobal(p, false);
}

void ExpectSame(const Trace& got, const Trace& want) {
  ASSERT_EQ(got.steps.size(), want.steps.size());
  for (size_t s = 0; s < want.steps.size(); ++s) {
    SCOPED_TRACE(::testing::Message() << "step " << s + 1);
    EXPECT_NEAR(got.steps[s].loss, want.steps[s].loss, 1e-5 * std::abs(want.steps[s].loss) + 1e-7);
    EXPECT_NEAR(got.steps[s].kl, want.steps[s].kl, 1e-5 * std::abs(want.steps[s].kl) + 1e-9);
    EXPECT_NEAR(got.steps[s].entropy, want.steps[s].entropy, 1e-5 * want.steps[s].entropy);
    EXPECT_NEAR(got.steps[s].grad_norm, want.steps[s].grad_norm, 1e-5 * want.steps[s].grad_norm);
  }
  for (auto& [name, w] : want.weights) EXPECT_LT(model::test::RelDiff(got.weights.at(name), w), 1e-5) << name;
}

// Four long samples, then two short ones.
const std::vector<int> kLengths = {9, 12, 10, 11, 3, 2};

TEST(MicroBatches, GrpoOverSeveralEqualsOnePackedMicroBatch) {
  Trace one, split;
  RunGrpo(nullptr, 0, kLengths, 0, 6, 0, one);
  RunGrpo(nullptr, 0, kLengths, 0, 6, 14, split);  // 53 tokens: 4 micro-batches
  ASSERT_EQ(one.steps.size(), 3u);
  EXPECT_GT(one.steps[2].kl, 0);
  ExpectSame(split, one);
}

// SequenceScores: each sample's score equals the value head's output at the last token
// of that sample alone (prompt and every completion token — the one after which nothing
// is predicted), with one packed micro-batch or several.
TEST(SequenceScores, TheValueAtEachSamplesLastToken) {
  auto be = runtime::MakeCpuBackend();
  model::LlamaConfig c = model::test::TinyConfig(16, /*tied=*/false, /*bias=*/false);
  c.value_head = c.sequence_score = true;
  auto rm = model::Llama::Create(c, be.get());
  ASSERT_TRUE(rm.ok()) << rm.status();
  ASSERT_TRUE((*rm)->InitRandom(9, 0.3f).ok());
  const std::vector<RlSample> samples = Samples({5, 0, 9, 2, 7});
  std::vector<double> want;
  for (const RlSample& s : samples) {
    auto v = (*rm)->TokenValues(s.batch);
    ASSERT_TRUE(v.ok()) << v.status();
    want.push_back(v->back());
  }
  for (int64_t budget : {int64_t{0}, int64_t{8}}) {
    auto plan = PlanMicroBatches(nullptr, samples, 1, budget);
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto got = SequenceScores(**rm, samples, *plan);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR((*got)[i], want[i], 1e-5) << "budget " << budget << " sample " << i;
  }
  EXPECT_NE(want[0], want[2]);
}

TEST(MicroBatches, DpRanksUnderZero3AgreeOnTheCount) {
  Trace one;
  RunGrpo(nullptr, 0, kLengths, 0, 6, 0, one);
  // Rank 0's four long samples (10 to 13 tokens) need 3 micro-batches of at most 22
  // tokens, rank 1's two short ones one: rank 1 runs one micro-batch per sample and a pad.
  auto plan = PlanMicroBatches(nullptr, Samples({9, 12, 10, 11}), 1, 22);
  ASSERT_TRUE(plan.ok());
  ASSERT_EQ((*plan)[0].size(), 3u);
  tessera::testing::MemStore store;
  const std::string key = RandomHex(4);
  Trace ranks[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      auto c = comm::MakeGlooCommunicator("dp", key, r, 2, &store, {"127.0.0.1", 60000});
      ASSERT_TRUE(c.ok()) << c.status();
      RunGrpo(c->get(), 3, kLengths, r == 0 ? 0 : 4, r == 0 ? 4 : 6, 22, ranks[r]);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    ExpectSame(ranks[r], one);
  }
}

}  // namespace
}  // namespace tessera::engine

namespace tessera::engine {
namespace {

// A multi-turn sample: the observation's tokens (sampled 0) leave the mask — nothing counts
// them — and the rollout's log-probs stay at their own tokens.
TEST(MakeRlSample, AnObservationIsOutOfTheMask) {
  const std::vector<int32_t> prompt = {5, 6}, completion = {7, 8, 9, 10, 11};
  const std::vector<uint8_t> sampled = {1, 1, 0, 0, 1};
  const std::vector<float> logprobs = {-0.1f, -0.2f, 0.f, 0.f, -0.5f};
  const RlSample s = MakeRlSample(prompt, completion, logprobs, sampled);
  // Position t predicts token t + 1: completion token j at t = 1 + j.
  EXPECT_EQ(s.mask, (std::vector<double>{0, 1, 1, 0, 0, 1, 0}));
  EXPECT_EQ(ResponsePositions(s), (std::vector<size_t>{1, 2, 5}));
  ASSERT_EQ(s.rollout_logp.size(), s.mask.size());
  EXPECT_FLOAT_EQ(s.rollout_logp[1], -0.1f);
  EXPECT_FLOAT_EQ(s.rollout_logp[2], -0.2f);
  EXPECT_FLOAT_EQ(s.rollout_logp[5], -0.5f);
  EXPECT_EQ(s.rollout_logp[3], 0.0);
  // Without a mask every completion token counts (single-turn).
  EXPECT_EQ(MakeRlSample(prompt, completion).mask, (std::vector<double>{0, 1, 1, 1, 1, 1, 0}));
}

}  // namespace
}  // namespace tessera::engine
