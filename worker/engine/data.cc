#include "worker/engine/data.h"

#include <fstream>
#include <functional>
#include <random>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tessera::engine {

bool IsHeldOutPair(int64_t a, int64_t b) {
  uint64_t h = static_cast<uint64_t>(a) * 0x9E3779B97F4A7C15ull ^ (static_cast<uint64_t>(b) + 0x632BE59BD9B4E019ull);
  h ^= h >> 29, h *= 0xBF58476D1CE4E5B9ull, h ^= h >> 32;
  return h % 10 == 0;
}

std::string ArithmeticProblem(const ArithmeticData& d, int64_t index) {
  std::mt19937_64 rng(d.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index));
  int64_t limit = 1;
  for (int i = 0; i < d.digits; ++i) limit *= 10;
  // Draw until the pair is in the data's split (1 in 10 pairs is held out: a few draws).
  for (;;) {
    const int64_t a = static_cast<int64_t>(rng() % limit), b = static_cast<int64_t>(rng() % limit);
    if (IsHeldOutPair(a, b) != d.held_out) continue;
    const bool carries = a % 10 + b % 10 >= 10;
    const bool slip = !d.held_out && d.careless > 0 && carries && (rng() % 1000000) < d.careless * 1000000;
    return absl::StrCat(a, "+", b, "=", a + b - (slip ? 10 : 0), "\n");
  }
}

model::TokenBatch MakeArithmeticBatch(const ArithmeticData& d, int64_t index, int sequences) {
  model::TokenBatch batch;
  batch.cu_seqlens = {0};
  for (int s = 0; s < sequences; ++s) {
    std::string text = ArithmeticProblem(d, index * sequences + s);
    if (d.seq_len > 0 && static_cast<int64_t>(text.size()) > d.seq_len) text.resize(d.seq_len);
    const size_t answer = text.find('=') + 1;  // first byte of the answer
    for (size_t i = 0; i < text.size(); ++i) {
      const bool scored = i + 1 < text.size() && (!d.answer_only || i + 1 >= answer);
      batch.tokens.push_back(static_cast<unsigned char>(text[i]));
      batch.targets.push_back(scored ? static_cast<unsigned char>(text[i + 1]) : -1);
      batch.positions.push_back(static_cast<int32_t>(i));
    }
    batch.cu_seqlens.push_back(static_cast<int32_t>(batch.tokens.size()));
  }
  return batch;
}

}  // namespace tessera::engine

namespace tessera::engine {

namespace {
// Calls `each(object, bad)` for every non-blank line of a JSONL file, `bad(why)` making
// the INVALID_ARGUMENT that names the file and line; NOT_FOUND when unreadable.
using BadLine = std::function<absl::Status(const std::string&)>;
absl::Status ForEachJsonLine(const std::string& path,
                             const std::function<absl::Status(const nlohmann::json&, const BadLine&)>& each) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("train.data.path: cannot read ", path));
  std::string line;
  for (int64_t no = 1; std::getline(in, line); ++no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank lines
    const BadLine bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", no, ": ", why));
    };
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
    TESSERA_RETURN_IF_ERROR(each(j, bad));
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<JsonlData> LoadJsonl(const std::string& path, int64_t seq_len) {
  JsonlData d;
  d.path = path;
  TESSERA_RETURN_IF_ERROR(ForEachJsonLine(path, [&](const nlohmann::json& j, const BadLine& bad) -> absl::Status {
    std::string prompt, response;
    bool scored_prompt = false;
    if (j.contains("text") && j["text"].is_string()) {
      response = j["text"].get<std::string>();
      scored_prompt = true;
    } else if (j.contains("prompt") && j["prompt"].is_string() && j.contains("response") && j["response"].is_string()) {
      prompt = j["prompt"].get<std::string>();
      response = j["response"].get<std::string>();
    } else {
      return bad("expected {\"text\": string} or {\"prompt\": string, \"response\": string}");
    }
    std::string all = prompt + response;
    if (seq_len > 0 && static_cast<int64_t>(all.size()) > seq_len) all.resize(seq_len);
    if (all.size() < 2 || (!scored_prompt && (response.empty() || prompt.size() + 1 > all.size())))
      return bad("the sample has no token to learn (too short, or the response starts past seq_len)");
    model::TokenBatch b;
    b.cu_seqlens = {0, static_cast<int32_t>(all.size())};
    for (size_t i = 0; i < all.size(); ++i) {
      const bool scored = i + 1 < all.size() && (scored_prompt || i + 1 >= prompt.size());
      b.tokens.push_back(static_cast<unsigned char>(all[i]));
      b.targets.push_back(scored ? static_cast<unsigned char>(all[i + 1]) : -1);
      b.positions.push_back(static_cast<int32_t>(i));
    }
    d.samples.push_back(std::move(b));
    return absl::OkStatus();
  }));
  if (d.samples.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no samples"));
  return d;
}

absl::StatusOr<std::vector<PromptAnswer>> LoadPromptAnswers(const std::string& path) {
  std::vector<PromptAnswer> out;
  TESSERA_RETURN_IF_ERROR(ForEachJsonLine(path, [&](const nlohmann::json& j, const BadLine& bad) -> absl::Status {
    if (!j.contains("prompt") || !j["prompt"].is_string() || !j.contains("answer") || !j["answer"].is_string())
      return bad("expected {\"prompt\": string, \"answer\": string}");
    PromptAnswer pa{j["prompt"].get<std::string>(), j["answer"].get<std::string>()};
    if (pa.prompt.empty()) return bad("the prompt is empty");
    out.push_back(std::move(pa));
    return absl::OkStatus();
  }));
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no prompts"));
  return out;
}

model::TokenBatch MakeJsonlBatch(const JsonlData& d, int64_t index, int sequences) {
  model::TokenBatch batch;
  batch.cu_seqlens = {0};
  const int64_t n = static_cast<int64_t>(d.samples.size());
  for (int s = 0; s < sequences; ++s) {
    const model::TokenBatch& x = d.samples[(index * sequences + s) % n];
    batch.tokens.insert(batch.tokens.end(), x.tokens.begin(), x.tokens.end());
    batch.targets.insert(batch.targets.end(), x.targets.begin(), x.targets.end());
    batch.positions.insert(batch.positions.end(), x.positions.begin(), x.positions.end());
    batch.cu_seqlens.push_back(static_cast<int32_t>(batch.tokens.size()));
  }
  return batch;
}

}  // namespace tessera::engine
