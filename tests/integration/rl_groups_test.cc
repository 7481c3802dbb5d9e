// RL roles as worker groups through the daemons (CPU slots): a reference group and a
// critic group, on devices of their own or sharing another group's, give what the
// actor's own reference and critic give — the driver runs the phases across the groups
// (the reference's log-probs, the actor's old log-probs and the critic's values, PPO's
// advantages, the actor's and the critic's updates) — a reward group's neural reward model
// scores every sample in place of the rule verifier, a job with a critic group resumes the
// actor and the critic from the same step, groups that take turns on shared devices
// (offload) train as groups that stay — also from a model directory —, and a job with a group of every role whose
// executor is killed (kill -9) resumes from its checkpoints at the same losses.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec.h"
#include "common/util.h"
#include "tests/integration/cluster.h"
#include "tests/integration/hf_dir.h"

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

// Groups that take turns on shared devices (groups[].offload): ppo with a critic, a
// reference and a rollout group (tp 2) all on the actor's two slots. With every group
// offloading, each call first parks the other groups' states in host memory and brings
// its own back (the actor's and the rollout model's both for the weight sync); the run
// equals the one where every group stays — rewards, held-out accuracy, gradient norms
// and KL — and each step says what its turns moved. So does the run where the reference
// stays (its calls park no one).
TEST(RlGroups, GroupsTakingTurnsOnSharedDevicesEqualGroupsThatStay) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  v1::JobSpec spec = SmallRlSpec("ppo");
  AddGroup(spec, "critic", 2, 1, "actor");
  AddGroup(spec, "reference", 2, 1, "actor");
  AddGroup(spec, "rollout", 2, 2, "actor");
  auto stay = c->WaitState(Submit(*c, spec), v1::JOB_STATE_SUCCEEDED, 180000);
  ASSERT_TRUE(stay.ok()) << stay.status();
  const auto a = nlohmann::json::parse(stay->result_json());
  for (v1::GroupSpec& g : *spec.mutable_groups()) g.set_offload(true);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok()) << NormalizeAndValidateJobSpec(spec);
  std::ostringstream progress;
  auto turns = c->client().Watch(Submit(*c, spec), progress);
  ASSERT_TRUE(turns.ok()) << turns.status();
  ASSERT_EQ(turns->state(), v1::JOB_STATE_SUCCEEDED) << turns->reason() << "\n" << progress.str();
  ExpectSameRun(a, nlohmann::json::parse(turns->result_json()), 0, "every group offloading");
  // Every step moves every group's states out and back: the metrics say how much.
  const std::string out = progress.str();
  int steps = 0;
  for (size_t at = out.find("offload_gib="); at != std::string::npos; at = out.find("offload_gib=", at + 1), ++steps)
    EXPECT_GT(std::stod(out.substr(at + 12)), 0) << out;
  EXPECT_EQ(steps, 3) << out;
  EXPECT_THAT(out, HasSubstr("offload_s="));
  // The reference staying: it runs beside whichever group had the turn, as the same run.
  spec.mutable_groups(2)->set_offload(false);
  auto beside = c->WaitState(Submit(*c, spec), v1::JOB_STATE_SUCCEEDED, 180000);
  ASSERT_TRUE(beside.ok()) << beside.status();
  ExpectSameRun(a, nlohmann::json::parse(beside->result_json()), 0, "the reference staying");
}

// ppo as RL users start it: from a model directory (the Qwen3 family's: q/k norms, one
// KV head; tests/integration/hf_dir.h) on conversations through its tokenizer's chat
// template. The critic group and the reference group on the actor's devices, the actor
// and the critic taking turns, start from the directory's weights (the critic with a
// fresh value head) as the actor's own critic and reference do: the run equals the
// one-group run.
TEST(RlGroups, PpoFromAModelDirectoryWithGroupsEqualsTheActorsOwn) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  const HfFamily qwen3 = HfFamilies().back();
  ASSERT_EQ(qwen3.name, "qwen3");
  const std::string hf = c->dir() + "/hf";
  ASSERT_TRUE(WriteHfModelDir(hf, qwen3.config, 5, 0.3f, qwen3.tokenizer).ok());
  std::string file;
  for (int i = 0; i < 4; ++i) {
    const nlohmann::json messages = {{{"role", "user"}, {"content", absl::StrCat("What is ", i, " + ", i, "?")}}};
    file += nlohmann::json{{"messages", messages}, {"answer", absl::StrCat(2 * i)}}.dump() + "\n";
  }
  const std::string path = c->dir() + "/chat-prompts.jsonl";
  ASSERT_TRUE(WriteFileAtomic(path, file).ok());
  v1::JobSpec spec = SmallRlSpec("ppo");
  auto* model = spec.mutable_model();
  const v1::ModelShape keep = *model;
  model->Clear();
  model->set_hf_dir(hf), model->set_seq_len(64), model->set_global_batch(keep.global_batch());
  model->set_micro_batch(keep.micro_batch());
  spec.mutable_train()->mutable_data()->Clear();
  spec.mutable_train()->mutable_data()->set_kind("jsonl");
  spec.mutable_train()->mutable_data()->set_path(path);
  spec.mutable_rl()->set_max_new_tokens(12);
  spec.mutable_rl()->clear_stop();
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok()) << NormalizeAndValidateJobSpec(spec);
  auto own = c->WaitState(Submit(*c, spec), v1::JOB_STATE_SUCCEEDED, 180000);
  ASSERT_TRUE(own.ok()) << own.status();
  const auto a = nlohmann::json::parse(own->result_json());
  for (size_t i = 0; i < 3; ++i) ASSERT_GT(a["grad_norms"][i].get<double>(), 0) << a.dump();
  AddGroup(spec, "critic", 2, 1, "actor")->set_offload(true);
  AddGroup(spec, "reference", 2, 1, "actor");
  spec.mutable_groups(0)->set_offload(true);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok()) << NormalizeAndValidateJobSpec(spec);
  std::ostringstream progress;
  auto groups = c->client().Watch(Submit(*c, spec), progress);
  ASSERT_TRUE(groups.ok()) << groups.status();
  ASSERT_EQ(groups->state(), v1::JOB_STATE_SUCCEEDED) << groups->reason() << "\n" << progress.str();
  ExpectSameRun(a, nlohmann::json::parse(groups->result_json()), 1e-5, "critic and reference groups from hf_dir");
  EXPECT_THAT(progress.str(), HasSubstr("value_loss="));
}

// grpo with a reward group (rl.reward_model: a sequence classifier's Hugging Face
// directory of another shape than the actor's): its scores replace the verifier's rewards.
// On devices of its own (dp 2) and on the actor's devices at tp 2 the first step's
// samples get the same scores; a reward model whose score head is zero gives every sample
// 0 — no advantage, no gradient — whatever the verifier says.
TEST(RlGroups, GrpoWithARewardGroupScoresTheSamples) {
  auto c = Up({.agents = 1, .cpu_slots = 4});
  model::LlamaConfig rm = TinyTextModel(32, 48);
  rm.value_head = rm.sequence_score = true;
  const std::string hf = c->dir() + "/reward-model";
  ASSERT_TRUE(WriteHfModelDir(hf, rm, 21, 0.3f).ok());
  v1::JobSpec spec = SmallRlSpec("grpo");
  spec.mutable_rl()->set_reward_model(hf);
  v1::GroupSpec* reward = AddGroup(spec, "reward", 2, 1);
  std::ostringstream progress;
  auto own = c->client().Watch(Submit(*c, spec), progress);
  ASSERT_TRUE(own.ok()) << own.status();
  ASSERT_EQ(own->state(), v1::JOB_STATE_SUCCEEDED) << own->reason() << "\n" << progress.str();
  EXPECT_THAT(progress.str(), HasSubstr("reward group 'reward' (2 ranks)"));
  for (const char* k : {"rule_reward=", "reward_s=", "reward_model_s=", "reward_peak_gib="}) EXPECT_THAT(progress.str(), HasSubstr(k));
  const auto a = nlohmann::json::parse(own->result_json());
  ASSERT_EQ(a["rewards"].size(), 3u);
  // A score, not an exact match's fraction of the step's 16 samples.
  const double r0 = a["rewards"][0].get<double>();
  EXPECT_NE(r0 * 16, std::round(r0 * 16)) << a.dump();
  EXPECT_GT(a["grad_norms"][0].get<double>(), 0);
  reward->set_colocate_with("actor");
  reward->mutable_layout()->set_tp(2), reward->mutable_layout()->set_dp(1);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok()) << NormalizeAndValidateJobSpec(spec);
  auto colocated = c->WaitState(Submit(*c, spec), v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(colocated.ok()) << colocated.status();
  const auto b = nlohmann::json::parse(colocated->result_json());
  EXPECT_NEAR(b["rewards"][0].get<double>(), r0, 1e-5 * std::abs(r0) + 1e-7);
  // A zero score head.
  const std::string zero = c->dir() + "/zero-reward-model";
  auto be = runtime::MakeCpuBackend();
  auto m = model::Llama::Create(rm, be.get());
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE((*m)->InitRandom(3, 0.3f).ok());
  model::Param* head = (*m)->Find("score.weight");
  ASSERT_NE(head, nullptr);
  ASSERT_TRUE((*m)->SetGlobal(*head, std::vector<float>(rm.hidden, 0.0f)).ok());
  ASSERT_TRUE(checkpoint::ExportHf(zero, **m, "F32", true).ok());
  spec.mutable_rl()->set_reward_model(zero);
  spec.mutable_rl()->set_kl_coef(0), spec.mutable_rl()->set_entropy_coef(0);
  auto flat = c->WaitState(Submit(*c, spec), v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(flat.ok()) << flat.status();
  const auto z = nlohmann::json::parse(flat->result_json());
  EXPECT_EQ(z["rewards"], nlohmann::json::array({0.0, 0.0, 0.0})) << z.dump();
  EXPECT_EQ(z["grad_norms"][0].get<double>(), 0.0) << z.dump();
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

// The pid of the executor of attempt `attempt` of job `id` that serves rank 0 of `group`
// (-1 where none runs): the job's assignments say which executor, its command line
// (.../attempt-N/executor-I.pb) which process.
pid_t ExecutorOf(Cluster& c, const std::string& id, int attempt, const std::string& group) {
  auto job = c.client().Get(id);
  if (!job.ok()) return -1;
  int executor = -1;
  for (const v1::Assignment& a : job->assignments())
    for (const v1::GroupRank& r : a.ranks())
      if (r.group() == group && r.rank() == 0) executor = a.executor();
  const std::string needle = absl::StrCat("/attempt-", attempt, "/executor-", executor, ".pb");
  for (pid_t pid : Cluster::ExecutorPids(id, attempt)) {
    std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"));
    const std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmd.find(needle) != std::string::npos) return pid;
  }
  return -1;
}

// ppo with a group of every role on 4 CPU slots — the actor (dp 2) sharing its executors
// with the reward model's group (dp 2) and a rollout group (tp 2), the critic (dp 2) with
// the reference (tp 2) — saving every 2 steps. Killing the executor that serves the
// critic and the reference, or the one that serves the actor, the reward model and the
// rollout, restarts the attempt, which resumes the actor and the critic from their
// checkpoints of the same step; the steps after it equal the uninterrupted run's.
TEST(RlGroups, EveryGroupResumesAfterItsExecutorIsKilled) {
  auto c = Up({.agents = 1, .cpu_slots = 4});
  model::LlamaConfig rm = TinyTextModel(32, 48);
  rm.value_head = rm.sequence_score = true;
  const std::string hf = c->dir() + "/reward-model";
  ASSERT_TRUE(WriteHfModelDir(hf, rm, 21, 0.3f).ok());
  v1::JobSpec spec = SmallRlSpec("ppo");
  constexpr int kSteps = 12;
  spec.mutable_train()->set_steps(kSteps);
  AddGroup(spec, "critic", 2, 1);
  AddGroup(spec, "reference", 2, 2, "critic");
  spec.mutable_rl()->set_reward_model(hf);
  AddGroup(spec, "reward", 2, 1, "actor");
  AddGroup(spec, "rollout", 2, 2, "actor");
  const std::string straight_id = Submit(*c, spec);
  ASSERT_FALSE(straight_id.empty());
  auto straight = c->WaitState(straight_id, v1::JOB_STATE_SUCCEEDED, 180000);
  ASSERT_TRUE(straight.ok()) << straight.status();
  const auto a = nlohmann::json::parse(straight->result_json());
  ASSERT_EQ(a["rewards"].size(), size_t(kSteps));
  for (const char* victim : {"critic", "actor"}) {
    SCOPED_TRACE(victim);
    v1::JobSpec killed = spec;
    const std::string dir = absl::StrCat(c->dir(), "/every-role-", victim);
    killed.mutable_train()->mutable_checkpoint()->set_dir(dir);
    killed.mutable_train()->mutable_checkpoint()->set_save_every(2);
    killed.set_max_restarts(1);
    killed.set_restart_backoff_s(0.2);
    const std::string id = Submit(*c, killed);
    ASSERT_FALSE(id.empty());
    ASSERT_EQ(RunningExecutors(*c, id, 1, 4).size(), 4u);
    for (int i = 0; i < 6000 && !ReadFile(dir + "/latest").ok(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const pid_t pid = ExecutorOf(*c, id, 1, victim);
    ASSERT_GT(pid, 0);
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    auto done = c->WaitState(id, v1::JOB_STATE_SUCCEEDED, 180000);
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_EQ(done->attempt(), 2) << "the kill came after the job ended: make the steps more or slower";
    const auto b = nlohmann::json::parse(done->result_json());
    const int first = b["first_step"].get<int>();
    EXPECT_GT(first, 1);
    EXPECT_EQ((first - 1) % 2, 0);
    ASSERT_EQ(b["rewards"].size(), size_t(kSteps - first + 1));
    for (size_t i = 0; i < b["rewards"].size(); ++i) {
      const size_t s = first - 1 + i;
      EXPECT_EQ(b["rewards"][i], a["rewards"][s]) << "step " << s + 1;
      for (const char* k : {"grad_norms", "kl"})
        EXPECT_NEAR(b[k][i].get<double>(), a[k][s].get<double>(), 1e-5 * std::abs(a[k][s].get<double>()) + 1e-9)
            << k << " step " << s + 1;
    }
  }
}

}  // namespace
}  // namespace tessera::testing
