// Multi-turn rollouts with tools through the daemons: a grpo job whose rl.environment is an
// EnvironmentService (proto/tessera/v1/environment_service.proto) that the test runs on a
// loopback port. An untrained model at a high temperature draws bytes almost uniformly, so
// some of its samples end a turn with the tool marker: each such call reaches the
// environment with its session, turn, prompt, reference and the response so far; the
// observation goes into the response and the model continues; End names every session
// that called; the step's metrics count the calls. With a rollout pool of tp 2, TP rank 0
// calls and its TP peer appends the same observations (the job's weights stay verified).
// ppo with a critic group equals ppo with the actor's own critic on multi-turn samples.
// An environment that is down, too slow or answers the wrong number of observations fails
// the job with a message naming it — within the deadline, never a hang.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/spec/job_spec.h"
#include "tessera/v1/environment_service.grpc.pb.h"
#include "tests/integration/cluster.h"

namespace tessera::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kMarker[] = "!";

class Environment final : public v1::EnvironmentService::Service {
 public:
  grpc::Status Step(grpc::ServerContext*, const v1::EnvStepRequest* req, v1::EnvStepResponse* resp) override {
    if (delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    std::lock_guard<std::mutex> l(mu_);
    for (const v1::EnvToolCall& c : req->calls()) {
      ++calls_;
      turns_[c.session()].push_back(c.turn());
      if (c.prompt().empty() || c.prompt().back() != '=' || c.reference().empty() || c.call().empty() ||
          !absl::EndsWith(c.call(), kMarker) || !absl::EndsWith(c.response(), c.call()) || req->job().empty())
        bad_ = true;
      if (!short_) resp->add_observations()->set_text(absl::StrCat("<", c.turn(), ">"));
    }
    return grpc::Status::OK;
  }
  grpc::Status End(grpc::ServerContext*, const v1::EnvEndRequest* req, v1::EnvEndResponse*) override {
    std::lock_guard<std::mutex> l(mu_);
    for (const std::string& s : req->sessions()) ended_.insert(s);
    return grpc::Status::OK;
  }
  int calls() { std::lock_guard<std::mutex> l(mu_); return calls_; }
  bool bad() { std::lock_guard<std::mutex> l(mu_); return bad_; }
  std::map<std::string, std::vector<int>> turns() { std::lock_guard<std::mutex> l(mu_); return turns_; }
  std::set<std::string> ended() { std::lock_guard<std::mutex> l(mu_); return ended_; }
  void set_short(bool on) { std::lock_guard<std::mutex> l(mu_); short_ = on; }
  void set_delay_ms(int ms) { delay_ms_ = ms; }

 private:
  std::mutex mu_;
  int calls_ = 0;
  bool bad_ = false, short_ = false;
  std::atomic<int> delay_ms_{0};
  std::map<std::string, std::vector<int>> turns_;  // session -> the turns of its calls
  std::set<std::string> ended_;
};

struct Serving : LoopbackService<Environment> {
  Environment& env = service;
};

v1::JobSpec MultiTurnSpec(const std::string& environment) {
  v1::JobSpec spec = PretrainSpec(2, 1, 0, 2);
  spec.set_kind("grpo");
  spec.mutable_train()->mutable_data()->set_digits(1);
  auto* rl = spec.mutable_rl();
  rl->set_group_size(4), rl->set_prompts_per_step(8), rl->set_eval_problems(8);
  rl->set_max_new_tokens(48), rl->set_temperature(4.0);
  rl->set_environment(environment), rl->set_tool_stop(kMarker), rl->set_max_turns(3);
  rl->set_environment_timeout_s(5);
  const absl::Status valid = NormalizeAndValidateJobSpec(spec);
  EXPECT_TRUE(valid.ok()) << valid;
  return spec;
}

// The calls the environment saw: turns 1, 2 ... in order per session (max_turns 3: at most
// two calls), every calling session ended, and the metrics' mean calls per sample.
void ExpectEpisodes(Environment& env, const std::string& progress, int samples) {
  EXPECT_FALSE(env.bad()) << "a call without its prompt, reference, or the marker at its end";
  const auto turns = env.turns();
  EXPECT_GE(env.calls(), 3) << "too few tool calls: the test shows little";
  int train_calls = 0;
  for (const auto& [session, ts] : turns) {
    ASSERT_LE(ts.size(), 2u) << session;
    for (size_t i = 0; i < ts.size(); ++i) EXPECT_EQ(ts[i], static_cast<int>(i) + 1) << session;
    if (absl::StartsWith(session, "train/")) train_calls += static_cast<int>(ts.size());
  }
  std::set<std::string> calling;
  for (const auto& [session, ts] : turns) calling.insert(session);
  EXPECT_EQ(env.ended(), calling);
  const auto steps = LinesWith(progress, "tool_calls");
  ASSERT_EQ(steps.size(), 2u) << progress;
  double sum = 0;
  for (const auto& m : steps) sum += m.at("tool_calls") * samples;
  EXPECT_NEAR(sum, train_calls, 1e-6);
}

TEST(Environment, ToolCallsGoToTheEnvironmentAndTheModelGoesOn) {
  Cluster c({.agents = 1, .cpu_slots = 2});
  ASSERT_TRUE(StartOneNode(c));
  Serving serving;
  ASSERT_NE(serving.server, nullptr);
  std::string progress;
  const v1::Job job = RunJob(c, MultiTurnSpec(serving.address), &progress);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason() << "\n" << progress;
  ExpectEpisodes(serving.env, progress, 32);
  // The held-out evaluation (greedy) runs as episodes too and reports its calls.
  EXPECT_THAT(progress, HasSubstr("tool calls per problem"));
  const auto result = nlohmann::json::parse(job.result_json());
  ASSERT_EQ(result["accuracy"].size(), 2u) << result.dump();
  EXPECT_TRUE(result["accuracy"][0].contains("tool_calls")) << result.dump();
}

TEST(Environment, ARolloutPoolWithTensorParallelismSharesTheObservations) {
  Cluster c({.agents = 1, .cpu_slots = 4});
  ASSERT_TRUE(StartOneNode(c));
  Serving serving;
  ASSERT_NE(serving.server, nullptr);
  v1::JobSpec spec = MultiTurnSpec(serving.address);
  auto* pool = spec.add_groups();
  pool->set_name("rollout"), pool->set_role("rollout"), pool->set_devices(2);
  pool->mutable_layout()->set_tp(2);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok()) << NormalizeAndValidateJobSpec(spec);
  std::string progress;
  const v1::Job job = RunJob(c, spec, &progress);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason() << "\n" << progress;
  ExpectEpisodes(serving.env, progress, 32);
  EXPECT_EQ(nlohmann::json::parse(job.result_json())["weights_verified"], true);
}

TEST(Environment, ItsFailuresFailTheJobNamingIt) {
  Cluster c({.agents = 1, .cpu_slots = 2});
  ASSERT_TRUE(StartOneNode(c));
  Serving serving;
  ASSERT_NE(serving.server, nullptr);
  v1::JobSpec spec = MultiTurnSpec(serving.address);
  std::string progress;

  serving.env.set_short(true);  // no observations
  v1::Job job = RunJob(c, spec, &progress);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr(absl::StrCat("rl.environment ", serving.address, ": 0 observations for ")));

  serving.env.set_short(false);
  serving.env.set_delay_ms(3000);
  spec.mutable_rl()->set_environment_timeout_s(0.5);
  const auto t0 = std::chrono::steady_clock::now();
  job = RunJob(c, spec, &progress);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr(absl::StrCat("rl.environment ", serving.address, ": Step failed (no answer within 0.5 s)")));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60);
  serving.env.set_delay_ms(0);

  serving.server->Shutdown();
  serving.server.reset();
  job = RunJob(c, spec, &progress);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr(absl::StrCat("rl.environment ", serving.address, ": Step failed")));
}

// ppo on multi-turn samples: with a critic group the driver makes GAE over each row's
// sampled tokens (completion_mask), without one the actor's own critic over each sample's
// mask — observations are steps on neither, so the two runs agree (rewards exactly,
// gradient norms and KL to 1e-5: the advantages travel as f32).
TEST(Environment, PpoWithACriticGroupEqualsTheActorsOwnCriticOnMultiTurnSamples) {
  Cluster c({.agents = 1, .cpu_slots = 4});
  ASSERT_TRUE(StartOneNode(c));
  Serving serving;
  ASSERT_NE(serving.server, nullptr);
  v1::JobSpec spec = SmallRlSpec("ppo");
  auto* rl = spec.mutable_rl();
  rl->set_prompts_per_step(8), rl->set_max_new_tokens(48), rl->set_temperature(4.0);
  rl->set_environment(serving.address), rl->set_tool_stop(kMarker), rl->set_max_turns(3);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok()) << NormalizeAndValidateJobSpec(spec);
  std::string progress;
  const v1::Job own = RunJob(c, spec, &progress);
  ASSERT_EQ(own.state(), v1::JOB_STATE_SUCCEEDED) << own.reason() << "\n" << progress;
  EXPECT_GE(serving.env.calls(), 3) << "too few tool calls: the test shows little";
  auto* critic = spec.add_groups();
  critic->set_name("critic"), critic->set_role("critic"), critic->set_devices(2);
  critic->mutable_layout()->set_dp(2);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok()) << NormalizeAndValidateJobSpec(spec);
  const v1::Job split = RunJob(c, spec, &progress);
  ASSERT_EQ(split.state(), v1::JOB_STATE_SUCCEEDED) << split.reason() << "\n" << progress;
  const auto a = nlohmann::json::parse(own.result_json()), b = nlohmann::json::parse(split.result_json());
  ASSERT_EQ(a["rewards"].size(), 3u) << a.dump();
  EXPECT_EQ(b["rewards"], a["rewards"]);
  for (const char* k : {"grad_norms", "kl"})
    for (size_t i = 0; i < 3; ++i)
      EXPECT_NEAR(b[k][i].get<double>(), a[k][i].get<double>(), 1e-5 * std::abs(a[k][i].get<double>()) + 1e-9) << k << " " << i;
}

}  // namespace
}  // namespace tessera::testing
