// The built-in arithmetic data: deterministic per (seed, index), correct sums, packing,
// the seq_len cut and the SFT answer-only targets.
#include "worker/train/data.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>

#include <string>

#include "gtest/gtest.h"
#include "common/util.h"
#include "gmock/gmock.h"
#include "absl/strings/str_cat.h"

namespace tessera::engine {
namespace {

std::string Text(const model::TokenBatch& b, int seq) {
  std::string s;
  for (int i = b.cu_seqlens[seq]; i < b.cu_seqlens[seq + 1]; ++i) s.push_back(static_cast<char>(b.tokens[i]));
  return s;
}

TEST(ArithmeticData, ProblemsAreCorrectAndDeterministic) {
  ArithmeticData d{3, 7, 0, false};
  for (int i = 0; i < 50; ++i) {
    const std::string p = ArithmeticProblem(d, i);
    ASSERT_EQ(p, ArithmeticProblem(d, i));
    long a = 0, b = 0, c = 0;
    ASSERT_EQ(std::sscanf(p.c_str(), "%ld+%ld=%ld\n", &a, &b, &c), 3) << p;
    EXPECT_LT(a, 1000);
    EXPECT_LT(b, 1000);
    EXPECT_EQ(a + b, c) << p;
    EXPECT_EQ(p.back(), '\n');
  }
  EXPECT_NE(ArithmeticProblem(d, 0), ArithmeticProblem(ArithmeticData{3, 8, 0, false}, 0));
}

// The held-out split: about 1 in 10 operand pairs, never drawn for training, the only
// pairs drawn for held_out data — disjoint whatever the seeds.
TEST(ArithmeticData, HeldOutPairsAreNeverTrainingPairs) {
  int held = 0;
  for (int a = 0; a < 100; ++a)
    for (int b = 0; b < 100; ++b) held += IsHeldOutPair(a, b);
  EXPECT_GT(held, 800);
  EXPECT_LT(held, 1200);
  std::set<std::string> train, eval;
  for (int i = 0; i < 3000; ++i) {
    train.insert(ArithmeticProblem(ArithmeticData{2, 1, 0, false}, i));
    eval.insert(ArithmeticProblem(ArithmeticData{2, 999, 0, false, /*held_out=*/true}, i));
  }
  for (const std::string& p : eval) {
    long a = 0, b = 0;
    ASSERT_EQ(std::sscanf(p.c_str(), "%ld+%ld=", &a, &b), 2);
    EXPECT_TRUE(IsHeldOutPair(a, b)) << p;
    EXPECT_EQ(train.count(p), 0u) << p;
  }
  EXPECT_GT(eval.size(), 500u);  // the held-out split has ~1000 distinct problems
}

// The careless teacher drops the units carry in about `careless` of the problems that
// have one, and nowhere else; held-out problems keep their true sums.
TEST(ArithmeticData, CarelessTeacherDropsCarries) {
  ArithmeticData d{2, 3, 0, false};
  d.careless = 0.6;
  int carries = 0, dropped = 0;
  for (int i = 0; i < 4000; ++i) {
    long a = 0, b = 0, c = 0;
    const std::string p = ArithmeticProblem(d, i);
    ASSERT_EQ(std::sscanf(p.c_str(), "%ld+%ld=%ld\n", &a, &b, &c), 3) << p;
    const bool carry = a % 10 + b % 10 >= 10;
    if (!carry) {
      EXPECT_EQ(c, a + b) << p;
      continue;
    }
    ++carries;
    if (c != a + b) {
      EXPECT_EQ(c, a + b - 10) << p;
      ++dropped;
    }
  }
  EXPECT_GT(carries, 1500);
  EXPECT_NEAR(double(dropped) / carries, 0.6, 0.05);
  ArithmeticData held = d;
  held.held_out = true;
  for (int i = 0; i < 500; ++i) {
    long a = 0, b = 0, c = 0;
    ASSERT_EQ(std::sscanf(ArithmeticProblem(held, i).c_str(), "%ld+%ld=%ld\n", &a, &b, &c), 3);
    EXPECT_EQ(c, a + b);
  }
}

// The calculator teacher answers about `calculator` of the problems through a call,
// "a+b=(a+b)[c]c\n", always right; the observation "[c]" is never a target (the byte after
// "]" is), and the rest keep the careless teacher's answers.
TEST(ArithmeticData, CalculatorTeacherCallsAndItsObservationIsNoTarget) {
  ArithmeticData d{2, 3, 0, /*answer_only=*/true};
  d.careless = 0.8, d.calculator = 0.25;
  int calls = 0;
  for (int i = 0; i < 2000; ++i) {
    const std::string p = ArithmeticProblem(d, i);
    long a = 0, b = 0, a2 = 0, b2 = 0, c = 0, c2 = 0;
    if (std::sscanf(p.c_str(), "%ld+%ld=(%ld+%ld)[%ld]%ld\n", &a, &b, &a2, &b2, &c, &c2) == 6) {
      ++calls;
      EXPECT_EQ(c, a + b);
      EXPECT_EQ(p, absl::StrCat(a, "+", b, "=(", a, "+", b, ")[", a + b, "]", a + b, "\n"));
    } else {
      ASSERT_EQ(std::sscanf(p.c_str(), "%ld+%ld=%ld\n", &a, &b, &c), 3) << p;
    }
  }
  EXPECT_NEAR(calls / 2000.0, 0.25, 0.03);
  for (int i = 0; i < 50; ++i) {
    const std::string p = ArithmeticProblem(d, i);
    const size_t open = p.find('[');
    if (open == std::string::npos) continue;
    const size_t close = p.find(']');
    const auto batch = MakeArithmeticBatch(d, i, 1);
    for (size_t t = 0; t + 1 < p.size(); ++t) {
      const bool observed = t + 1 >= open && t + 1 <= close;
      const bool answer = t + 1 > p.find('=');
      EXPECT_EQ(batch.targets[t], observed || !answer ? -1 : static_cast<unsigned char>(p[t + 1])) << p << " at " << t;
    }
  }
}

TEST(ArithmeticData, PacksSequencesWithNextByteTargets) {
  ArithmeticData d{2, 1, 0, false};
  const auto b = MakeArithmeticBatch(d, 5, 3);
  ASSERT_EQ(b.cu_seqlens.size(), 4u);
  ASSERT_TRUE(b.Validate(256).ok());
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(Text(b, s), ArithmeticProblem(d, 5 * 3 + s));
    const int begin = b.cu_seqlens[s], end = b.cu_seqlens[s + 1];
    for (int i = begin; i < end; ++i) {
      EXPECT_EQ(b.positions[i], i - begin);
      EXPECT_EQ(b.targets[i], i + 1 < end ? b.tokens[i + 1] : -1);
    }
  }
  ArithmeticData cut{2, 1, 4, false};
  const auto c = MakeArithmeticBatch(cut, 5, 3);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(c.cu_seqlens[s + 1] - c.cu_seqlens[s], 4);
}

TEST(ArithmeticData, AnswerOnlyScoresTheAnswer) {
  ArithmeticData d{3, 2, 0, true};
  const auto b = MakeArithmeticBatch(d, 0, 2);
  for (int s = 0; s < 2; ++s) {
    const std::string text = Text(b, s);
    const int eq = static_cast<int>(text.find('=')), begin = b.cu_seqlens[s];
    for (int i = 0; i < static_cast<int>(text.size()); ++i) {
      const int32_t want = (i >= eq && i + 1 < static_cast<int>(text.size())) ? text[i + 1] : -1;
      EXPECT_EQ(b.targets[begin + i], want) << text << " at " << i;
    }
  }
}

std::string WriteTemp(const std::string& text) {
  const std::string p = absl::StrCat(::testing::TempDir(), "/data-", getpid(), "-", RandomHex(4), ".jsonl");
  std::ofstream(p) << text;
  return p;
}

TEST(JsonlData, TextAndPromptResponseAsByteTokens) {
  const std::string p = WriteTemp(
      "{\"text\": \"abc\"}\n"
      "\n"
      "{\"prompt\": \"1+1=\", \"response\": \"2\\n\"}\n"
      "{\"text\": \"a much longer text that is cut\"}\n");
  auto d = LoadJsonl(p, 8);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->samples.size(), 3u);
  EXPECT_EQ(d->samples[0].tokens, (std::vector<int32_t>{'a', 'b', 'c'}));
  EXPECT_EQ(d->samples[0].targets, (std::vector<int32_t>{'b', 'c', -1}));
  // SFT: only the response's bytes are predicted ("2" from "=", "\n" from "2").
  EXPECT_EQ(d->samples[1].targets, (std::vector<int32_t>{-1, -1, -1, '2', '\n', -1}));
  EXPECT_EQ(d->samples[2].tokens.size(), 8u);  // cut to seq_len
  // Batches wrap round the file and are a pure function of their index.
  auto b = MakeJsonlBatch(*d, 1, 2);  // samples 2 and 0
  EXPECT_EQ(b.cu_seqlens, (std::vector<int32_t>{0, 8, 11}));
  EXPECT_EQ(b.positions[8], 0);
  EXPECT_EQ(MakeJsonlBatch(*d, 1, 2).tokens, b.tokens);
}

TEST(JsonlData, BadLinesNameTheFileAndLine) {
  struct Case {
    const char* text;
    const char* expect;
  } cases[] = {
      {"{\"text\": \"ok\"}\nnot json\n", ":2: not a JSON object"},
      {"{\"txt\": \"x\"}\n", ":1: expected {\"text\": string}"},
      {"{\"prompt\": \"p\"}\n", ":1: expected"},
      {"{\"text\": \"x\"}\n", ":1: the sample has no token to learn"},
      {"{\"prompt\": \"a long prompt\", \"response\": \"r\"}\n", "the response starts past seq_len"},
      {"\n\n", "no samples"},
  };
  for (const auto& c : cases) {
    const std::string p = WriteTemp(c.text);
    auto d = LoadJsonl(p, 6);
    ASSERT_FALSE(d.ok()) << c.text;
    EXPECT_THAT(std::string(d.status().message()), ::testing::HasSubstr(c.expect)) << c.text;
    EXPECT_THAT(std::string(d.status().message()), ::testing::HasSubstr(p));
  }
  EXPECT_EQ(LoadJsonl("/nonexistent/x.jsonl", 6).status().code(), absl::StatusCode::kNotFound);
}

// Through a model's tokenizer (the Llama-3-style fixture of tests/worker/tokenizer):
// BOS / EOS where a Hugging Face SFT recipe puts them, and the loss exactly on what the
// model should learn to write — the response and its EOS, or each assistant turn of a
// conversation with its end-of-turn token.
TEST(JsonlData, ThroughAModelsTokenizerAndChatTemplate) {
  auto text = tokenizer::LoadModelText(std::string(TESSERA_SOURCE_DIR) + "/tests/worker/tokenizer/data/llama3");
  ASSERT_TRUE(text.ok()) << text.status();
  const tokenizer::Tokenizer& tok = *text->tokenizer;
  const int32_t bos = *tok.SpecialId("<|begin_of_text|>"), eot = *tok.SpecialId("<|eot_id|>");
  ASSERT_EQ(text->eos_id, eot);
  const std::string p = WriteTemp(
      "{\"text\": \"Hello world\"}\n"
      "{\"prompt\": \"What is 2+2?\", \"response\": \" 4\"}\n"
      "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"},"
      " {\"role\": \"assistant\", \"content\": \"Hello!\"}, {\"role\": \"user\", \"content\": \"2+2?\"},"
      " {\"role\": \"assistant\", \"content\": \"4\"}]}\n");
  auto d = LoadJsonl(p, 0, *text);
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_EQ(d->samples.size(), 3u);
  // The ids a target predicts, decoded, and the whole sample decoded.
  auto learned = [&](const model::TokenBatch& b) {
    std::vector<int32_t> ids;
    for (int32_t t : b.targets) if (t >= 0) ids.push_back(t);
    return *tok.Decode(ids);
  };
  const auto& t = d->samples[0];
  EXPECT_EQ(t.tokens.front(), bos);
  EXPECT_EQ(t.tokens.back(), eot);
  EXPECT_EQ(*tok.Decode(t.tokens), "<|begin_of_text|>Hello world<|eot_id|>");
  EXPECT_EQ(learned(t), "Hello world<|eot_id|>");  // everything after BOS
  const auto& pr = d->samples[1];
  EXPECT_EQ(*tok.Decode(pr.tokens), "<|begin_of_text|>What is 2+2? 4<|eot_id|>");
  EXPECT_EQ(learned(pr), " 4<|eot_id|>");
  const auto& chat = d->samples[2];
  EXPECT_EQ(*tok.Decode(chat.tokens),
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
            "Hello!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n4<|eot_id|>");
  EXPECT_EQ(learned(chat), "Hello!<|eot_id|>4<|eot_id|>");  // the two assistant turns only
  EXPECT_EQ(chat.tokens.size(), chat.targets.size());
  EXPECT_EQ(chat.cu_seqlens, (std::vector<int32_t>{0, static_cast<int32_t>(chat.tokens.size())}));

  struct Case {
    const char* line;
    const char* expect;
  } cases[] = {
      {"{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}]}\n", ":1: messages[0]: an assistant turn needs a turn before it"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}\n", ":1: messages: no assistant turn to learn"},
      {"{\"messages\": [{\"role\": \"user\", \"content\": 5}, {\"role\": \"assistant\", \"content\": \"x\"}]}\n",
       "messages[0].content: expected a string"},
      {"{\"messages\": []}\n", ":1: messages: expected a non-empty list"},
  };
  for (const auto& c : cases) {
    auto bad = LoadJsonl(WriteTemp(c.line), 0, *text);
    ASSERT_FALSE(bad.ok()) << c.line;
    EXPECT_THAT(std::string(bad.status().message()), ::testing::HasSubstr(c.expect));
  }
  // Conversations need a chat template: the byte tokenizer has none.
  auto bytes = LoadJsonl(p, 0);
  ASSERT_FALSE(bytes.ok());
  EXPECT_THAT(std::string(bytes.status().message()), ::testing::HasSubstr(":3: \"messages\" needs a chat template"));
  // A template whose text for a longer conversation does not extend the shorter one's
  // (here: the turns in reverse) cannot be split by turn.
  auto reversed = tokenizer::ChatTemplate::FromSource("{% for m in messages|reverse %}{{ m.content }}|{% endfor %}", "", "");
  ASSERT_TRUE(reversed.ok());
  tokenizer::ModelText odd{tokenizer::MakeByteTokenizer(), std::move(*reversed)};
  auto split = LoadJsonl(WriteTemp("{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, "
                                   "{\"role\": \"assistant\", \"content\": \"b\"}]}\n"), 0, odd);
  ASSERT_FALSE(split.ok());
  EXPECT_THAT(std::string(split.status().message()), ::testing::HasSubstr("messages[1]: the chat template's text"));
}

}  // namespace
}  // namespace tessera::engine
