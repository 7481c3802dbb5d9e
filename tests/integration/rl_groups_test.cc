// RL roles as worker groups through the daemons (CPU slots): a reference group and a
// critic group, on devices of their own or sharing another group's, give what the
// actor's own reference and critic give — the driver runs the phases across the groups
// (the reference's log-probs, the actor's old log-probs and the critic's values, PPO's
// advantages, the actor's and the critic's updates) — and a job with a critic group
// resumes the actor and the critic from the same step.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/spec/job_spec.h"
#include "tests/integration/cluster.h"

namespace tessera::testing {
namespace {

using ::testing::HasSubstr;

v1::GroupSpec* AddGroup(v1::JobSpec& spec, const std::string& role, int devices, int tp, const std::string& colocate_with = "") {
  auto* g = spec.add_groups();
  g->set_name(role), g->set_role(role), g->set_devices(devices), g->set_colocate_with(colocate_with);
  g->mutable_layout()->set_tp(tp);
  g->mutable_layout()->set_dp(devices / tp);
  const absl::Status st = NormalizeAndValidateJobSpec(spec);
  EXPECT_TRUE(st.ok()) << st;
  return g;
}

// Rewards and held-out accuracy equal; gradient norms and KLs (which depend on every
// sampled token and on the reference's log-probs) within `tol`, relative.
void ExpectSameRun(const nlohmann::json& a, const nlohmann::json& b, double tol, const char* what) {
  ASSERT_EQ(b["rewards"].size(), 3u) << what;
  EXPECT_EQ(b["rewards"], a["rewards"]) << what;
  EXPECT_EQ(b["accuracy"], a["accuracy"]) << what;
  for (const char* k : {"grad_norms", "kl"})
    for (size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(b[k][i].get<double>(), a[k][i].get<double>(), tol * std::abs(a[k][i].get<double>()) + 1e-9)
          << what << " " << k << " " << i;
}

// grpo with a reference group: on devices of its own (dp 2, as the actor) the reference's
// log-probs are the actor's own reference's, so the run equals the one-group run; on the
// actor's devices with another layout (tp 2) the run goes through too, its KL within the
// float error of another TP split.
TEST(RlGroups, GrpoWithAReferenceGroupEqualsTheActorsOwnReference) {
  auto c = Up({.agents = 1, .cpu_slots = 4});
  v1::JobSpec spec = SmallRlSpec("grpo");
  auto own = c->WaitState(Submit(*c, spec), v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(own.ok()) << own.status();
  const auto a = nlohmann::json::parse(own->result_json());
  for (size_t i = 1; i < 3; ++i) ASSERT_GT(a["kl"][i].get<double>(), 0) << a.dump();
  v1::GroupSpec* ref = AddGroup(spec, "reference", 2, 1);
  std::ostringstream progress;
  auto split = c->client().Watch(Submit(*c, spec), progress);
  ASSERT_TRUE(split.ok()) << split.status();
  ASSERT_EQ(split->state(), v1::JOB_STATE_SUCCEEDED) << split->reason() << "\n" << progress.str();
  ExpectSameRun(a, nlohmann::json::parse(split->result_json()), 1e-6, "reference group of its own");
  EXPECT_THAT(progress.str(), HasSubstr("reference group 'reference' (2 ranks)"));
  for (const char* k : {"ref_s=", "reference_peak_gib=", "old_logprob_s=", "actor_update_s="})
    EXPECT_THAT(progress.str(), HasSubstr(k));
  // On the actor's devices, split over TP instead of DP.
  ref->set_colocate_with("actor");
  ref->mutable_layout()->set_tp(2), ref->mutable_layout()->set_dp(1);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok()) << NormalizeAndValidateJobSpec(spec);
  std::ostringstream shared;
  auto colocated = c->client().Watch(Submit(*c, spec), shared);
  ASSERT_TRUE(colocated.ok()) << colocated.status();
  ASSERT_EQ(colocated->state(), v1::JOB_STATE_SUCCEEDED) << colocated->reason() << "\n" << shared.str();
  EXPECT_THAT(shared.str(), HasSubstr("on the devices of 'actor'"));
  const auto b = nlohmann::json::parse(colocated->result_json());
  ASSERT_EQ(b["kl"].size(), 3u);
  EXPECT_EQ(b["rewards"][0], a["rewards"][0]);
  EXPECT_NEAR(b["kl"][1].get<double>(), a["kl"][1].get<double>(), 1e-3 * a["kl"][1].get<double>());
}

// ppo with a critic group and a reference group sharing the critic's devices (4 slots):
// the driver gathers the actor's old log-probs, the critic's values and the reference's
// log-probs and makes the advantages per actor DP rank, as the actor's own PPO step does —
// so the run equals the one-group run (the advantages travel as f32: the gradient norms
// agree to 1e-5). The critic's metrics stream from its group.
TEST(RlGroups, PpoWithCriticAndReferenceGroupsEqualsTheActorsOwn) {
  auto c = Up({.agents = 1, .cpu_slots = 4});
  v1::JobSpec spec = SmallRlSpec("ppo");
  auto own = c->WaitState(Submit(*c, spec), v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(own.ok()) << own.status();
  const auto a = nlohmann::json::parse(own->result_json());
  for (size_t i = 0; i < 3; ++i) ASSERT_GT(a["grad_norms"][i].get<double>(), 0) << a.dump();
  AddGroup(spec, "critic", 2, 1);
  AddGroup(spec, "reference", 2, 1, "critic");
  std::ostringstream progress;
  auto split = c->client().Watch(Submit(*c, spec), progress);
  ASSERT_TRUE(split.ok()) << split.status();
  ASSERT_EQ(split->state(), v1::JOB_STATE_SUCCEEDED) << split->reason() << "\n" << progress.str();
  ExpectSameRun(a, nlohmann::json::parse(split->result_json()), 1e-5, "critic and reference groups");
  EXPECT_THAT(progress.str(), HasSubstr("critic group 'critic' (2 ranks)"));
  for (const char* k : {"value_loss=", "critic_grad_norm=", "values_s=", "critic_update_s=", "reward_kl=", "critic_peak_gib=",
                        "reference_peak_gib=", "old_logprob_s="})
    EXPECT_THAT(progress.str(), HasSubstr(k));
}

// A ppo job with a critic group and checkpoints (a constant learning rate): stopped
// after 2 of 3 steps (a job of 2 steps on the same directory), the next job resumes the actor and the critic (its own
// checkpoint under dir/critic) at step 2, and its last step equals the uninterrupted
// run's.
TEST(RlGroups, PpoWithACriticGroupResumesBothAtTheSameStep) {
  auto c = Up({.agents = 1, .cpu_slots = 4});
  v1::JobSpec spec = SmallRlSpec("ppo");
  spec.mutable_train()->set_min_lr(spec.train().lr());  // a schedule that does not depend on the job's step count
  AddGroup(spec, "critic", 2, 1);
  auto whole = c->WaitState(Submit(*c, spec), v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const auto a = nlohmann::json::parse(whole->result_json());
  const std::string dir = c->dir() + "/ppo-critic-ck";
  spec.mutable_train()->mutable_checkpoint()->set_dir(dir);
  spec.mutable_train()->mutable_checkpoint()->set_save_every(1);
  spec.mutable_train()->mutable_checkpoint()->set_keep(1);
  spec.mutable_train()->set_steps(2);
  ASSERT_TRUE(c->WaitState(Submit(*c, spec), v1::JOB_STATE_SUCCEEDED, 120000).ok());
  spec.mutable_train()->set_steps(3);
  std::ostringstream progress;
  auto resumed = c->client().Watch(Submit(*c, spec), progress);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_EQ(resumed->state(), v1::JOB_STATE_SUCCEEDED) << resumed->reason() << "\n" << progress.str();
  EXPECT_THAT(progress.str(), HasSubstr("resumed from the checkpoint of step 2"));
  const auto b = nlohmann::json::parse(resumed->result_json());
  ASSERT_EQ(b["first_step"], 3);
  ASSERT_EQ(b["rewards"].size(), 1u);
  EXPECT_EQ(b["rewards"][0], a["rewards"][2]);
  EXPECT_NEAR(b["grad_norms"][0].get<double>(), a["grad_norms"][2].get<double>(), 1e-5 * a["grad_norms"][2].get<double>());
  EXPECT_NEAR(b["kl"][0].get<double>(), a["kl"][2].get<double>(), 1e-5 * std::abs(a["kl"][2].get<double>()) + 1e-9);
}

}  // namespace
}  // namespace tessera::testing
