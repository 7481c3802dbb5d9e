// A grpo job whose rewards come from an external RewardService (proto/tessera/v1/
// reward_service.proto) that the test runs on a loopback port: every step calls it once
// per DP rank with that rank's samples (prompt, completion, reference), and its rewards
// are the step's rewards. A service that is down, or answers the wrong number of rewards,
// fails the job with a message naming the service — within the deadline, never a hang.
// With graded rewards the algorithm's knobs (rl.advantage, the clip range, the KL
// estimators and the KL in the reward, the overlong penalty, the loss aggregation) train
// otherwise than the defaults from the same samples.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <thread>
#include <iostream>
#include <atomic>
#include <mutex>
#include <set>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/spec/job_spec.h"
#include "common/util.h"
#include "tessera/v1/reward_service.grpc.pb.h"
#include "tests/integration/cluster.h"
#include "tests/integration/hf_dir.h"
#include "worker/tokenizer/model_text.h"

namespace tessera::testing {
namespace {

using ::testing::HasSubstr;

// Rewards 1 for a completion equal to the reference, else 0.25 (so that the job's reward
// shows the service's numbers, not the built-in 0/1); or, with `short_by`, that many
// rewards too few. Graded: a fixed function of the completion's bytes in [0, 1], so that
// an untrained model's samples differ in reward and GRPO has something to learn from;
// with `flat_even` too, a prompt whose first operand is even gets 0.5 for every sample (a
// group without a signal, for dynamic sampling).
class Rewards final : public v1::RewardService::Service {
 public:
  grpc::Status Score(grpc::ServerContext*, const v1::ScoreRequest* req, v1::ScoreResponse* resp) override {
    std::lock_guard<std::mutex> l(mu_);
    ++calls_;
    samples_ += req->samples_size();
    for (const auto& s : req->samples()) {
      seen_.insert({s.prompt(), s.reference()});
      completions_.insert(s.completion());
      if (s.prompt().empty() || (!jsonl_ && s.prompt().back() != '=') || s.reference().empty()) bad_ = true;
      int sum = 0;
      for (unsigned char ch : s.completion()) sum += ch;
      const bool flat = flat_even_ && !s.prompt().empty() && (s.prompt()[0] - '0') % 2 == 0;
      resp->add_rewards(flat ? 0.5 : graded_ ? (sum % 17) / 16.0 : s.completion() == s.reference() ? 1.0 : 0.25);
    }
    for (int i = 0; i < short_by_ && resp->rewards_size() > 0; ++i) resp->mutable_rewards()->RemoveLast();
    return grpc::Status::OK;
  }
  int calls() { std::lock_guard<std::mutex> l(mu_); return calls_; }
  int samples() { std::lock_guard<std::mutex> l(mu_); return samples_; }
  bool bad() { std::lock_guard<std::mutex> l(mu_); return bad_; }
  void set_short_by(int n) { std::lock_guard<std::mutex> l(mu_); short_by_ = n; }
  void set_graded(bool on) { std::lock_guard<std::mutex> l(mu_); graded_ = on; }
  void set_jsonl(bool on) { std::lock_guard<std::mutex> l(mu_); jsonl_ = on; }
  void set_flat_even(bool on) { std::lock_guard<std::mutex> l(mu_); flat_even_ = on; }
  std::set<std::pair<std::string, std::string>> seen() { std::lock_guard<std::mutex> l(mu_); return seen_; }
  std::set<std::string> completions() { std::lock_guard<std::mutex> l(mu_); return completions_; }

 private:
  std::mutex mu_;
  int calls_ = 0, samples_ = 0, short_by_ = 0;
  bool bad_ = false, graded_ = false, jsonl_ = false, flat_even_ = false;
  std::set<std::pair<std::string, std::string>> seen_;  // (prompt, reference) of every sample scored
  std::set<std::string> completions_;
};

// The service on a free loopback port, serving until destroyed.
struct Serving : LoopbackService<Rewards> {
  Rewards& rewards = service;
};

v1::JobSpec GrpoSpec(const std::string& service) {
  v1::JobSpec spec = PretrainSpec(2, 1, 0, 2);
  spec.set_kind("grpo");
  spec.mutable_train()->mutable_data()->set_digits(1);
  auto* rl = spec.mutable_rl();
  rl->set_group_size(4), rl->set_prompts_per_step(4), rl->set_eval_problems(4);
  rl->set_reward_service(service);
  rl->set_reward_timeout_s(5);
  EXPECT_TRUE(NormalizeAndValidateJobSpec(spec).ok());
  return spec;
}

// The controller and one agent with two CPU slots, registered.


TEST(RewardService, GrpoRewardsComeFromTheServiceAndItsFailureFailsTheJob) {
  Cluster c({.agents = 1, .cpu_slots = 2});
  ASSERT_TRUE(StartOneNode(c));
  Serving serving;
  Rewards& service = serving.rewards;
  const std::string& address = serving.address;
  std::unique_ptr<grpc::Server>& server = serving.server;
  ASSERT_NE(server, nullptr);

  std::string progress;
  v1::Job job = RunJob(c, GrpoSpec(address), &progress);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason() << "\n" << progress;
  EXPECT_EQ(service.calls(), 4);      // 2 steps x 2 DP ranks
  EXPECT_EQ(service.samples(), 32);   // 2 prompts x 4 samples per call
  EXPECT_FALSE(service.bad()) << "samples without their prompt or reference";
  // Every reward is 1 or 0.25, so a step's mean is >= 0.25: the built-in exact match
  // (0 or 1) would give less on an untrained model.
  const auto rewards = nlohmann::json::parse(job.result_json())["rewards"];
  ASSERT_EQ(rewards.size(), 2u);
  for (const auto& r : rewards) EXPECT_GE(r.get<double>(), 0.25);

  service.set_short_by(1);
  job = RunJob(c, GrpoSpec(address), &progress);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr(absl::StrCat("rl.reward_service ", address, ": 7 rewards for 8 samples")));

  server->Shutdown();
  server.reset();
  job = RunJob(c, GrpoSpec(address), &progress);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr(absl::StrCat("rl.reward_service ", address, ": Score failed")));
}

// Split pools: with the rollout on devices of its own (pool tp 2 x dp 1: TP rank 0 calls
// the service and broadcasts the rewards to its TP peer) the pool scores through the
// service: 2 steps x 1 pool DP rank = 2 calls of 16 samples, the job's rewards are the
// service's; a short answer fails the job naming the service.
TEST(RewardService, ARolloutPoolOfItsOwnScoresThroughTheService) {
  Cluster c({.agents = 1, .cpu_slots = 4});
  ASSERT_TRUE(StartOneNode(c));
  Serving serving;
  ASSERT_NE(serving.server, nullptr);
  v1::JobSpec spec = GrpoSpec(serving.address);
  auto* pool = spec.add_groups();
  pool->set_name("rollout"), pool->set_role("rollout"), pool->set_devices(2);
  pool->mutable_layout()->set_tp(2);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok()) << NormalizeAndValidateJobSpec(spec);
  std::string progress;
  v1::Job job = RunJob(c, spec, &progress);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason() << "\n" << progress;
  EXPECT_EQ(serving.rewards.calls(), 2);
  EXPECT_EQ(serving.rewards.samples(), 32);
  EXPECT_FALSE(serving.rewards.bad());
  const auto result = nlohmann::json::parse(job.result_json());
  for (const auto& r : result["rewards"]) EXPECT_GE(r.get<double>(), 0.25);  // the service's 1 or 0.25
  EXPECT_EQ(result["weights_verified"], true);
  serving.rewards.set_short_by(1);
  job = RunJob(c, spec, &progress);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr(absl::StrCat("rl.reward_service ", serving.address, ": 15 rewards for 16 samples")));
}

// The algorithm's knobs on grpo (graded rewards: the advantages have a signal): each
// variant samples the defaults' first step (the same start) and trains otherwise — its
// first gradient norm differs —: rloo with clip-higher, no dual clip and low_var_kl;
// REINFORCE++ with the KL in the reward (k2) and the overlong penalty, which streams its
// reward_kl; Dr. GRPO (no std scaling) with seq_mean_token_sum.
TEST(RewardService, GrpoAlgorithmKnobsTrainOtherwiseFromTheSameSamples) {
  Cluster c({.agents = 1, .cpu_slots = 2});
  ASSERT_TRUE(StartOneNode(c));
  Serving serving;
  ASSERT_NE(serving.server, nullptr);
  serving.rewards.set_graded(true);
  v1::JobSpec base = GrpoSpec(serving.address);
  base.mutable_rl()->set_kl_coef(0.05);
  std::string progress;
  const v1::Job a_job = RunJob(c, base, &progress);
  ASSERT_EQ(a_job.state(), v1::JOB_STATE_SUCCEEDED) << a_job.reason() << "\n" << progress;
  EXPECT_THAT(progress, ::testing::Not(HasSubstr("reward_kl=")));
  const auto a = nlohmann::json::parse(a_job.result_json());
  ASSERT_EQ(a["grad_norms"].size(), 2u) << a.dump();
  ASSERT_GT(a["grad_norms"][0].get<double>(), 0) << a.dump();
  const struct {
    const char* name;
    std::function<void(v1::RlSpec*)> set;
    const char* metric;
  } variants[] = {
      {"rloo, clip-higher, no dual clip, low_var_kl",
       [](v1::RlSpec* r) {
         r->set_advantage("rloo"), r->set_clip_high(0.28), r->set_dual_clip(0), r->set_kl_estimator("low_var_kl");
       },
       "grad_norm="},
      {"reinforce_plus_plus, KL in the reward (k2), overlong penalty",
       [](v1::RlSpec* r) {
         r->set_advantage("reinforce_plus_plus"), r->set_gamma(0.9), r->set_kl_reward_coef(0.05);
         r->set_kl_reward_estimator("k2"), r->set_overlong_buffer(2), r->set_overlong_penalty(0.5);
       },
       "reward_kl="},
      {"Dr. GRPO, seq_mean_token_sum",
       [](v1::RlSpec* r) { r->set_norm_adv_by_std(false), r->set_loss_agg("seq_mean_token_sum"); }, "grad_norm="},
  };
  for (const auto& v : variants) {
    SCOPED_TRACE(v.name);
    v1::JobSpec spec = base;
    v.set(spec.mutable_rl());
    ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok()) << NormalizeAndValidateJobSpec(spec);
    const v1::Job job = RunJob(c, spec, &progress);
    ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason() << "\n" << progress;
    EXPECT_THAT(progress, HasSubstr(v.metric));
    const auto b = nlohmann::json::parse(job.result_json());
    ASSERT_EQ(b["grad_norms"].size(), 2u) << b.dump();
    EXPECT_EQ(b["rewards"][0], a["rewards"][0]);  // the same first samples
    const double ga = a["grad_norms"][0].get<double>(), gb = b["grad_norms"][0].get<double>();
    EXPECT_GT(std::abs(gb - ga), 1e-3 * ga) << ga << " vs " << gb;
  }
}

// Dynamic sampling (rl.filter_groups) on graded rewards where every prompt with an even
// first operand gets the same reward for all its samples: those groups are set aside and
// refills (other prompts) generate until the batch has prompts_per_step groups with a
// signal — more than one generation a step, groups filtered, none filling. A step's
// metric line says so; the job trains to the end.
TEST(RewardService, DynamicSamplingRefillsGroupsWithoutASignal) {
  Cluster c({.agents = 1, .cpu_slots = 2});
  ASSERT_TRUE(StartOneNode(c));
  Serving serving;
  ASSERT_NE(serving.server, nullptr);
  serving.rewards.set_graded(true);
  serving.rewards.set_flat_even(true);
  v1::JobSpec spec = GrpoSpec(serving.address);
  spec.mutable_rl()->set_prompts_per_step(8);
  spec.mutable_rl()->set_filter_groups(true);
  spec.mutable_rl()->set_max_gen_batches(10);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok()) << NormalizeAndValidateJobSpec(spec);
  std::string progress;
  const v1::Job job = RunJob(c, spec, &progress);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason() << "\n" << progress;
  const auto steps = LinesWith(progress, "gen_batches");
  EXPECT_EQ(steps.size(), 2u) << progress;
  for (const auto& m : steps) {
    EXPECT_GE(m.at("gen_batches"), 2);
    EXPECT_GE(m.at("filtered_groups"), 1);
    EXPECT_EQ(m.at("filled_groups"), 0);
  }
}

// grpo checkpoints (graded rewards, so that the policy moves): 8 GRPO steps straight,
// against the same job saving every 2 steps whose executor is killed (SIGKILL) once a
// checkpoint is committed: the restarted attempt resumes from it, and its steps repeat the
// straight run's rewards, gradient norms and KL bit for bit (the actor's weights, AdamW
// moments and step count come back; prompts and sampling seeds follow the step; the
// reference stays the starting weights).
TEST(RewardService, KilledGrpoResumesFromItsCheckpointExactly) {
  Cluster c({.agents = 1, .cpu_slots = 2});
  ASSERT_TRUE(StartOneNode(c));
  Serving serving;
  ASSERT_NE(serving.server, nullptr);
  serving.rewards.set_graded(true);
  constexpr int kSteps = 8;
  v1::JobSpec spec = GrpoSpec(serving.address);
  spec.mutable_train()->set_steps(kSteps);
  spec.mutable_rl()->set_kl_coef(0.05);
  spec.mutable_rl()->set_mini_batches(2);  // two optimizer steps per GRPO step: AdamW's step count matters
  std::string progress;
  const v1::Job straight_job = RunJob(c, spec, &progress);
  ASSERT_EQ(straight_job.state(), v1::JOB_STATE_SUCCEEDED) << straight_job.reason() << "\n" << progress;
  const auto straight = nlohmann::json::parse(straight_job.result_json());
  ASSERT_EQ(straight["grad_norms"].size(), size_t(kSteps)) << straight.dump();
  EXPECT_GT(straight["kl"][kSteps - 1].get<double>(), 0) << "the policy did not move: the test would show nothing";

  const std::string dir = c.dir() + "/grpo-ckpt";
  spec.mutable_train()->mutable_checkpoint()->set_dir(dir);
  spec.mutable_train()->mutable_checkpoint()->set_save_every(2);
  spec.set_max_restarts(1);
  spec.set_restart_backoff_s(0.2);
  auto submitted = c.client().Submit(spec, "");
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string id = submitted->job().job_id();
  std::vector<pid_t> pids;
  for (int i = 0; i < 1500 && pids.size() < 2; ++i) {
    pids = Cluster::ExecutorPids(id, 1);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(pids.size(), 2u);
  for (int i = 0; i < 6000 && !ReadFile(dir + "/latest").ok(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(kill(pids[1], SIGKILL), 0);
  auto resumed_job = c.WaitState(id, v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(resumed_job.ok()) << resumed_job.status();
  EXPECT_EQ(resumed_job->attempt(), 2) << "the kill came after the job ended: make the steps more or slower";
  const auto resumed = nlohmann::json::parse(resumed_job->result_json());
  const int first = resumed["first_step"].get<int>();
  std::cout << "resumed at GRPO step " << first << " of " << kSteps << "\n";
  EXPECT_GT(first, 1);
  EXPECT_EQ((first - 1) % 2, 0);
  for (const char* k : {"rewards", "grad_norms", "kl"}) {
    ASSERT_EQ(resumed[k].size(), size_t(kSteps - first + 1)) << resumed.dump();
    for (int s = first; s <= kSteps; ++s)
      EXPECT_EQ(resumed[k][s - first].get<double>(), straight[k][s - 1].get<double>()) << k << ", step " << s;
  }
  EXPECT_EQ(*ReadFile(dir + "/latest"), absl::StrFormat("step-%08d\n", kSteps));
}

// grpo on JSONL prompts with answers (train.data.kind jsonl): the samples the service
// scores carry the file's prompts and answers (4 prompts per step, cycling through the 6
// lines: the 8 prompts of steps 1-2 cover every line); the same
// job with the built-in verifier (final answer after "####") succeeds without held-out
// evaluation; a bad line fails the job naming the file and line.
TEST(RewardService, GrpoOnJsonlPromptsWithAnswers) {
  Cluster c({.agents = 1, .cpu_slots = 2});
  ASSERT_TRUE(StartOneNode(c));
  Serving serving;
  ASSERT_NE(serving.server, nullptr);
  serving.rewards.set_jsonl(true);
  std::set<std::pair<std::string, std::string>> lines;
  std::string file;
  for (int i = 0; i < 6; ++i) {
    const std::string q = absl::StrCat("Q", i, ": what is ", i, " + ", i, "?\n"), a = absl::StrCat(2 * i);
    lines.insert({q, a});
    file += nlohmann::json{{"prompt", q}, {"answer", a}}.dump() + "\n";
  }
  const std::string path = c.dir() + "/prompts.jsonl";
  ASSERT_TRUE(WriteFileAtomic(path, file).ok());
  v1::JobSpec spec = GrpoSpec(serving.address);
  spec.mutable_train()->mutable_data()->set_kind("jsonl");
  spec.mutable_train()->mutable_data()->set_path(path);
  spec.mutable_rl()->set_max_new_tokens(8);
  spec.mutable_rl()->add_stop("\n");
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok());
  std::string progress;
  v1::Job job = RunJob(c, spec, &progress);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason() << "\n" << progress;
  EXPECT_FALSE(serving.rewards.bad());
  EXPECT_EQ(serving.rewards.seen(), lines);

  spec.mutable_rl()->clear_reward_service();  // the built-in verifier
  job = RunJob(c, spec, &progress);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason() << "\n" << progress;
  const auto result = nlohmann::json::parse(job.result_json());
  ASSERT_EQ(result["rewards"].size(), 2u);
  for (const auto& r : result["rewards"]) EXPECT_TRUE(r.get<double>() >= 0 && r.get<double>() <= 1) << r;
  EXPECT_TRUE(result["accuracy"].empty()) << "no rl.eval_data: no held-out evaluation";
  EXPECT_THAT(progress, ::testing::Not(HasSubstr("held-out")));

  // rl.eval_data: held-out problems of the same form, all three of them (fewer than
  // rl.eval_problems), before the first step and after the last.
  std::string held;
  for (int i = 10; i < 13; ++i)
    held += nlohmann::json{{"prompt", absl::StrCat("Q", i, ": what is ", i, " + ", i, "?\n")}, {"answer", absl::StrCat(2 * i)}}.dump() + "\n";
  ASSERT_TRUE(WriteFileAtomic(c.dir() + "/held.jsonl", held).ok());
  spec.mutable_rl()->set_eval_data(c.dir() + "/held.jsonl");
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok());
  job = RunJob(c, spec, &progress);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason() << "\n" << progress;
  const auto evaluated = nlohmann::json::parse(job.result_json());
  ASSERT_EQ(evaluated["accuracy"].size(), 2u) << evaluated.dump();
  for (const auto& a : evaluated["accuracy"]) EXPECT_TRUE(a["accuracy"] >= 0 && a["accuracy"] <= 1) << a;
  EXPECT_THAT(progress, HasSubstr("held-out accuracy at the start: "));
  EXPECT_THAT(progress, HasSubstr(" (3 problems)"));
  spec.mutable_rl()->clear_eval_data();

  ASSERT_TRUE(WriteFileAtomic(path, file + "{\"prompt\": \"x\"}\n").ok());
  job = RunJob(c, spec, &progress);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr(path + ":7: expected {\"prompt\": string, \"answer\": string}"));
}

// A grpo job on conversations from a model directory (`config` written as a Hugging Face
// directory with the tokenizer fixture `fixture` beside it), its actor at tensor
// parallelism `tp`, stopping at `stops` and the tokenizer's EOS: it must succeed, and the
// service must see every prompt as the chat template's text with the generation prompt,
// with the line's answer, and every completion as decoded text without special tokens.
// Returns the spec it ran.
v1::JobSpec GrpoOnConversations(Cluster& c, Serving& serving, const model::LlamaConfig& config, const std::string& fixture,
                                int tp, const std::vector<std::string>& stops) {
  serving.rewards.set_jsonl(true);
  serving.rewards.set_graded(true);
  const std::string hf = c.dir() + "/hf";
  EXPECT_TRUE(WriteHfModelDir(hf, config, 5, 0.3f, fixture).ok());
  auto text = tokenizer::LoadModelText(TokenizerFixture(fixture));
  EXPECT_TRUE(text.ok());
  if (!text.ok()) return {};
  std::set<std::pair<std::string, std::string>> want;
  std::string file;
  for (int i = 0; i < 4; ++i) {
    const nlohmann::json messages = {{{"role", "user"}, {"content", absl::StrCat("What is ", i, " + ", i, "?")}}};
    file += nlohmann::json{{"messages", messages}, {"answer", absl::StrCat(2 * i)}}.dump() + "\n";
    auto prompt = text->chat->Apply(nlohmann::ordered_json::parse(messages.dump()), true);
    EXPECT_TRUE(prompt.ok());
    if (prompt.ok()) want.insert({*prompt, absl::StrCat(2 * i)});
  }
  const std::string path = c.dir() + "/chat-prompts.jsonl";
  EXPECT_TRUE(WriteFileAtomic(path, file).ok());
  v1::JobSpec spec = GrpoSpec(serving.address);
  spec.mutable_groups(0)->mutable_layout()->set_tp(tp);
  spec.mutable_groups(0)->mutable_layout()->set_dp(2 / tp);
  auto* model = spec.mutable_model();
  const v1::ModelShape keep = *model;
  model->Clear();
  model->set_hf_dir(hf), model->set_seq_len(128), model->set_global_batch(keep.global_batch()), model->set_micro_batch(keep.micro_batch());
  spec.mutable_train()->mutable_data()->set_kind("jsonl");
  spec.mutable_train()->mutable_data()->set_path(path);
  spec.mutable_rl()->set_max_new_tokens(8);
  spec.mutable_rl()->clear_stop();  // (GrpoSpec's arithmetic "\n")
  for (const std::string& stop : stops) spec.mutable_rl()->add_stop(stop);
  const absl::Status valid = NormalizeAndValidateJobSpec(spec);
  EXPECT_TRUE(valid.ok()) << valid;
  std::string progress;
  v1::Job job = RunJob(c, spec, &progress);
  EXPECT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason() << "\n" << progress;
  EXPECT_EQ(serving.rewards.seen(), want);
  EXPECT_FALSE(serving.rewards.completions().empty());
  for (const std::string& comp : serving.rewards.completions()) EXPECT_EQ(comp.find("<|"), std::string::npos) << comp;
  return spec;
}

// grpo on conversations through a model directory's tokenizer (the Llama-3-style fixture
// beside a random model's weights, over two DP ranks); stop strings are tokens.
TEST(RewardService, GrpoOnConversationsThroughTheModelsTokenizer) {
  Cluster c({.agents = 1, .cpu_slots = 2});
  ASSERT_TRUE(StartOneNode(c));
  Serving serving;
  ASSERT_NE(serving.server, nullptr);
  v1::JobSpec spec = GrpoOnConversations(c, serving, TinyTextModel(), "llama3", 1, {"<|end_of_text|>"});
  ASSERT_FALSE(HasFailure());
  // A stop string of two tokens is refused by name.
  spec.mutable_rl()->add_stop("What is");
  std::string progress;
  v1::Job job = RunJob(c, spec, &progress);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("rl.stop[1]: 'What is' is "));
  EXPECT_THAT(job.reason(), HasSubstr("a stop string must be one token"));
}

// The same from each family's directory (tests/integration/hf_dir.h) with the actor at
// tensor parallelism 2 — Qwen3's one KV head replicated over both ranks — and the rollout
// on its devices, stopping at the family's EOS alone.
class GrpoFamilies : public ::testing::TestWithParam<HfFamily> {};

TEST_P(GrpoFamilies, OnConversationsAtTp2) {
  Cluster c({.agents = 1, .cpu_slots = 2});
  ASSERT_TRUE(StartOneNode(c));
  Serving serving;
  ASSERT_NE(serving.server, nullptr);
  GrpoOnConversations(c, serving, GetParam().config, GetParam().tokenizer, 2, {});
}

INSTANTIATE_TEST_SUITE_P(Families, GrpoFamilies, ::testing::ValuesIn(HfFamilies()),
                         [](const ::testing::TestParamInfo<HfFamily>& i) { return i.param.name; });

}  // namespace
}  // namespace tessera::testing
