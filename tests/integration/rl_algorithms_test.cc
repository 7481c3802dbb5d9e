// The RL algorithm's knobs through the daemons on CPU slots: ppo with them (the KL
// reward penalty's estimator, the overlong penalty, clip-higher, the loss aggregation)
// trains otherwise than without, and gives the same run whether the actor's own critic
// makes the advantages or the driver makes them for a critic group. Dynamic sampling at
// its bound fills the batch with the step's own groups. grpo's knobs and dynamic
// sampling with a signal: reward_service_test (graded rewards); the arithmetic:
// tests/common/rl_test.cc and tests/controller/rl_advantages_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/spec/job_spec.h"
#include "tests/integration/cluster.h"

namespace tessera::testing {
namespace {

using ::testing::HasSubstr;

struct JobRun {
  nlohmann::json result;
  std::string progress;
};

JobRun RunOk(Cluster& c, const v1::JobSpec& spec) {
  std::ostringstream progress;
  auto job = c.client().Watch(Submit(c, spec), progress);
  EXPECT_TRUE(job.ok()) << job.status();
  if (!job.ok()) return {};
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason() << "\n" << progress.str();
  return {nlohmann::json::parse(job->result_json().empty() ? "{}" : job->result_json()), progress.str()};
}

v1::JobSpec With(v1::JobSpec spec, const std::function<void(v1::RlSpec*)>& set) {
  set(spec.mutable_rl());
  const absl::Status st = NormalizeAndValidateJobSpec(spec);
  EXPECT_TRUE(st.ok()) << st;
  return spec;
}

// ppo's advantages made by the actor's own critic (PpoUpdate) and by the driver for a
// critic group (AddPpoAdvantages) under the same knobs — k3 as the reward penalty's
// estimator, the overlong penalty, clip-higher, seq_mean_token_sum — are the same run.
TEST(RlAlgorithms, PpoKnobsAgreeBetweenTheActorsCriticAndACriticGroup) {
  auto c = Up({.agents = 1, .cpu_slots = 4});
  const v1::JobSpec spec = With(SmallRlSpec("ppo"), [](v1::RlSpec* r) {
    r->set_kl_reward_estimator("k3"), r->set_overlong_buffer(2), r->set_clip_high(0.3);
    r->set_loss_agg("seq_mean_token_sum");
  });
  const JobRun own = RunOk(*c, spec);
  ASSERT_EQ(own.result["grad_norms"].size(), 3u) << own.result.dump();
  const JobRun plain = RunOk(*c, SmallRlSpec("ppo"));
  ASSERT_EQ(plain.result["grad_norms"].size(), 3u);
  EXPECT_GT(std::abs(own.result["grad_norms"][0].get<double>() - plain.result["grad_norms"][0].get<double>()),
            1e-4 * plain.result["grad_norms"][0].get<double>());
  v1::JobSpec split = spec;
  auto* g = split.add_groups();
  g->set_name("critic"), g->set_role("critic"), g->set_devices(2);
  g->mutable_layout()->set_tp(1), g->mutable_layout()->set_dp(2);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(split).ok()) << NormalizeAndValidateJobSpec(split);
  const JobRun group = RunOk(*c, split);
  ASSERT_EQ(group.result["grad_norms"].size(), 3u) << group.result.dump();
  EXPECT_EQ(group.result["rewards"], own.result["rewards"]);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(group.result["grad_norms"][i].get<double>(), own.result["grad_norms"][i].get<double>(),
                1e-5 * own.result["grad_norms"][i].get<double>())
        << i;
  EXPECT_THAT(group.progress, HasSubstr("reward_kl="));
}

// Truncated importance sampling: the rollout engine's log-probs travel with the samples
// to the actor's update, aligned with the trainer's old log-probs token by token — the
// weights' mean is 1 within float error every step (a shifted alignment would put it
// far off) — so the run trains as without (gradient norms within 1e-3).
TEST(RlAlgorithms, TruncatedImportanceSamplingWeighsByTheRolloutsLogProbs) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  const v1::JobSpec base = SmallRlSpec("grpo");
  const JobRun plain = RunOk(*c, base);
  ASSERT_EQ(plain.result["grad_norms"].size(), 3u) << plain.result.dump();
  const JobRun tis = RunOk(*c, With(base, [](v1::RlSpec* r) { r->set_tis_cap(2.0); }));
  ASSERT_EQ(tis.result["grad_norms"].size(), 3u) << tis.result.dump();
  for (size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(tis.result["grad_norms"][i].get<double>(), plain.result["grad_norms"][i].get<double>(),
                1e-3 * plain.result["grad_norms"][i].get<double>()) << i;
  const auto steps = LinesWith(tis.progress, "tis_weight");
  EXPECT_EQ(steps.size(), 3u) << tis.progress;
  for (const auto& m : steps) EXPECT_NEAR(m.at("tis_weight"), 1.0, 1e-3);
  // A rollout at another temperature samples another distribution: refused by name.
  v1::JobSpec hot = base;
  hot.mutable_rl()->set_tis_cap(2.0), hot.mutable_rl()->set_temperature(0.7);
  EXPECT_THAT(std::string(NormalizeAndValidateJobSpec(hot).message()), HasSubstr("rl.tis_cap: compares the rollout's log-probs"));
}

// One step off (rl.max_staleness 1) with a rollout group on devices of its own: the
// first step generates as the synchronous run does (the same samples, the same update);
// from the second on, each step's samples were generated while the step before trained,
// with weights a step older than the actor's — the truncated importance weights move off
// 1 where the synchronous run's stay at 1 — and the steps say so (staleness, wait_s).
TEST(RlAlgorithms, OneStepOffTrainsOnSamplesAStepStale) {
  auto c = Up({.agents = 1, .cpu_slots = 4});
  v1::JobSpec base = With(SmallRlSpec("grpo"), [](v1::RlSpec* r) { r->set_tis_cap(5.0); });
  auto* pool = base.add_groups();
  pool->set_name("rollout"), pool->set_role("rollout"), pool->set_devices(2);
  pool->mutable_layout()->set_tp(1), pool->mutable_layout()->set_dp(2);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(base).ok()) << NormalizeAndValidateJobSpec(base);
  const JobRun sync = RunOk(*c, base);
  const JobRun async = RunOk(*c, With(base, [](v1::RlSpec* r) { r->set_max_staleness(1); }));
  ASSERT_EQ(sync.result["grad_norms"].size(), 3u) << sync.result.dump();
  ASSERT_EQ(async.result["grad_norms"].size(), 3u) << async.result.dump();
  EXPECT_EQ(async.result["rewards"][0], sync.result["rewards"][0]);
  EXPECT_NEAR(async.result["grad_norms"][0].get<double>(), sync.result["grad_norms"][0].get<double>(),
              1e-6 * sync.result["grad_norms"][0].get<double>());
  const auto s = LinesWith(sync.progress, "tis_weight"), a = LinesWith(async.progress, "tis_weight");
  ASSERT_EQ(s.size(), 3u) << sync.progress;
  ASSERT_EQ(a.size(), 3u) << async.progress;
  for (const auto& m : s) {
    EXPECT_NEAR(m.at("tis_weight"), 1.0, 1e-3);
    EXPECT_EQ(m.count("staleness"), 0u);
  }
  EXPECT_EQ(a[0].at("staleness"), 0);
  EXPECT_NEAR(a[0].at("tis_weight"), 1.0, 1e-3);
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_EQ(a[i].at("staleness"), 1) << i;
    EXPECT_GT(std::abs(a[i].at("tis_weight") - 1.0), 2e-3) << i;
    EXPECT_GE(a[i].at("wait_s"), 0) << i;
    EXPECT_GT(a[i].at("step_s"), 0) << i;
  }
  // Without a rollout group of its own there is nothing to overlap: refused by name.
  v1::JobSpec colocated = SmallRlSpec("grpo");
  colocated.mutable_rl()->set_max_staleness(1);
  EXPECT_THAT(std::string(NormalizeAndValidateJobSpec(colocated).message()),
              HasSubstr("rl.max_staleness: one step off generates while the actor trains"));
}

// Dynamic sampling at its bound: the tiny random policy answers nothing right, so every
// group's rewards are all 0 — each generation's groups are set aside, the step runs
// rl.max_gen_batches generations and fills its batch with the set-aside groups in the
// order generated: the step's own prompts first. So the run trains exactly as without
// dynamic sampling, and each step says what it did (3 generations, 12 groups filtered,
// 4 filling).
TEST(RlAlgorithms, DynamicSamplingAtItsBoundFillsWithTheStepsOwnGroups) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  const v1::JobSpec base = SmallRlSpec("grpo");
  const JobRun plain = RunOk(*c, base);
  ASSERT_EQ(plain.result["grad_norms"].size(), 3u) << plain.result.dump();
  ASSERT_EQ(plain.result["rewards"], nlohmann::json({0.0, 0.0, 0.0})) << "a reward: the groups would not all be flat";
  const JobRun filtered = RunOk(*c, With(base, [](v1::RlSpec* r) { r->set_filter_groups(true), r->set_max_gen_batches(3); }));
  EXPECT_EQ(filtered.result["grad_norms"], plain.result["grad_norms"]);
  EXPECT_EQ(filtered.result["kl"], plain.result["kl"]);
  const auto steps = LinesWith(filtered.progress, "gen_batches");
  EXPECT_EQ(steps.size(), 3u) << filtered.progress;
  for (const auto& m : steps) {
    EXPECT_EQ(m.at("gen_batches"), 3);
    EXPECT_EQ(m.at("filtered_groups"), 12);
    EXPECT_EQ(m.at("filled_groups"), 4);
  }
}

}  // namespace
}  // namespace tessera::testing
