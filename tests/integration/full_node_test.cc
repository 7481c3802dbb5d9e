// The eight-rank layouts on one "full node" of CPU slots (where no 8-GPU host is at hand): one agent with
// 8 slots, real controller, agent and executor processes, Gloo over loopback.
//  - comm-check: every group of tp8 and of tp2 x dp2 x pp2 passes its exactly verifiable
//    collectives;
//  - the training oracle layouts that need 8 ranks (tp2 x pp2 x dp2 ZeRO-1; tp2 + sp x cp2
//    x pp2) report the per-step losses of one executor on the same model and data
//    (within 1e-5 relative, f32).
// The same layouts on 8 GPUs wait for an 8-GPU host (docs/perf.md).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "tests/integration/cluster.h"

namespace tessera::testing {
namespace {
using ::testing::HasSubstr;

TEST(FullNode, EightRankLayoutsOnCpuSlots) {
  auto c = Up({.agents = 1, .cpu_slots = 8});
  auto watch = [&](const v1::JobSpec& spec, std::string* progress_out) -> v1::Job {
    const std::string id = Submit(*c, spec);
    std::ostringstream progress;
    auto job = c->client().Watch(id, progress);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return {};
    EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED) << job->reason() << "\n" << progress.str();
    *progress_out = progress.str();
    return *job;
  };
  std::string progress;
  watch(CommCheckSpec(8, 8, 1, 0), &progress);
  EXPECT_THAT(progress, HasSubstr("group 'workers' tp: 10 checks passed"));
  watch(CommCheckSpec(8, 2, 2, 0), &progress);
  for (const char* kind : {"tp", "dp", "pp", "mp", "world"})
    EXPECT_THAT(progress, HasSubstr(absl::StrCat("group 'workers' ", kind, ": "))) << kind;
  EXPECT_THAT(progress, ::testing::Not(HasSubstr("FAIL")));

  auto losses = [&](const v1::JobSpec& spec) {
    const v1::Job job = watch(spec, &progress);
    EXPECT_THAT(progress, HasSubstr(absl::StrCat(spec.groups(0).devices(), " ranks ready to train")));
    if (spec.groups(0).layout().pp() > 1) {
      EXPECT_THAT(progress, HasSubstr("pipeline_bubble="));
    }
    const auto r = nlohmann::json::parse(job.result_json(), nullptr, false);
    return r.is_object() && r.contains("losses") ? r["losses"].get<std::vector<double>>() : std::vector<double>{};
  };
  const auto one = losses(PretrainSpec(1, 1, 0, 3));
  const auto tp_pp_dp = losses(PretrainSpec(8, 2, 1, 3, /*sp=*/false, /*cp=*/1, /*pp=*/2));
  const auto tp_sp_cp_pp = losses(PretrainSpec(8, 2, 0, 3, /*sp=*/true, /*cp=*/2, /*pp=*/2));
  std::cout << "one rank " << nlohmann::json(one) << ", tp2 pp2 dp2 zero1 " << nlohmann::json(tp_pp_dp)
            << ", tp2 sp cp2 pp2 " << nlohmann::json(tp_sp_cp_pp) << "\n";
  ASSERT_EQ(one.size(), 3u);
  ASSERT_EQ(tp_pp_dp.size(), 3u);
  ASSERT_EQ(tp_sp_cp_pp.size(), 3u);
  for (int s = 0; s < 3; ++s) {
    EXPECT_NEAR(tp_pp_dp[s], one[s], 1e-5 * one[s]) << "tp2 pp2 dp2 zero1, step " << s + 1;
    EXPECT_NEAR(tp_sp_cp_pp[s], one[s], 1e-5 * one[s]) << "tp2 sp cp2 pp2, step " << s + 1;
  }
}

}  // namespace
}  // namespace tessera::testing
