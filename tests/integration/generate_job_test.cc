// The generate job kind through real daemons (one agent, two CPU slots): a pretrain job
// writes a checkpoint (a Qwen2-style model: QKV bias), then generate jobs complete a JSONL
// file of prompts with it over two DP ranks. The output keeps the input's order and keys,
// and every completion equals what this process's own rollout engine generates from the
// same checkpoint (greedy, and sampled with the job's per-line seeds): the DP split, the
// weights-only checkpoint load and the part files joined in order change nothing. Bad
// input fails the job naming the file and line, and leaves no output.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/model/hf_config.h"
#include "common/spec/job_spec.h"
#include "common/util.h"
#include "tests/integration/cluster.h"
#include "tests/integration/hf_dir.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/checkpoint/hf.h"
#include "worker/rollout/rollout.h"
#include "worker/tokenizer/model_text.h"

namespace tessera::testing {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

v1::JobSpec GenerateSpec(const std::string& dir, const std::string& input, const std::string& output) {
  auto s = ParseJobSpecYaml(absl::StrCat(
      "name: gen\nkind: generate\ncollective_timeout_s: 30\ngroups:\n  - name: rollout\n    devices: 2\n"
      "    layout: {tp: 1, dp: 2}\n"
      "model: {vocab_size: 256, hidden: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2, ffn: 48, qkv_bias: true}\n"
      "generate: {input: ", input, ", output: ", output, ", checkpoint: ", dir, "/ckpt, max_new_tokens: 9, max_running: 3}\n"));
  EXPECT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(NormalizeAndValidateJobSpec(*s).ok());
  return *s;
}

// What the job should produce for line i: this process's engine on the same weights.
std::vector<std::string> Reference(const std::vector<std::string>& prompts, const std::string& ckpt, float temperature,
                                   int n, uint64_t seed) {
  model::LlamaConfig c;
  c.vocab = 256, c.hidden = 32, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.ffn = 48, c.qkv_bias = true;
  auto be = runtime::MakeCpuBackend();
  auto m = model::Llama::Create(c, be.get());
  EXPECT_TRUE(m.ok());
  auto latest = checkpoint::LatestCheckpoint(ckpt);
  EXPECT_TRUE(latest.ok()) << latest.status();
  EXPECT_TRUE(checkpoint::LoadCheckpoint(*latest, {m->get(), nullptr}).ok());
  engine::RolloutOptions o;
  o.num_blocks = 64;
  auto e = engine::RolloutEngine::Create(m->get(), o);
  std::vector<engine::GenerationRequest> reqs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    engine::GenerationRequest r;
    r.prompt.assign(prompts[i].begin(), prompts[i].end());
    r.params.max_new_tokens = 9, r.params.temperature = temperature, r.params.n = n;
    r.params.seed = seed + i * 7919u;
    reqs.push_back(r);
  }
  auto got = (*e)->Generate(reqs);
  EXPECT_TRUE(got.ok()) << got.status();
  std::vector<std::string> out;
  if (got.ok())
    for (const auto& comp : *got) out.emplace_back(comp.tokens.begin(), comp.tokens.end());
  return out;
}

TEST(GenerateJob, CompletesAJsonlFileAsTheEngineDoes) {
  Cluster c({.agents = 1, .cpu_slots = 2});
  ASSERT_TRUE(c.StartController().ok());
  ASSERT_TRUE(c.StartAgent(0).ok());
  ASSERT_TRUE(c.WaitNodes(1, 20000).ok());
  // Weights: a short pretrain run's checkpoint.
  v1::JobSpec pt = PretrainSpec(2, 1, 0, 3);
  pt.mutable_train()->mutable_checkpoint()->set_dir(c.dir() + "/ckpt");
  ASSERT_EQ(RunJob(c, pt).state(), v1::JOB_STATE_SUCCEEDED);
  // Seven prompts (an odd count: the DP ranks take 3 and 4), extra keys on some.
  const std::vector<std::string> prompts = {"12+34=", "hello", "a", "The quick brown fox", "7+8=", "zz", "0123456789"};
  const std::string input = c.dir() + "/prompts.jsonl", output = c.dir() + "/out.jsonl";
  {
    std::ofstream f(input);
    for (size_t i = 0; i < prompts.size(); ++i) {
      json j{{"prompt", prompts[i]}};
      if (i % 2 == 0) j["id"] = absl::StrCat("p", i);
      f << j.dump() << "\n";
      if (i == 3) f << "\n";  // blank lines are skipped
    }
  }
  std::string progress;
  v1::Job job = RunJob(c, GenerateSpec(c.dir(), input, output), &progress);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason() << "\n" << progress;
  EXPECT_THAT(progress, HasSubstr("7 prompts, 7 completions"));
  auto check = [&](float temperature, int n, uint64_t seed) {
    const std::vector<std::string> want = Reference(prompts, c.dir() + "/ckpt", temperature, n, seed);
    auto text = ReadFile(output);
    ASSERT_TRUE(text.ok()) << text.status();
    std::istringstream lines(*text);
    std::string line;
    size_t i = 0;
    for (; std::getline(lines, line); ++i) {
      ASSERT_LT(i, prompts.size());
      const json j = json::parse(line);
      EXPECT_EQ(j["prompt"], prompts[i]);
      EXPECT_EQ(j.contains("id"), i % 2 == 0);
      ASSERT_EQ(j["completions"].size(), size_t(n));
      for (int k = 0; k < n; ++k) {
        const json& comp = j["completions"][k];
        const std::string& w = want[i * n + k];
        EXPECT_EQ(comp["token_ids"].get<std::vector<int32_t>>(), std::vector<int32_t>(
                      reinterpret_cast<const unsigned char*>(w.data()), reinterpret_cast<const unsigned char*>(w.data()) + w.size()))
            << "line " << i << " sample " << k;
        // The text: the same bytes where they are UTF-8, U+FFFD for each byte that is not.
        const std::string replaced = json::parse(json(w).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
        EXPECT_EQ(comp["text"].get<std::string>(), replaced);
        EXPECT_EQ(comp["num_tokens"], 9);
        EXPECT_EQ(comp["finish_reason"], "length");
        EXPECT_LE(comp["cumulative_logprob"].get<double>(), 0.0);
      }
    }
    EXPECT_EQ(i, prompts.size());
    EXPECT_FALSE(ReadFile(output + ".part-0").ok()) << "part files are removed";
  };
  check(1.f, 1, 0);  // the default: temperature 1, seed 0
  v1::JobSpec greedy = GenerateSpec(c.dir(), input, output);
  greedy.mutable_generate()->set_temperature(0);
  greedy.mutable_generate()->set_n(2);
  ASSERT_EQ(RunJob(c, greedy).state(), v1::JOB_STATE_SUCCEEDED);
  check(0.f, 2, 0);
  // A cache too small for the longest prompt (19 bytes) + 9 new tokens: refused by name.
  v1::JobSpec small = GenerateSpec(c.dir(), input, output);
  small.mutable_generate()->set_cache_tokens(20);
  job = RunJob(c, small);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("generate.cache_tokens: 20 tokens cannot hold prompt"));
  // Bad input: the job fails naming the file and the line; the output is not replaced.
  const std::string before = *ReadFile(output);
  {
    std::ofstream f(input, std::ios::app);
    f << "{\"text\": \"no prompt here\"}\n";
  }
  job = RunJob(c, GenerateSpec(c.dir(), input, output));
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("prompts.jsonl:9: expected {\"prompt\""));
  EXPECT_EQ(*ReadFile(output), before);
}

// A Hugging Face directory with a tokenizer.json (the Llama-3-style fixture: BPE, special
// tokens, a chat template, generation_config.json's EOS ids and default sampling — greedy
// here): a generate job reads its
// prompts and conversations with that tokenizer and template and writes decoded text.
// Every completion equals this process's own engine fed the same encodings (checked
// independently of the job: BOS first, the chat's header tokens as single ids) and
// stopping at the EOS ids. A conversation with the byte tokenizer, and a stop string of
// several tokens, fail the job by name and leave the output as it was.
TEST(GenerateJob, ReadsAndWritesTextWithTheModelsTokenizer) {
  Cluster c({.agents = 1, .cpu_slots = 2});
  ASSERT_TRUE(c.StartController().ok());
  ASSERT_TRUE(c.StartAgent(0).ok());
  ASSERT_TRUE(c.WaitNodes(1, 20000).ok());
  const std::string hf = c.dir() + "/hf", fixture = TokenizerFixture("llama3");
  const model::LlamaConfig mc = TinyTextModel();
  auto be = runtime::MakeCpuBackend();
  ASSERT_TRUE(WriteHfModelDir(hf, mc, 11, 0.5f).ok());
  auto text = tokenizer::LoadModelText(fixture);
  ASSERT_TRUE(text.ok()) << text.status();
  const int32_t bos = *text->tokenizer->SpecialId("<|begin_of_text|>"), eot = *text->tokenizer->SpecialId("<|eot_id|>"),
                eos = *text->tokenizer->SpecialId("<|end_of_text|>"), header = *text->tokenizer->SpecialId("<|start_header_id|>");
  // Greedy by the model's default (the job sets no sampling: generation_config.json's applies).
  ASSERT_TRUE(WriteFileAtomic(hf + "/generation_config.json",
                              absl::StrCat("{\"eos_token_id\": [", eos, ", ", eot, "], \"temperature\": 0}")).ok());

  const std::string input = c.dir() + "/chat.jsonl", output = c.dir() + "/chat-out.jsonl";
  const std::vector<json> lines = {
      {{"prompt", "The quick brown fox"}},
      {{"id", 7}, {"messages", {{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi there!"}}}}},
      {{"prompt", "naïve café 日本語"}}};
  {
    std::ofstream f(input);
    for (const auto& l : lines) f << l.dump() << "\n";
  }
  // The prompts as the job must encode them, and what this process's engine makes of them.
  std::vector<std::vector<int32_t>> prompts;
  prompts.push_back(*text->tokenizer->Encode("The quick brown fox", true));
  auto chat = text->chat->Apply(nlohmann::ordered_json::parse(lines[1]["messages"].dump()), true);
  ASSERT_TRUE(chat.ok()) << chat.status();
  prompts.push_back(*text->tokenizer->Encode(*chat, false));
  prompts.push_back(*text->tokenizer->Encode("naïve café 日本語", true));
  EXPECT_EQ(prompts[0].front(), bos);
  EXPECT_EQ(prompts[1].front(), bos);
  EXPECT_EQ(std::count(prompts[1].begin(), prompts[1].end(), header), 3);  // system, user, assistant
  EXPECT_EQ(std::count(prompts[1].begin(), prompts[1].end(), bos), 1);
  auto m = model::Llama::Create(mc, be.get());
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(checkpoint::ImportHf(hf, **m).ok());
  engine::RolloutOptions o;
  o.num_blocks = 64;
  auto e = engine::RolloutEngine::Create(m->get(), o);
  std::vector<engine::GenerationRequest> reqs;
  for (const auto& p : prompts) {
    engine::GenerationRequest r;
    r.prompt = p;
    r.params.max_new_tokens = 12, r.params.temperature = 0, r.params.stop_tokens = {eos, eot};
    reqs.push_back(r);
  }
  auto want = (*e)->Generate(reqs);
  ASSERT_TRUE(want.ok()) << want.status();

  auto s = ParseJobSpecYaml(absl::StrCat(
      "name: gen-hf\nkind: generate\ncollective_timeout_s: 30\ngroups:\n  - name: rollout\n    devices: 2\n"
      "    layout: {tp: 1, dp: 2}\nmodel: {hf_dir: ", hf, "}\n"
      "generate: {input: ", input, ", output: ", output, ", max_new_tokens: 12}\n"));
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE(NormalizeAndValidateJobSpec(*s).ok());
  EXPECT_FALSE(s->generate().has_temperature());  // left to the model's generation_config.json
  v1::Job job = RunJob(c, *s);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  auto out = ReadFile(output);
  ASSERT_TRUE(out.ok());
  std::istringstream in(*out);
  std::string line;
  size_t i = 0;
  for (; std::getline(in, line); ++i) {
    ASSERT_LT(i, lines.size());
    const json j = json::parse(line);
    const json& comp = j["completions"][0];
    const auto ids = comp["token_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(ids, (*want)[i].tokens) << "line " << i;
    // The decoded bytes, U+FFFD for each that is not UTF-8 (a random model splits characters).
    const std::string decoded = *text->tokenizer->Decode(ids, /*skip_special=*/true);
    EXPECT_EQ(comp["text"].get<std::string>(),
              json::parse(json(decoded).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>());
    EXPECT_EQ(comp["finish_reason"], (*want)[i].finish_reason);
    if (i == 1) {
      EXPECT_EQ(j["id"], 7);
    }
  }
  EXPECT_EQ(i, lines.size());

  v1::JobSpec stop = *s;
  stop.mutable_generate()->add_stop("Hello world");
  job = RunJob(c, stop);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("generate.stop[0]: 'Hello world' is "));
  EXPECT_THAT(job.reason(), HasSubstr("a stop string must be one token"));
  // A conversation needs a chat template: with the byte tokenizer the job fails at its line.
  v1::JobSpec byte_chat = *s;
  byte_chat.mutable_model()->set_tokenizer("byte");
  job = RunJob(c, byte_chat);
  EXPECT_EQ(job.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(job.reason(), HasSubstr("chat.jsonl:2: \"messages\" needs a chat template"));
  EXPECT_EQ(*ReadFile(output), *out);  // failed jobs leave the output as it was
}

// The text path end to end, through real daemons: an sft job on conversations (JSONL
// {"messages"}: the loss on the assistant turns, through the model directory's tokenizer
// and chat template) exports a Hugging Face directory — which carries the tokenizer
// files — and a generate job on that directory answers new conversations as taught,
// stopping at the end-of-turn token.
TEST(GenerateJob, SftOnConversationsThenChatWithTheExport) {
  Cluster c({.agents = 1, .cpu_slots = 2});
  ASSERT_TRUE(c.StartController().ok());
  ASSERT_TRUE(c.StartAgent(0).ok());
  ASSERT_TRUE(c.WaitNodes(1, 20000).ok());
  const std::string hf = c.dir() + "/base";
  ASSERT_TRUE(WriteHfModelDir(hf, TinyTextModel(64, 128), 3, 0.02f).ok());
  // The lesson: whatever the user asks about a colour, the assistant names its opposite.
  const std::vector<std::pair<std::string, std::string>> pairs = {{"black", "white"}, {"white", "black"}, {"red", "green"},
                                                                  {"green", "red"}, {"blue", "orange"}, {"orange", "blue"}};
  const std::string data = c.dir() + "/chat-sft.jsonl";
  {
    std::ofstream f(data);
    for (const auto& [a, b] : pairs)
      f << json{{"messages", {{{"role", "user"}, {"content", "Opposite of " + a + "?"}}, {{"role", "assistant"}, {"content", b}}}}}.dump()
        << "\n";
  }
  auto sft = ParseJobSpecYaml(absl::StrCat(
      "name: chat-sft\nkind: sft\ncollective_timeout_s: 30\ngroups:\n  - {name: actor, devices: 2, layout: {dp: 2}}\n"
      "model: {hf_dir: ", hf, ", seq_len: 64, global_batch: 6, micro_batch: 3}\n"
      "train: {steps: 60, lr: 0.003, warmup_steps: 5, data: {kind: jsonl, path: ", data, "}, export_hf: ", c.dir(), "/tuned}\n"));
  ASSERT_TRUE(sft.ok()) << sft.status();
  ASSERT_TRUE(NormalizeAndValidateJobSpec(*sft).ok());
  v1::Job job = RunJob(c, *sft);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(ReadFile(c.dir() + "/tuned/" + f).ok()) << f;

  const std::string input = c.dir() + "/ask.jsonl", output = c.dir() + "/answers.jsonl";
  {
    std::ofstream f(input);
    for (const auto& [a, b] : pairs) f << json{{"messages", {{{"role", "user"}, {"content", "Opposite of " + a + "?"}}}}}.dump() << "\n";
  }
  auto gen = ParseJobSpecYaml(absl::StrCat(
      "name: chat-gen\nkind: generate\ncollective_timeout_s: 30\ngroups:\n  - {name: rollout, devices: 1}\n"
      "model: {hf_dir: ", c.dir(), "/tuned}\ngenerate: {input: ", input, ", output: ", output, ", max_new_tokens: 8, temperature: 0}\n"));
  ASSERT_TRUE(gen.ok()) << gen.status();
  ASSERT_TRUE(NormalizeAndValidateJobSpec(*gen).ok());
  job = RunJob(c, *gen);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  std::istringstream in(*ReadFile(output));
  std::string line;
  int right = 0, stopped = 0, n = 0;
  for (; std::getline(in, line); ++n) {
    const json comp = json::parse(line)["completions"][0];
    right += comp["text"] == pairs[n].second;
    stopped += comp["finish_reason"] == "stop";
  }
  EXPECT_EQ(n, 6);
  EXPECT_EQ(right, 6) << *ReadFile(output);
  EXPECT_EQ(stopped, 6);  // at <|eot_id|>, the template's end of turn that SFT taught
}

// Each family of tests/integration/hf_dir.h (Llama 3.2's llama3 RoPE scaling, Qwen2.5's QKV
// bias and YaRN, Qwen3's q/k norm with its one KV head replicated over the two TP ranks)
// through real daemons at tensor parallelism 2: an sft job from the family's directory
// learns the colour opposites and exports a directory of the same family (config.json read
// back equal in what sets the family apart), and a generate job on that export, at TP 2,
// writes for every conversation the tokens this process's engine (one rank) generates
// from the export, stopping at the family's end-of-turn token.
class FamilyJobs : public ::testing::TestWithParam<HfFamily> {};

TEST_P(FamilyJobs, SftAtTp2ThenGenerateFromTheExport) {
  const HfFamily& fam = GetParam();
  Cluster c({.agents = 1, .cpu_slots = 2});
  ASSERT_TRUE(c.StartController().ok());
  ASSERT_TRUE(c.StartAgent(0).ok());
  ASSERT_TRUE(c.WaitNodes(1, 20000).ok());
  const std::string hf = c.dir() + "/base", tuned = c.dir() + "/tuned";
  ASSERT_TRUE(WriteHfModelDir(hf, fam.config, 3, 0.02f, fam.tokenizer).ok());
  const std::vector<std::pair<std::string, std::string>> pairs = {{"black", "white"}, {"white", "black"}, {"red", "green"},
                                                                  {"green", "red"}, {"blue", "orange"}, {"orange", "blue"}};
  auto ask = [](const std::string& colour) {
    return json{{{"role", "user"}, {"content", "Opposite of " + colour + "?"}}};
  };
  const std::string data = c.dir() + "/chat-sft.jsonl", input = c.dir() + "/ask.jsonl", output = c.dir() + "/answers.jsonl";
  {
    std::ofstream f(data), g(input);
    for (const auto& [a, b] : pairs) {
      json messages = ask(a);
      messages.push_back({{"role", "assistant"}, {"content", b}});
      f << json{{"messages", messages}}.dump() << "\n";
      g << json{{"messages", ask(a)}}.dump() << "\n";
    }
  }
  auto sft = ParseJobSpecYaml(absl::StrCat(
      "name: sft-", fam.name, "\nkind: sft\ncollective_timeout_s: 30\ngroups:\n  - {name: actor, devices: 2, layout: {tp: 2}}\n"
      "model: {hf_dir: ", hf, ", seq_len: 128, global_batch: 6, micro_batch: 3}\n"
      "train: {steps: 80, lr: 0.003, warmup_steps: 5, data: {kind: jsonl, path: ", data, "}, export_hf: ", tuned, "}\n"));
  ASSERT_TRUE(sft.ok()) << sft.status();
  ASSERT_TRUE(NormalizeAndValidateJobSpec(*sft).ok());
  v1::Job job = RunJob(c, *sft);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();
  auto exported = model::ReadHfConfig(tuned);
  ASSERT_TRUE(exported.ok()) << exported.status();
  const model::LlamaConfig& want = fam.config;
  EXPECT_EQ(exported->qkv_bias, want.qkv_bias);
  EXPECT_EQ(exported->qk_norm, want.qk_norm);
  EXPECT_EQ(exported->HeadDim(), want.HeadDim());
  EXPECT_EQ(exported->kv_heads, want.kv_heads);
  EXPECT_EQ(exported->tie_embeddings, want.tie_embeddings);
  EXPECT_EQ(exported->rope_base, want.rope_base);
  EXPECT_EQ(exported->rope_scaling.type, want.rope_scaling.type);
  EXPECT_EQ(exported->rope_scaling.factor, want.rope_scaling.factor);
  EXPECT_EQ(exported->rope_scaling.original_max_positions, want.rope_scaling.original_max_positions);

  auto gen = ParseJobSpecYaml(absl::StrCat(
      "name: gen-", fam.name, "\nkind: generate\ncollective_timeout_s: 30\ngroups:\n  - {name: rollout, devices: 2, layout: {tp: 2}}\n"
      "model: {hf_dir: ", tuned, "}\ngenerate: {input: ", input, ", output: ", output, ", max_new_tokens: 8, temperature: 0}\n"));
  ASSERT_TRUE(gen.ok()) << gen.status();
  ASSERT_TRUE(NormalizeAndValidateJobSpec(*gen).ok());
  job = RunJob(c, *gen);
  ASSERT_EQ(job.state(), v1::JOB_STATE_SUCCEEDED) << job.reason();

  // This process's engine on the export, one rank, fed the chat template's encodings.
  auto text = tokenizer::LoadModelText(tuned);
  ASSERT_TRUE(text.ok()) << text.status();
  ASSERT_TRUE(text->chat.has_value());
  ASSERT_FALSE(text->eos_ids.empty());
  auto be = runtime::MakeCpuBackend();
  auto m = model::Llama::Create(*exported, be.get());
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE(checkpoint::ImportHf(tuned, **m).ok());
  engine::RolloutOptions o;
  o.num_blocks = 64;
  auto e = engine::RolloutEngine::Create(m->get(), o);
  ASSERT_TRUE(e.ok()) << e.status();
  std::vector<engine::GenerationRequest> reqs;
  for (const auto& [a, b] : pairs) {
    auto prompt = text->chat->Apply(nlohmann::ordered_json::parse(ask(a).dump()), true);
    ASSERT_TRUE(prompt.ok()) << prompt.status();
    engine::GenerationRequest r;
    r.prompt = *text->tokenizer->Encode(*prompt, false);
    r.params.max_new_tokens = 8, r.params.temperature = 0, r.params.stop_tokens = text->eos_ids;
    reqs.push_back(r);
  }
  auto reference = (*e)->Generate(reqs);
  ASSERT_TRUE(reference.ok()) << reference.status();

  std::istringstream in(*ReadFile(output));
  std::string line;
  int right = 0, stopped = 0, n = 0;
  for (; std::getline(in, line); ++n) {
    ASSERT_LT(n, 6);
    const json comp = json::parse(line)["completions"][0];
    EXPECT_EQ(comp["token_ids"].get<std::vector<int32_t>>(), (*reference)[n].tokens) << "line " << n;
    right += comp["text"] == pairs[n].second;
    stopped += comp["finish_reason"] == "stop";
  }
  EXPECT_EQ(n, 6);
  EXPECT_EQ(right, 6) << *ReadFile(output);
  EXPECT_EQ(stopped, 6);
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyJobs, ::testing::ValuesIn(HfFamilies()),
                         [](const ::testing::TestParamInfo<HfFamily>& i) { return i.param.name; });

}  // namespace
}  // namespace tessera::testing
