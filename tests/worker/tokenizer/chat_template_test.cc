// Chat templates rendered by jinja.h against Jinja2 itself (gen_fixtures.py renders them
// the way transformers' apply_chat_template does): Llama-3, Qwen2, a Qwen2.5-shaped one
// with tools and tool calls, and one exercising the rest of the supported Jinja.
#include "worker/tokenizer/chat_template.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/util.h"
#include "worker/tokenizer/model_text.h"
#include "worker/tokenizer/tokenizer.h"

namespace tessera::tokenizer {
namespace {

using Json = nlohmann::ordered_json;

std::string Data(const std::string& name) { return std::string(TESSERA_SOURCE_DIR) + "/tests/worker/tokenizer/data/" + name; }

Json ReadJson(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return Json::parse(ss.str());
}

TEST(ChatTemplate, EqualsJinja2) {
  const Json all = ReadJson(Data("chat_cases.json"));
  ASSERT_GE(all["cases"].size(), 30u);
  for (const auto& c : all["cases"]) {
    const std::string name = c["template"];
    auto t = ChatTemplate::FromSource(all["templates"][name], c["bos_token"], c["eos_token"]);
    ASSERT_TRUE(t.ok()) << name << ": " << t.status();
    auto out = t->Apply(c["messages"], c["add_generation_prompt"], c.value("tools", Json()));
    if (c.contains("error")) {
      ASSERT_FALSE(out.ok()) << name;
      EXPECT_NE(out.status().message().find(c["error"].get<std::string>()), std::string::npos) << out.status();
    } else {
      ASSERT_TRUE(out.ok()) << name << ": " << out.status();
      EXPECT_EQ(*out, c["text"].get<std::string>()) << name << " on " << c["messages"].dump();
    }
  }
}

TEST(ChatTemplate, LoadsAModelDirectoryAndTokenizesTheConversation) {
  auto t = ChatTemplate::Load(Data("llama3"));
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->bos_token(), "<|begin_of_text|>");
  EXPECT_EQ(t->eos_token(), "<|eot_id|>");
  const Json messages = Json::parse(R"([{"role": "user", "content": "Hi"}])");
  auto text = t->Apply(messages, true);
  ASSERT_TRUE(text.ok());
  auto tok = LoadHfTokenizer(Data("llama3"));
  ASSERT_TRUE(tok.ok());
  auto ids = (*tok)->Encode(*text);
  ASSERT_TRUE(ids.ok());
  // BOS from the template (not added again), the header tokens as single special ids.
  EXPECT_EQ(ids->front(), *(*tok)->SpecialId("<|begin_of_text|>"));
  EXPECT_EQ(std::count(ids->begin(), ids->end(), *(*tok)->SpecialId("<|start_header_id|>")), 2);
  EXPECT_EQ(*(*tok)->Decode(*ids), *text);
  auto qwen = ChatTemplate::Load(Data("qwen2"));
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(qwen->eos_token(), "<|im_end|>");
}

TEST(ChatTemplate, RefusesBadInputByName) {
  auto t = ChatTemplate::Load(Data("qwen2"));
  ASSERT_TRUE(t.ok());
  EXPECT_NE(t->Apply(Json::array(), false).status().message().find("messages"), std::string::npos);
  EXPECT_NE(t->Apply(Json::parse(R"([{"content": "x"}])"), false).status().message().find("messages[0]"), std::string::npos);
  EXPECT_NE(t->Apply(Json::parse(R"([{"role": "user", "content": 5}])"), false).status().message().find("messages[0].content"),
            std::string::npos);
  // The template's own check (Qwen2.5 raises on an unknown role).
  EXPECT_NE(t->Apply(Json::parse(R"([{"role": "robot", "content": "x"}])"), false).status().message().find("unknown role robot"),
            std::string::npos);
  for (const char* bad : {"{% if x %}never closed", "{{ 1 + }}", "{% macro m() %}{% endmacro %}", "{{ x | frobnicate }}x",
                          "{% for a in %}{% endfor %}", "{{ 'open"}) {
    auto p = ChatTemplate::FromSource(bad, "", "");
    if (p.ok()) {  // unknown filters are found when they run
      auto r = p->Apply(Json::parse(R"([{"role": "user", "content": "x"}])"), false);
      EXPECT_FALSE(r.ok()) << bad;
      EXPECT_NE(r.status().message().find("frobnicate"), std::string::npos) << r.status();
    } else {
      EXPECT_NE(p.status().message().find("template"), std::string::npos) << p.status();
    }
  }
  EXPECT_EQ(ChatTemplate::Load("/nonexistent").status().code(), absl::StatusCode::kNotFound);
  // Found by fuzz/chat_template_fuzz.cc: hostile templates are errors, not crashes.
  const Json one = Json::parse(R"([{"role": "user", "content": "x"}])");
  auto render = [&](const std::string& source) -> std::string {
    auto t = ChatTemplate::FromSource(source, "", "");
    if (!t.ok()) return std::string(t.status().message());
    auto r = t->Apply(one, false);
    return r.ok() ? *r : std::string(r.status().message());
  };
  EXPECT_NE(render("{{ 123456789012345678901234567890 }}").find("out of range"), std::string::npos);
  EXPECT_NE(render("{{ '\\uZZZZ' }}").find("four hex digits"), std::string::npos);
  EXPECT_NE(render("{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}").find("nested deeper"), std::string::npos);
  EXPECT_NE(render("{{ " + std::string(500, '-') + "1 }}").find("too many signs"), std::string::npos);
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += "{% if true %}";
  EXPECT_NE(render(deep).find("nested deeper than 64"), std::string::npos);
  EXPECT_NE(render("{{ 'abcdefgh' * 100000000 }}").find("16 MiB"), std::string::npos);
  EXPECT_NE(render("{% for i in range(100000000) %}x{% endfor %}").find("a million"), std::string::npos);
  EXPECT_EQ(render("{{ 2 ** 10 }} {{ -7 // 2 }}"), "1024 -4");
  for (const char* past : {"{{ 12345678910 * 1000000000 }}", "{{ 9223372036854775807 + 1 }}", "{{ 2 ** 64 }}",
                           "{{ (-9223372036854775807 - 1) // -1 }}", "{{ -(-9223372036854775807 - 1) }}"})
    EXPECT_NE(render(past).find("past 64 bits"), std::string::npos) << past;
  EXPECT_EQ(render("{{ 1e300 | int > 0 }}"), "True");
}

// A model directory's text side: tokenizer, template, and the EOS ids generation stops at
// (tokenizer_config.json's eos_token and generation_config.json's eos_token_id).
TEST(ModelText, EosFromBothConfigs) {
  const std::string dir = ::testing::TempDir() + "/model-text-" + std::to_string(getpid());
  ASSERT_TRUE(MakeDirs(dir, 0755).ok());
  unlink((dir + "/generation_config.json").c_str());
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    ASSERT_TRUE(WriteFileAtomic(dir + "/" + f, *ReadFile(Data(std::string("llama3/") + f))).ok());
  auto t = LoadModelText(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  const int32_t eot = *t->tokenizer->SpecialId("<|eot_id|>"), eos = *t->tokenizer->SpecialId("<|end_of_text|>");
  EXPECT_EQ(t->eos_ids, std::vector<int32_t>{eot});
  EXPECT_EQ(t->eos_id, eot);
  EXPECT_TRUE(t->chat.has_value());
  ASSERT_TRUE(WriteFileAtomic(dir + "/generation_config.json", "{\"eos_token_id\": [" + std::to_string(eos) + ", " +
                                                                   std::to_string(eot) + "]}").ok());
  t = LoadModelText(dir + "/tokenizer.json");  // a file: its directory's configs
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->eos_ids, (std::vector<int32_t>{std::min(eos, eot), std::max(eos, eot)}));
  EXPECT_FALSE(t->temperature.has_value());  // no sampling keys: the job's defaults apply
  EXPECT_FALSE(t->top_k.has_value());
  // Default sampling as published (Qwen3's generation_config.json); a value out of range
  // is refused naming the file and the key.
  ASSERT_TRUE(WriteFileAtomic(dir + "/generation_config.json",
                              "{\"do_sample\": true, \"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95, "
                              "\"eos_token_id\": " + std::to_string(eos) + "}").ok());
  t = LoadModelText(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->temperature, 0.6);
  EXPECT_EQ(t->top_k, 20);
  EXPECT_EQ(t->top_p, 0.95);
  ASSERT_TRUE(WriteFileAtomic(dir + "/generation_config.json", "{\"top_p\": 0}").ok());
  EXPECT_THAT(std::string(LoadModelText(dir).status().message()),
              ::testing::HasSubstr("generation_config.json: top_p must be a number in (0, 1], got 0"));
  ASSERT_TRUE(WriteFileAtomic(dir + "/generation_config.json", "{\"top_k\": 2.5}").ok());
  EXPECT_THAT(std::string(LoadModelText(dir).status().message()), ::testing::HasSubstr("top_k must be an integer"));
  auto byte = LoadModelText("byte");
  ASSERT_TRUE(byte.ok());
  EXPECT_EQ(byte->tokenizer->vocab_size(), 256);
  EXPECT_FALSE(byte->chat.has_value());
  EXPECT_TRUE(byte->eos_ids.empty());
  EXPECT_FALSE(byte->eos_id.has_value());
  EXPECT_EQ(LoadModelText("/nonexistent").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tessera::tokenizer
