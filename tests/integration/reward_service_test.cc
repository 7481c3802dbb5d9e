// A grpo job whose rewards come from an external RewardService (proto/tessera/v1/
// reward_service.proto) that the test runs on a loopback port: every step calls it once
// per DP rank with that rank's samples (prompt, completion, reference), and its rewards
// are the step's rewards. A service that is down, or answers the wrong number of rewards,
// fails the job with a message naming the service — within the deadline, never a hang.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "tessera/v1/reward_service.grpc.pb.h"
#include "tests/integration/cluster.h"

namespace tessera::testing {
namespace {

using ::testing::HasSubstr;

// Rewards 1 for a completion equal to the reference, else 0.25 (so that the job's reward
// shows the service's numbers, not the built-in 0/1); or, with `short_by`, that many
// rewards too few.
class Rewards final : public v1::RewardService::Service {
 public:
  grpc::Status Score(grpc::ServerContext*, const v1::ScoreRequest* req, v1::ScoreResponse* resp) override {
    std::lock_guard<std::mutex> l(mu_);
    ++calls_;
    samples_ += req->samples_size();
    for (const auto& s : req->samples()) {
      if (s.prompt().empty() || s.prompt().back() != '=' || s.reference().empty()) bad_ = true;
      resp->add_rewards(s.completion() == s.reference() ? 1.0 : 0.25);
    }
    for (int i = 0; i < short_by_ && resp->rewards_size() > 0; ++i) resp->mutable_rewards()->RemoveLast();
    return grpc::Status::OK;
  }
  int calls() { std::lock_guard<std::mutex> l(mu_); return calls_; }
  int samples() { std::lock_guard<std::mutex> l(mu_); return samples_; }
  bool bad() { std::lock_guard<std::mutex> l(mu_); return bad_; }
  void set_short_by(int n) { std::lock_guard<std::mutex> l(mu_); short_by_ = n; }

 private:
  std::mutex mu_;
  int calls_ = 0, samples_ = 0, short_by_ = 0;
  bool bad_ = false;
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

v1::Job RunJob(Cluster& c, const v1::JobSpec& spec, std::string* progress) {
  auto r = c.client().Submit(spec, "");
  EXPECT_TRUE(r.ok()) << r.status();
  std::ostringstream out;
  auto job = c.client().Watch(r->job().job_id(), out);
  EXPECT_TRUE(job.ok()) << job.status();
  *progress = out.str();
  return job.ok() ? *job : v1::Job();
}

TEST(RewardService, GrpoRewardsComeFromTheServiceAndItsFailureFailsTheJob) {
  Cluster c({.agents = 1, .cpu_slots = 2});
  ASSERT_TRUE(c.StartController().ok());
  ASSERT_TRUE(c.StartAgent(0).ok());
  ASSERT_TRUE(c.WaitNodes(1, 20000).ok());
  Rewards service;
  const std::string address = absl::StrCat("127.0.0.1:", FreePort());
  grpc::ServerBuilder b;
  b.AddListeningPort(address, grpc::InsecureServerCredentials());
  b.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  ASSERT_NE(server, nullptr);

  std::string progress;
  v1::Job job = RunJob(c, GrpoSpec(address), &progress);
  ASSERT_EQ(job.state(), v1::SUCCEEDED) << job.reason() << "\n" << progress;
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
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.reason(), HasSubstr(absl::StrCat("rl.reward_service ", address, ": 7 rewards for 8 samples")));

  server->Shutdown();
  server.reset();
  job = RunJob(c, GrpoSpec(address), &progress);
  EXPECT_EQ(job.state(), v1::FAILED);
  EXPECT_THAT(job.reason(), HasSubstr(absl::StrCat("rl.reward_service ", address, ": Score failed")));
}

}  // namespace
}  // namespace tessera::testing
