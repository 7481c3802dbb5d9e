// The README's demo, as `scripts/demo.sh` runs it (the example job files, unchanged, on
// `tessera local`): SFT from the careless teacher, then GRPO from its checkpoint. What the
// README claims of it must hold: GRPO raises held-out accuracy from the SFT policy's (about
// 0.6: it adds, and slips on most carries) to 0.8 or more, by at least 20 points.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "common/util.h"
#include "tests/integration/cluster.h"

namespace tessera::testing {
namespace {

// Every held-out accuracy the GRPO job printed, in order.
std::vector<double> Accuracies(const std::string& log) {
  std::vector<double> out;
  const std::regex re("accuracy=([0-9.]+)");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator(); ++it)
    out.push_back(std::stod((*it)[1].str()));
  return out;
}

TEST(Demo, GrpoRaisesHeldOutAccuracyAsTheReadmeSays) {
  char tmpl[] = "/tmp/tessera-demo-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, bin = std::string(TESSERA_BIN_DIR) + "/tessera",
                    examples = std::string(TESSERA_SOURCE_DIR) + "/examples";
  auto run = [&](const std::vector<std::string>& args, const std::string& log) {
    Proc p;
    std::vector<std::string> argv = {bin, "local"};
    argv.insert(argv.end(), args.begin(), args.end());
    EXPECT_TRUE(p.Start(argv, log));
    const int st = p.Wait(900000);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  ASSERT_EQ(run({examples + "/rl-demo-sft.yaml", "--state-dir", dir + "/state", "--set",
                 "train.checkpoint.dir=" + dir + "/state/sft-ckpt"},
                dir + "/sft.log"),
            0)
      << ReadFile(dir + "/sft.log").value_or("");
  ASSERT_EQ(run({examples + "/rl-demo-grpo.yaml", "--state-dir", dir + "/state", "--set",
                 "train.checkpoint.load=" + dir + "/state/sft-ckpt", "--set",
                 "train.checkpoint.dir=" + dir + "/state/grpo-ckpt"},
                dir + "/grpo.log"),
            0)
      << ReadFile(dir + "/grpo.log").value_or("");
  const std::string log = ReadFile(dir + "/grpo.log").value_or("");
  const std::vector<double> acc = Accuracies(log);
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

}  // namespace
}  // namespace tessera::testing
