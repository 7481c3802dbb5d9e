// The example servers in Python (examples/servers: Debian's python3-grpcio, the protos as
// the contract): the calculator environment answers calls with the value of their last
// parenthesized expression, keeps per-session state until End and ends an episode past its
// call limit; the code-answer checker rewards programs whose output is the reference, and a
// program that never ends gets 0 within its limit. Each serves a grpo job through the
// daemons: multi-turn rollouts calling the calculator, and JSONL prompts scored by the
// checker.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec.h"
#include "common/util.h"
#include "tessera/v1/environment_service.grpc.pb.h"
#include "tessera/v1/reward_service.grpc.pb.h"
#include "tests/integration/cluster.h"

namespace tessera::testing {
namespace {

using ::testing::HasSubstr;

// Starts examples/servers/<script> on a free loopback port; its address ("" on failure).
std::string StartServer(Proc& p, const std::string& script, const std::vector<std::string>& extra, const std::string& log) {
  std::vector<std::string> argv = {TESSERA_PYTHON3, std::string(TESSERA_SOURCE_DIR) + "/examples/servers/" + script,
                                   "--listen", "127.0.0.1:0"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  if (!p.Start(argv, log)) return "";
  const std::regex re("listening on (127\\.0\\.0\\.1:[0-9]+)");
  for (int i = 0; i < 600; ++i) {
    std::smatch m;
    const std::string text = ReadFile(log).value_or("");
    if (std::regex_search(text, m, re)) return m[1].str();
    if (p.Wait(0) != -1) break;  // it exited
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << script << " did not start (python3-grpcio and python3-protobuf: scripts/setup.sh installs them):\n"
                << ReadFile(log).value_or("");
  return "";
}

TEST(PythonServers, TheCalculatorEnvironmentAnswersCallsAndServesAMultiTurnJob) {
  Cluster c({.agents = 1, .cpu_slots = 2});
  ASSERT_TRUE(StartOneNode(c));
  Proc server;
  const std::string address = StartServer(server, "calculator_env.py", {"--max-calls", "2"}, c.dir() + "/calculator.log");
  ASSERT_FALSE(address.empty());
  auto stub = v1::EnvironmentService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  v1::EnvStepRequest req;
  for (const char* call : {"17+25=(17+25)", "(2*(3+4)-1)", "(1+)", "no call)"}) {
    auto* k = req.add_calls();
    k->set_session("a"), k->set_turn(1), k->set_call(call);
  }
  grpc::ClientContext ctx;
  v1::EnvStepResponse resp;
  ASSERT_TRUE(stub->Step(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.observations_size(), 4);
  EXPECT_EQ(resp.observations(0).text(), "[42]");
  EXPECT_EQ(resp.observations(1).text(), "[13]");
  EXPECT_FALSE(resp.observations(1).done());
  EXPECT_TRUE(resp.observations(2).done());  // the session's third and fourth calls: past --max-calls
  EXPECT_TRUE(resp.observations(3).done());
  // End drops the session's count: it calls afresh.
  v1::EnvEndRequest end;
  end.add_sessions("a");
  grpc::ClientContext ctx2, ctx3;
  v1::EnvEndResponse ended;
  ASSERT_TRUE(stub->End(&ctx2, end, &ended).ok());
  v1::EnvStepRequest again;
  again.add_calls()->set_call("(1+)"), again.mutable_calls(0)->set_session("a");
  ASSERT_TRUE(stub->Step(&ctx3, again, &resp).ok());
  EXPECT_EQ(resp.observations(0).text(), "[error]");

  // A grpo job whose samples call it (an untrained model at a high temperature writes ")"
  // now and then).
  v1::JobSpec spec = PretrainSpec(2, 1, 0, 2);
  spec.set_kind("grpo");
  spec.mutable_train()->mutable_data()->set_digits(1);
  auto* rl = spec.mutable_rl();
  rl->set_group_size(4), rl->set_prompts_per_step(8), rl->set_eval_problems(8), rl->set_max_new_tokens(48);
  rl->set_temperature(4.0), rl->set_environment(address), rl->set_tool_stop(")"), rl->set_max_turns(3);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok()) << NormalizeAndValidateJobSpec(spec);
  std::string progress;
  const v1::Job job = RunJob(c, spec, &progress);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason() << "\n" << progress;
  double calls = 0;
  for (const auto& m : LinesWith(progress, "tool_calls")) calls += m.at("tool_calls");
  EXPECT_GT(calls, 0) << progress;
}

TEST(PythonServers, TheCodeCheckerRewardsRightProgramsAndScoresAJob) {
  Cluster c({.agents = 1, .cpu_slots = 2});
  ASSERT_TRUE(StartOneNode(c));
  Proc server;
  const std::string address = StartServer(server, "code_reward.py", {"--timeout", "1"}, c.dir() + "/code.log");
  ASSERT_FALSE(address.empty());
  auto stub = v1::RewardService::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  v1::ScoreRequest req;
  for (auto [completion, reference] : {std::pair{"Here:\n```python\nprint(sum(range(10)))\n```\n", "45"},
                                       std::pair{"print(44)", "45"},
                                       std::pair{"```python\nwhile True:\n    pass\n```", "45"},
                                       std::pair{"```python\nraise SystemExit(3)\n```", ""}}) {
    auto* s = req.add_samples();
    s->set_completion(completion), s->set_reference(reference);
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::ScoreResponse resp;
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(stub->Score(&ctx, req, &resp).ok());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10);
  ASSERT_EQ(resp.rewards_size(), 4);
  EXPECT_EQ(resp.rewards(0), 1.0);
  EXPECT_EQ(resp.rewards(1), 0.0);
  EXPECT_EQ(resp.rewards(2), 0.0);  // killed at its limit
  EXPECT_EQ(resp.rewards(3), 0.0);  // a failing program, whatever it printed

  // A grpo job on JSONL prompts that ask for programs, scored by the checker.
  std::string file;
  for (int i = 0; i < 4; ++i)
    file += nlohmann::json{{"prompt", absl::StrCat("Print ", i, " squared:\n")}, {"answer", absl::StrCat(i * i)}}.dump() + "\n";
  ASSERT_TRUE(WriteFileAtomic(c.dir() + "/code.jsonl", file).ok());
  v1::JobSpec spec = PretrainSpec(2, 1, 0, 2);
  spec.set_kind("grpo");
  spec.mutable_train()->mutable_data()->set_kind("jsonl");
  spec.mutable_train()->mutable_data()->set_path(c.dir() + "/code.jsonl");
  auto* rl = spec.mutable_rl();
  rl->set_group_size(2), rl->set_prompts_per_step(4), rl->set_max_new_tokens(12), rl->set_reward_service(address);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(spec).ok()) << NormalizeAndValidateJobSpec(spec);
  std::string progress;
  const v1::Job job = RunJob(c, spec, &progress);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason() << "\n" << progress;
  const auto rewards = nlohmann::json::parse(job.result_json())["rewards"];
  ASSERT_EQ(rewards.size(), 2u);
  for (const auto& r : rewards) EXPECT_TRUE(r.get<double>() >= 0 && r.get<double>() <= 1) << r;
}

}  // namespace
}  // namespace tessera::testing
