// `tessera plan` (client/plan_cmd.h) on a pipeline job of the Llama-3.2-1B shape: the text
// and the JSON carry each pipeline rank's compute and the balanced stage_layers the plan
// suggests (common/plan/plan.h, BalanceStages); the suggestion, planned again, is
// balanced already.
#include "client/plan_cmd.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

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

// model.hf_dir: the shape comes from the directory's config.json (transformers-saved
// fixtures). The Qwen3 fixture (4 heads over 2 KV heads, head_dim 16, q/k norm, tied) at
// TP 4 holds one query head and one of its KV head's two copies per rank:
//   per layer q, k, v, o 16x32 each (2048), gate and up 16x32 (1024), down 32x16 (512), two
//   norms of 32 and the q/k norms of 16 (96): 3680; two layers 7360; the tied embedding's
//   vocabulary split four ways 24x32 = 768, the final norm 32: 8160.
// A model_type we do not implement fails naming the field and the type.
TEST(PlanCmd, ReadsTheModelFromAHuggingFaceDirectory) {
  const std::string fixtures = std::string(TESSERA_SOURCE_DIR) + "/tests/worker/checkpoint/hf_models/";
  auto spec = ParseJobSpecYaml(absl::StrCat("name: qwen3-tp4\nkind: pretrain\ngroups:\n"
                                            "  - {name: actor, devices: 4, device: gpu, layout: {tp: 4}}\n"
                                            "model: {hf_dir: ", fixtures, "qwen3, seq_len: 64, global_batch: 4, micro_batch: 1}\n"
                                            "train: {steps: 1, lr: 1.0e-4, data: {kind: arithmetic}}\n"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const absl::Status valid = NormalizeAndValidateJobSpec(*spec);
  ASSERT_TRUE(valid.ok()) << valid;
  std::ostringstream js;
  EXPECT_EQ(RunPlan(*spec, 0, 0, true, js), 0);
  EXPECT_EQ(nlohmann::json::parse(js.str())["plan"]["params_per_rank"], 8160) << js.str();
  // The Llama 3.2 fixture (2 heads over 1 KV head, ffn 64) at TP 2: per layer q, k, v, o
  // 16x32 each (2048), gate and up 32x32 (2048), down 32x32 (1024), two norms (64): 5184;
  // two layers 10368; the tied embedding 48x32 = 1536, the final norm 32: 11936.
  spec->mutable_model()->set_hf_dir(fixtures + "llama32_rope_llama3");
  spec->mutable_groups(0)->mutable_layout()->set_tp(2);
  spec->mutable_groups(0)->set_devices(2);
  std::ostringstream llama;
  EXPECT_EQ(RunPlan(*spec, 0, 0, true, llama), 0);
  EXPECT_EQ(nlohmann::json::parse(llama.str())["plan"]["params_per_rank"], 11936) << llama.str();

  const std::string bad = ::testing::TempDir() + "/plan-moe";
  std::filesystem::create_directories(bad);
  std::ofstream(bad + "/config.json") << R"({"model_type": "mixtral", "hidden_size": 32})";
  spec->mutable_model()->set_hf_dir(bad);
  ::testing::internal::CaptureStderr();
  std::ostringstream none;
  EXPECT_EQ(RunPlan(*spec, 0, 0, false, none), 1);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("model.hf_dir"));
  EXPECT_THAT(err, HasSubstr("model_type 'mixtral'"));
  EXPECT_EQ(none.str(), "");
}

// grpo with a reward group: each device set's models — the actor with its reference
// beside it, the reward model (its own shape from rl.reward_model's config.json) — and the
// KV cache of the generating group; over --memory the exit code says it does not fit.
TEST(PlanCmd, RlJobsListEachDeviceSetsModels) {
  const std::string dir = ::testing::TempDir() + "/plan-rm";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"architectures": ["Qwen3ForSequenceClassification"], "model_type": "qwen3",
    "vocab_size": 1024, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "id2label": {"0": "LABEL_0"}})";
  auto spec = ParseJobSpecYaml(absl::StrCat(R"(name: grpo-rm
kind: grpo
groups:
  - {name: actor, devices: 1, device: gpu}
  - {name: rm, role: reward, devices: 1, device: gpu, colocate_with: actor}
model: {vocab_size: 1024, hidden: 256, num_layers: 4, num_heads: 8, num_kv_heads: 4, ffn: 512, seq_len: 64,
        global_batch: 8, micro_batch: 2}
train: {steps: 2, lr: 1.0e-5, data: {kind: arithmetic, digits: 2}}
rl: {prompts_per_step: 4, group_size: 4, max_new_tokens: 100, kl_coef: 0.01, reward_model: )", dir, "}\n"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(NormalizeAndValidateJobSpec(*spec).ok()) << NormalizeAndValidateJobSpec(*spec);
  std::ostringstream text;
  EXPECT_EQ(RunPlan(*spec, 0, 0, false, text), 0);
  EXPECT_THAT(text.str(), HasSubstr("devices of 'actor'"));
  EXPECT_THAT(text.str(), HasSubstr("actor "));
  EXPECT_THAT(text.str(), HasSubstr("reference ('actor')"));
  EXPECT_THAT(text.str(), HasSubstr("reward ('rm')"));
  EXPECT_THAT(text.str(), HasSubstr("KV cache: "));
  std::ostringstream js;
  EXPECT_EQ(RunPlan(*spec, 0, 1 << 20, true, js), 2);  // 1 MiB: over
  const auto j = nlohmann::json::parse(js.str());
  EXPECT_FALSE(j["fits"].get<bool>());
  ASSERT_EQ(j["models"].size(), 3u);
  EXPECT_EQ(j["models"][2]["model"], "reward");
  ASSERT_EQ(j["devices"].size(), 1u);
  EXPECT_GT(j["devices"][0]["kv_cache_wanted_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(j["devices"][0]["need_bytes"].get<int64_t>(),
            j["devices"][0]["states_bytes"].get<int64_t>() + j["devices"][0]["pass_bytes"].get<int64_t>());
  // Both groups offloading: nothing stays, each model waits on the host in turn.
  for (auto& g : *spec->mutable_groups()) g.set_offload(true);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(*spec).ok()) << NormalizeAndValidateJobSpec(*spec);
  std::ostringstream turns;
  EXPECT_EQ(RunPlan(*spec, 0, 0, false, turns), 0);
  EXPECT_THAT(turns.str(), HasSubstr("in the largest turn"));
  EXPECT_THAT(turns.str(), HasSubstr("offloaded to page-locked host memory per device"));
  std::ostringstream tj;
  EXPECT_EQ(RunPlan(*spec, 0, 0, true, tj), 0);
  const auto t = nlohmann::json::parse(tj.str());
  EXPECT_EQ(t["devices"][0]["states_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(t["devices"][0]["offloaded_bytes"].get<int64_t>(), j["devices"][0]["states_bytes"].get<int64_t>());
  EXPECT_LT(t["devices"][0]["need_bytes"].get<int64_t>(), j["devices"][0]["need_bytes"].get<int64_t>());
  EXPECT_TRUE(t["models"][0]["offload"].get<bool>());
}

}  // namespace
}  // namespace tessera::client
