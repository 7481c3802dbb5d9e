// `tessera plan` (client/plan_cmd.h) on a pipeline job of the Llama-3.2-1B shape: the text
// and the JSON carry each pipeline rank's compute and the balanced stage_layers the plan
// suggests (common/plan/plan.h, BalanceStages); the suggestion, planned again, is
// balanced already.
#include "client/plan_cmd.h"

#include <sstream>

#include <nlohmann/json.hpp>

#include "common/spec/job_spec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera::client {
namespace {
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kJob[] = R"(name: pp4-1b
kind: pretrain
groups:
  - {name: actor, devices: 4, device: gpu, layout: {pp: 4}}
model: {vocab_size: 128256, hidden: 2048, num_layers: 16, num_heads: 32, num_kv_heads: 8, ffn: 8192,
        tie_embeddings: true, seq_len: 4096, global_batch: 8, micro_batch: 1}
train: {steps: 10, lr: 3.0e-4, data: {kind: arithmetic}}
)";

v1::JobSpec Spec(const std::vector<std::string>& overrides) {
  auto s = ParseJobSpecYaml(kJob, overrides);
  EXPECT_TRUE(s.ok()) << s.status();
  if (!s.ok()) return v1::JobSpec();
  const absl::Status valid = NormalizeAndValidateJobSpec(*s);
  EXPECT_TRUE(valid.ok()) << valid;
  return *s;
}

TEST(PlanCmd, PipelinesGetABalancedStageSplit) {
  std::ostringstream text;
  EXPECT_EQ(RunPlan(Spec({}), 0, 0, false, text), 0);
  EXPECT_THAT(text.str(), HasSubstr("compute per pipeline rank and micro-batch (model TFLOP): 6.80 / 6.80 / 6.80 / 13.26"));
  EXPECT_THAT(text.str(), HasSubstr("balanced: layout.stage_layers [5, 5, 5, 1] (or stage_layers: auto) gives 8.50 / 8.50 / 8.50 / 8.16"));
  std::ostringstream js;
  EXPECT_EQ(RunPlan(Spec({"groups.0.layout.vpp=2"}), 0, 0, true, js), 0);
  const auto j = nlohmann::json::parse(js.str());
  EXPECT_EQ(j["stage_balance"]["balanced_stage_layers"], nlohmann::json({3, 3, 3, 1, 2, 2, 2, 0}));
  EXPECT_EQ(j["stage_balance"]["stage_layers"], nlohmann::json({2, 2, 2, 2, 2, 2, 2, 2}));
  std::ostringstream again;
  EXPECT_EQ(RunPlan(Spec({"groups.0.layout.stage_layers=5,5,5,1"}), 0, 0, false, again), 0);
  EXPECT_THAT(again.str(), HasSubstr("layers per virtual stage 5,5,5,1"));
  EXPECT_THAT(again.str(), Not(HasSubstr("balanced:")));
  std::ostringstream flat;  // no pipeline, no balance line
  EXPECT_EQ(RunPlan(Spec({"groups.0.layout.pp=1"}), 0, 0, false, flat), 0);
  EXPECT_THAT(flat.str(), Not(HasSubstr("compute per pipeline rank")));
}

}  // namespace
}  // namespace tessera::client
