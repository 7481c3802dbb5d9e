// The tokenizer.json BPE tokenizers (GPT-2, Llama-3 and Qwen2 kinds; fixtures made by
// gen_fixtures.py) against a Python reference that splits with the `regex` engine and
// merges with GPT-2's original loop: every id equal; decoding gives the text back;
// what a tokenizer.json asks for that is not supported is refused by name.
#include "worker/tokenizer/tokenizer.h"

#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "gtest/gtest.h"
#include "common/util.h"

namespace tessera::tokenizer {
namespace {

std::string Data(const std::string& name) { return std::string(TESSERA_SOURCE_DIR) + "/tests/worker/tokenizer/data/" + name; }

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

std::map<std::string, std::unique_ptr<Tokenizer>> LoadAll() {
  std::map<std::string, std::unique_ptr<Tokenizer>> out;
  for (const char* kind : {"gpt2", "llama3", "qwen2"}) {
    auto t = LoadHfTokenizer(Data(kind));
    EXPECT_TRUE(t.ok()) << t.status();
    if (t.ok()) out[kind] = std::move(*t);
  }
  return out;
}

TEST(HfBpe, EqualsTheReference) {
  auto toks = LoadAll();
  ASSERT_EQ(toks.size(), 3u);
  const auto cases = ReadJson(Data("bpe_cases.json"));
  ASSERT_GT(cases.size(), 900u);
  for (const auto& c : cases) {
    const Tokenizer& t = *toks.at(c["tokenizer"].get<std::string>());
    const std::string text = c["text"];
    auto ids = t.Encode(text, c["add_special"].get<bool>());
    ASSERT_TRUE(ids.ok()) << ids.status();
    EXPECT_EQ(*ids, c["ids"].get<std::vector<int32_t>>()) << c["tokenizer"] << " on " << nlohmann::json(text).dump();
  }
}

TEST(HfBpe, DecodeGivesTheTextBack) {
  auto toks = LoadAll();
  std::mt19937 rng(3);
  for (auto& [kind, t] : toks) {
    for (const std::string& text : {std::string("Hello, world! 日本語 😀"), std::string("<|im_start|>x<|im_end|>"),
                                   std::string("\xff\xfe raw bytes \xc3")}) {
      auto ids = t->Encode(text);
      ASSERT_TRUE(ids.ok());
      auto back = t->Decode(*ids);
      ASSERT_TRUE(back.ok());
      EXPECT_EQ(*back, text) << kind;  // (already NFC for Qwen2)
    }
    for (int trial = 0; trial < 200; ++trial) {  // random bytes, UTF-8 or not
      std::string text(rng() % 40, '\0');
      for (char& ch : text) ch = static_cast<char>(rng() % 2 ? 'a' + rng() % 26 : rng() % 256);
      auto ids = t->Encode(text);
      ASSERT_TRUE(ids.ok());
      for (int32_t id : *ids) ASSERT_LT(id, t->vocab_size());
      if (kind == "qwen2") continue;  // NFC may recompose
      EXPECT_EQ(*t->Decode(*ids), text);
    }
  }
}

TEST(HfBpe, SpecialTokens) {
  auto toks = LoadAll();
  const Tokenizer& llama = *toks.at("llama3");
  const int32_t bos = *llama.SpecialId("<|begin_of_text|>"), eot = *llama.SpecialId("<|eot_id|>");
  EXPECT_TRUE(llama.IsSpecial(eot));
  auto ids = *llama.Encode("Hi<|eot_id|>", /*add_special=*/true);
  EXPECT_EQ(ids.front(), bos);
  EXPECT_EQ(ids.back(), eot);
  EXPECT_EQ(*llama.Decode(ids), "<|begin_of_text|>Hi<|eot_id|>");
  EXPECT_EQ(*llama.Decode(ids, /*skip_special=*/true), "Hi");
  EXPECT_FALSE(llama.Decode({static_cast<int32_t>(llama.vocab_size())}).ok());
  EXPECT_FALSE(llama.SpecialId("<|nope|>").has_value());
  // Qwen2 has no BOS: add_special adds nothing.
  const Tokenizer& qwen = *toks.at("qwen2");
  EXPECT_EQ(*qwen.Encode("Hi", true), *qwen.Encode("Hi", false));
}

TEST(HfBpe, ByteTokenizerIsTheIdentityOnBytes) {
  auto t = MakeByteTokenizer();
  EXPECT_EQ(*t->Encode("a\xff"), (std::vector<int32_t>{'a', 255}));
  EXPECT_EQ(*t->Decode({'h', 'i'}), "hi");
  EXPECT_FALSE(t->Decode({256}).ok());
  EXPECT_EQ(t->vocab_size(), 256);
}

// A copy of the Llama-3 fixture with one field changed must load or be refused naming it.
std::string Mutated(const std::function<void(nlohmann::json&)>& change) {
  auto j = ReadJson(Data("llama3/tokenizer.json"));
  change(j);
  const std::string path = testing::TempDir() + "/mutated-tokenizer.json";
  EXPECT_TRUE(WriteFileAtomic(path, j.dump()).ok());
  auto t = LoadHfTokenizer(path);
  return t.ok() ? "ok" : std::string(t.status().message());
}

TEST(HfBpe, RefusesWhatItCannotRead) {
  EXPECT_EQ(Mutated([](nlohmann::json&) {}), "ok");
  EXPECT_NE(Mutated([](nlohmann::json& j) { j["model"]["type"] = "WordPiece"; }).find("model.type WordPiece"), std::string::npos);
  EXPECT_NE(Mutated([](nlohmann::json& j) { j["model"]["byte_fallback"] = true; }).find("model.byte_fallback"), std::string::npos);
  EXPECT_NE(Mutated([](nlohmann::json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }).find("normalizer.type Lowercase"), std::string::npos);
  EXPECT_NE(Mutated([](nlohmann::json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+"; })
                .find("pre-tokenizer regex \\w+"), std::string::npos);
  EXPECT_NE(Mutated([](nlohmann::json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; }).find("pre_tokenizer.type Metaspace"), std::string::npos);
  EXPECT_NE(Mutated([](nlohmann::json& j) { j["model"]["merges"][3] = {"zz", "qq"}; }).find("model.merges[3]"), std::string::npos);
  EXPECT_NE(Mutated([](nlohmann::json& j) { j["model"]["vocab"].erase("A"); }).find("byte 65"), std::string::npos);
  EXPECT_NE(Mutated([](nlohmann::json& j) { j["model"]["vocab"]["A"] = "x"; }).find("model.vocab[\"A\"]"), std::string::npos);
  EXPECT_NE(Mutated([](nlohmann::json& j) { j["added_tokens"][0]["content"] = ""; }).find("added_tokens"), std::string::npos);
  EXPECT_NE(Mutated([](nlohmann::json& j) { j["decoder"] = {{"type", "WordPiece"}}; }).find("decoder.type WordPiece"), std::string::npos);
  auto missing = LoadHfTokenizer("/nonexistent/dir");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  const std::string garbage = testing::TempDir() + "/garbage.json";
  ASSERT_TRUE(WriteFileAtomic(garbage, "{not json").ok());
  EXPECT_NE(LoadHfTokenizer(garbage).status().message().find("not JSON"), std::string::npos);
}

}  // namespace
}  // namespace tessera::tokenizer
