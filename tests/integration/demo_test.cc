// The README's demos, as `scripts/demo.sh` runs them (the example job files, unchanged, on
// `tessera local`). What the README claims of them must hold:
//  - SFT from the careless teacher, then GRPO from its checkpoint: held-out accuracy rises
//    from the SFT policy's (about 0.6: it adds, and slips on most carries) to 0.8 or more,
//    by at least 20 points;
//  - `--tools`: SFT from a teacher that also calls a calculator, then GRPO with the
//    calculator (examples/servers/calculator_env.py) as its environment: the policy learns
//    to call it — held-out tool calls per problem rise from under 0.2 to 0.8 or more, and
//    accuracy from the SFT policy's to 0.9 or more, by at least 20 points.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/util.h"
#include "tests/integration/cluster.h"

namespace tessera::testing {
namespace {

// Every number the GRPO job printed where `pattern` (one group) matches, in order.
std::vector<double> Numbers(const std::string& log, const std::string& pattern) {
  std::vector<double> out;
  const std::regex re(pattern);
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back(std::stod((*it)[1].str()));
  return out;
}

// SFT (`sft`), then GRPO (`grpo`, with `extra` arguments) from its checkpoint, as
// scripts/demo.sh runs them; the GRPO job's log ("" and a test failure when a job failed).
std::string RunDemo(const std::string& dir, const std::string& sft, const std::string& grpo,
                    const std::vector<std::string>& extra = {}) {
  const std::string bin = std::string(TESSERA_BIN_DIR) + "/tessera", examples = std::string(TESSERA_SOURCE_DIR) + "/examples";
  auto run = [&](std::vector<std::string> args, const std::string& log) {
    Proc p;
    args.insert(args.begin(), {bin, "local"});
    EXPECT_TRUE(p.Start(args, log));
    const int st = p.Wait(900000);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  if (run({examples + "/" + sft, "--state-dir", dir + "/state", "--set", "train.checkpoint.dir=" + dir + "/state/sft-ckpt"},
          dir + "/sft.log") != 0) {
    ADD_FAILURE() << ReadFile(dir + "/sft.log").value_or("");
    return "";
  }
  std::vector<std::string> args = {examples + "/" + grpo, "--state-dir", dir + "/state", "--set",
                                   "train.checkpoint.load=" + dir + "/state/sft-ckpt", "--set",
                                   "train.checkpoint.dir=" + dir + "/state/grpo-ckpt"};
  args.insert(args.end(), extra.begin(), extra.end());
  const int rc = run(args, dir + "/grpo.log");
  const std::string log = ReadFile(dir + "/grpo.log").value_or("");
  if (rc != 0) {
    ADD_FAILURE() << log;
    return "";
  }
  return log;
}

std::string TempDir() {
  char tmpl[] = "/tmp/tessera-demo-test-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  return tmpl;
}

TEST(Demo, GrpoRaisesHeldOutAccuracyAsTheReadmeSays) {
  const std::string dir = TempDir();
  const std::string log = RunDemo(dir, "rl-demo-sft.yaml", "rl-demo-grpo.yaml");
  const std::vector<double> acc = Numbers(log, "accuracy=([0-9.]+)");
  ASSERT_GE(acc.size(), 2u) << log;
  std::cout << "held-out accuracy:";
  for (double a : acc) std::cout << " " << a;
  std::cout << "\n";
  EXPECT_GE(acc.front(), 0.4) << "the SFT policy should add (it slips on carries only)";
  EXPECT_LE(acc.front(), 0.8) << "the SFT policy should keep the teacher's slip";
  EXPECT_GE(acc.back(), 0.8);
  EXPECT_GE(acc.back() - acc.front(), 0.2);
  (void)system(("rm -rf " + dir).c_str());
}

TEST(Demo, WithTheCalculatorGrpoLearnsToCallItAsTheReadmeSays) {
  const std::string dir = TempDir();
  Proc calculator;
  ASSERT_TRUE(calculator.Start({TESSERA_PYTHON3, std::string(TESSERA_SOURCE_DIR) + "/examples/servers/calculator_env.py",
                                "--listen", "127.0.0.1:0"},
                               dir + "/calculator.log"));
  std::string address;
  const std::regex listening("listening on (127\\.0\\.0\\.1:[0-9]+)");
  for (int i = 0; i < 600 && address.empty() && calculator.Wait(0) == -1; ++i) {
    std::smatch m;
    const std::string text = ReadFile(dir + "/calculator.log").value_or("");
    if (std::regex_search(text, m, listening)) address = m[1].str();
    else std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_FALSE(address.empty()) << "the calculator did not start (python3-grpcio: scripts/setup.sh installs it):\n"
                                << ReadFile(dir + "/calculator.log").value_or("");
  const std::string log = RunDemo(dir, "rl-demo-tools-sft.yaml", "rl-demo-tools-grpo.yaml", {"--set", "rl.environment=" + address});
  const std::vector<double> acc = Numbers(log, "accuracy=([0-9.]+)");
  const std::vector<double> calls = Numbers(log, "eval_tool_calls=([0-9.]+)");
  ASSERT_GE(acc.size(), 2u) << log;
  ASSERT_EQ(calls.size(), acc.size()) << log;
  std::cout << "held-out accuracy (tool calls per problem):";
  for (size_t i = 0; i < acc.size(); ++i) std::cout << " " << acc[i] << " (" << calls[i] << ")";
  std::cout << "\n";
  EXPECT_LE(calls.front(), 0.2) << "the SFT policy should mostly answer itself";
  EXPECT_LE(acc.front(), 0.8) << "the SFT policy should keep the teacher's slip";
  EXPECT_GE(calls.back(), 0.8) << "GRPO should learn to call the calculator";
  EXPECT_GE(acc.back(), 0.9);
  EXPECT_GE(acc.back() - acc.front(), 0.2);
  (void)system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace tessera::testing
