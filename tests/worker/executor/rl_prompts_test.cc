// Held-out evaluation of a JSONL job (rl.eval_data, HeldOutEval): each problem answered
// greedily and checked by the rule verifier, split over the DP ranks, at most the file's
// problems. The expected answers are what the model itself answers greedily, so the
// count of right ones is known: the problems given the model's own answer count, the
// others do not. Also: shuffled passes, and multi-turn samples' masks on the wire.
#include "worker/executor/rl_prompts.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec.h"
#include "worker/executor/model_spec.h"
#include "worker/executor/rl_batch.h"
#include "worker/executor/rollout_pool.h"
#include "worker/model/llama.h"

namespace tessera::executor {
namespace {

using ::testing::HasSubstr;

void WriteProblems(const std::string& path, const std::vector<std::pair<std::string, std::string>>& lines) {
  std::ofstream f(path);
  for (const auto& [prompt, answer] : lines) f << nlohmann::json{{"prompt", prompt}, {"answer", answer}}.dump() << "\n";
}

v1::JobSpec Spec(const std::string& train, const std::string& eval) {
  auto spec = ParseJobSpecYaml(absl::StrCat(
      "name: held\nkind: grpo\ngroups:\n  - {name: actor, devices: 1}\n"
      "model: {vocab_size: 256, hidden: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2, ffn: 48, seq_len: 32,\n"
      "        global_batch: 4, micro_batch: 2}\n"
      "train: {steps: 1, lr: 1.0e-3, seed: 5, data: {kind: jsonl, path: ", train, "}}\n"
      "rl: {group_size: 2, prompts_per_step: 2, max_new_tokens: 1", eval.empty() ? "" : absl::StrCat(", eval_data: ", eval),
      "}\n"));
  EXPECT_TRUE(spec.ok()) << spec.status();
  const absl::Status valid = NormalizeAndValidateJobSpec(*spec);
  EXPECT_TRUE(valid.ok()) << valid;
  return *spec;
}

TEST(HeldOutEval, JsonlProblemsCountTheModelsRightAnswers) {
  const std::string dir = ::testing::TempDir() + "/held-out-eval";
  std::filesystem::create_directories(dir);
  WriteProblems(dir + "/train.jsonl", {{"1+1=", "2"}, {"2+2=", "4"}});
  std::vector<std::pair<std::string, std::string>> candidates;
  for (int i = 0; i < 400; ++i) candidates.push_back({absl::StrCat("q", i, "?"), "0"});
  WriteProblems(dir + "/candidates.jsonl", candidates);

  const v1::JobSpec first = Spec(dir + "/train.jsonl", dir + "/candidates.jsonl");
  RlPrompts prompts;
  ASSERT_TRUE(prompts.Load(first, 256).ok());
  ASSERT_EQ(prompts.held_out().size(), 400u);
  auto backend = runtime::MakeCpuBackend();
  auto config = ModelConfigFromSpec(first, v1::DEVICE_TYPE_CPU);
  ASSERT_TRUE(config.ok()) << config.status();
  auto model = model::Llama::Create(*config, backend.get());
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE((*model)->InitRandom(11, 1.0f).ok());
  auto rollout = engine::RolloutEngine::Create(model->get(), RlRolloutOptions(first.rl(), 1, prompts.longest_prompt()));
  ASSERT_TRUE(rollout.ok()) << rollout.status();

  // What the model answers greedily (one byte); the problems whose answer is a letter or
  // a digit.
  std::vector<engine::GenerationRequest> requests;
  for (const RlPrompts::Prompt& p : prompts.held_out()) {
    engine::GenerationRequest r;
    r.prompt = p.ids, r.params.temperature = 0, r.params.max_new_tokens = 1;
    requests.push_back(r);
  }
  auto said = (*rollout)->Generate(requests);
  ASSERT_TRUE(said.ok()) << said.status();
  std::vector<std::pair<std::string, std::string>> held;
  int right = 0;
  for (const engine::Completion& c : *said) {
    if (c.tokens.size() != 1 || c.tokens[0] > 127 || !std::isalnum(c.tokens[0]) || held.size() == 10) continue;
    const std::string own(1, static_cast<char>(c.tokens[0]));
    const bool give_right = held.size() % 2 == 0;  // every other problem expects the model's own answer
    right += give_right;
    held.push_back({candidates[c.request].first, give_right ? own : std::isdigit(c.tokens[0]) ? "x" : "7"});
  }
  ASSERT_GE(held.size(), 6u) << "too few letters or digits among the model's answers";
  WriteProblems(dir + "/eval.jsonl", held);

  const v1::JobSpec spec = Spec(dir + "/train.jsonl", dir + "/eval.jsonl");
  RlPrompts mine;
  ASSERT_TRUE(mine.Load(spec, 256).ok());
  // Two DP ranks share the problems; asked for more than the file has, they answer all.
  int64_t correct = 0, problems = 0;
  for (int rank : {0, 1}) {
    auto got = HeldOutEval(**rollout, mine, nullptr, 1, 1000, rank, 2);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->problems(), static_cast<int64_t>(held.size()) * (rank + 1) / 2 - static_cast<int64_t>(held.size()) * rank / 2);
    correct += got->correct(), problems += got->problems();
  }
  EXPECT_EQ(problems, static_cast<int64_t>(held.size()));
  EXPECT_EQ(correct, right);
  // The first three only: problems 0 and 2 expect the model's answers.
  auto three = HeldOutEval(**rollout, mine, nullptr, 1, 3, 0, 1);
  ASSERT_TRUE(three.ok()) << three.status();
  EXPECT_EQ(three->problems(), 3);
  EXPECT_EQ(three->correct(), 2);

  // A JSONL job without rl.eval_data has no held-out problems.
  RlPrompts none;
  ASSERT_TRUE(none.Load(Spec(dir + "/train.jsonl", ""), 256).ok());
  auto refused = HeldOutEval(**rollout, none, nullptr, 1, 10, 0, 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("rl.eval_data"));
}

// train.data.shuffle: each pass over the file is a permutation of its lines — another
// one each pass, the same for the same seed and pass (every rank, every restart) —, and
// without it the prompts keep the file's order.
TEST(RlPrompts, ShuffleGivesEachPassAnotherOrder) {
  const std::string dir = ::testing::TempDir() + "/shuffled-prompts";
  std::filesystem::create_directories(dir);
  std::vector<std::pair<std::string, std::string>> lines;
  for (int i = 0; i < 50; ++i) lines.push_back({absl::StrCat("p", i, "="), absl::StrCat(i)});
  WriteProblems(dir + "/train.jsonl", lines);
  v1::JobSpec spec = Spec(dir + "/train.jsonl", "");
  RlPrompts ordered;
  ASSERT_TRUE(ordered.Load(spec, 256).ok());
  for (int64_t i = 0; i < 120; ++i) EXPECT_EQ(ordered.At(i).answer, absl::StrCat(i % 50));
  spec.mutable_train()->mutable_data()->set_shuffle(true);
  RlPrompts shuffled, again;
  ASSERT_TRUE(shuffled.Load(spec, 256).ok());
  ASSERT_TRUE(again.Load(spec, 256).ok());
  std::vector<std::vector<std::string>> passes(3);
  for (int64_t i = 149; i >= 0; --i) {  // backwards: the order does not depend on the calls before
    passes[i / 50].insert(passes[i / 50].begin(), shuffled.At(i).answer);
    EXPECT_EQ(again.At(i).answer, passes[i / 50].front()) << i;
  }
  for (auto& pass : passes) {
    std::vector<std::string> sorted = pass;
    std::sort(sorted.begin(), sorted.end(), [](const std::string& a, const std::string& b) { return std::stoi(a) < std::stoi(b); });
    for (int i = 0; i < 50; ++i) EXPECT_EQ(sorted[i], absl::StrCat(i));  // every line once
  }
  EXPECT_NE(passes[0], passes[1]);
  EXPECT_NE(passes[1], passes[2]);
  EXPECT_NE(passes[0][0] + passes[0][1] + passes[0][2], "012");
  spec.mutable_train()->set_seed(6);
  RlPrompts other_seed;
  ASSERT_TRUE(other_seed.Load(spec, 256).ok());
  std::vector<std::string> first;
  for (int64_t i = 0; i < 50; ++i) first.push_back(other_seed.At(i).answer);
  EXPECT_NE(first, passes[0]);
  EXPECT_EQ(ShuffledOrder(50, 5, 1), ShuffledOrder(50, 5, 1));
}

// Multi-turn samples on the wire: completion_mask marks the observations, rollout_logp
// holds the sampled tokens' log-probs in order (a token tensor), and the batch reads back
// into samples whose masks leave the observations out; a malformed mask is refused.
TEST(SamplesBatch, MultiTurnMasksTravelWithTheSamples) {
  const std::vector<std::vector<int32_t>> prompts = {{1, 2}, {3}}, completions = {{4, 5, 6, 7}, {8, 9}};
  const std::vector<std::vector<uint8_t>> sampled = {{1, 0, 0, 1}, {}};
  const std::vector<std::vector<float>> logprobs = {{-1.f, 0.f, 0.f, -4.f}, {-5.f, -6.f}};
  const v1::TensorBatch b = SamplesToBatch(prompts, completions, {1.0, 0.0}, 2, 6, &logprobs, &sampled);
  std::vector<std::vector<int32_t>> p, c;
  std::vector<double> r;
  std::vector<std::vector<uint8_t>> m;
  ASSERT_TRUE(BatchToSamples(b, &p, &c, &r, &m).ok());
  EXPECT_EQ(c, completions);
  EXPECT_EQ(m[0], (std::vector<uint8_t>{1, 0, 0, 1}));
  EXPECT_EQ(m[1], (std::vector<uint8_t>{1, 1}));
  auto got = RolloutsOfBatch(b, 2, 256, "RlUpdate");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(engine::ResponsePositions(got->samples[0]), (std::vector<size_t>{1, 4}));
  auto taken = TakeTokenTensor(b, kRolloutLogp, got->samples, &engine::RlSample::rollout_logp);
  ASSERT_TRUE(taken.ok() && *taken);
  EXPECT_FLOAT_EQ(got->samples[0].rollout_logp[1], -1.f);
  EXPECT_FLOAT_EQ(got->samples[0].rollout_logp[4], -4.f);
  EXPECT_FLOAT_EQ(got->samples[1].rollout_logp[1], -6.f);

  v1::TensorBatch bad = b;
  for (auto& t : *bad.mutable_tensors())
    if (t.name() == kCompletionMask) t.mutable_shape()->Set(1, 1), t.mutable_data()->resize(2 * sizeof(int32_t));
  EXPECT_THAT(BatchToSamples(bad, &p, &c, &r, &m).message(), HasSubstr("completion_mask is 1 wide; completion 0 has 4 tokens"));
}

}  // namespace
}  // namespace tessera::executor
