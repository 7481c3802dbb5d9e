#include "worker/train/data.h"

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
    if (!d.held_out && d.calculator > 0 && (rng() % 1000000) < d.calculator * 1000000)
      return absl::StrCat(a, "+", b, "=(", a, "+", b, ")[", a + b, "]", a + b, "\n");
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
    // A calculator's observation "[c]": given, not predicted.
    const size_t seen = text.find('['), seen_end = seen == std::string::npos ? seen : text.find(']', seen);
    for (size_t i = 0; i < text.size(); ++i) {
      const bool observed = seen != std::string::npos && i + 1 >= seen && (seen_end == std::string::npos || i + 1 <= seen_end);
      const bool scored = i + 1 < text.size() && (!d.answer_only || i + 1 >= answer) && !observed;
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
                             const std::function<absl::Status(const nlohmann::json&, const BadLine&, int64_t line)>& each) {
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
    TESSERA_RETURN_IF_ERROR(each(j, bad, no));
  }
  return absl::OkStatus();
}
}  // namespace

namespace {

// A run of tokens of a sample and whether the model learns to predict them.
struct Piece {
  std::vector<int32_t> ids;
  bool scored;
};

// A conversation's pieces: each assistant turn (the template's text for it, its end
// token included) scored, everything before it — the template's text for the earlier
// turns and the generation prompt — not. The template is rendered for each prefix of the
// conversation and the text is split where the prefixes end; a template whose renderings
// are not prefixes of each other cannot be split so and is refused.
absl::StatusOr<std::vector<Piece>> ConversationPieces(const nlohmann::json& messages, const tokenizer::ModelText& text) {
  if (!text.chat) return absl::InvalidArgumentError(absl::StrCat("\"messages\" needs a chat template: ", text.chat_status.message()));
  if (!messages.is_array() || messages.empty()) return absl::InvalidArgumentError("messages: expected a non-empty list");
  const auto all = nlohmann::ordered_json::parse(messages.dump());
  std::vector<Piece> pieces;
  std::string done;  // the text turned into pieces so far
  auto add = [&](const std::string& upto, bool scored, size_t i) -> absl::Status {
    if (upto.compare(0, done.size(), done) != 0)
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "]: the chat template's text for the conversation up to ",
                                                     "here does not extend its text for the turns before; it cannot be split by turn"));
    TESSERA_ASSIGN_OR_RETURN(auto ids, text.tokenizer->Encode(upto.substr(done.size()), /*add_special=*/false));
    pieces.push_back({std::move(ids), scored});
    done = upto;
    return absl::OkStatus();
  };
  bool any = false;
  for (size_t i = 0; i < all.size(); ++i) {
    if (!all[i].is_object() || all[i].value("role", "") != "assistant") continue;
    if (i == 0) return absl::InvalidArgumentError("messages[0]: an assistant turn needs a turn before it");
    nlohmann::ordered_json before = nlohmann::ordered_json::array();
    for (size_t k = 0; k < i; ++k) before.push_back(all[k]);
    nlohmann::ordered_json upto = before;
    upto.push_back(all[i]);
    TESSERA_ASSIGN_OR_RETURN(std::string prompt, text.chat->Apply(before, /*add_generation_prompt=*/true));
    TESSERA_RETURN_IF_ERROR(add(prompt, false, i));
    TESSERA_ASSIGN_OR_RETURN(std::string turn, text.chat->Apply(upto, /*add_generation_prompt=*/false));
    TESSERA_RETURN_IF_ERROR(add(turn, true, i));
    any = true;
  }
  if (!any) return absl::InvalidArgumentError("messages: no assistant turn to learn");
  return pieces;
}

}  // namespace

absl::StatusOr<JsonlData> LoadJsonl(const std::string& path, int64_t seq_len, const tokenizer::ModelText& text) {
  JsonlData d;
  d.path = path;
  const tokenizer::Tokenizer& tok = *text.tokenizer;
  TESSERA_RETURN_IF_ERROR(ForEachJsonLine(path, [&](const nlohmann::json& j, const BadLine& bad, int64_t) -> absl::Status {
    std::vector<Piece> pieces;
    auto encode = [&](const std::string& s, bool special, bool eos) -> absl::StatusOr<std::vector<int32_t>> {
      TESSERA_ASSIGN_OR_RETURN(auto ids, tok.Encode(s, special));
      if (eos && text.eos_id && (ids.empty() || ids.back() != *text.eos_id)) ids.push_back(*text.eos_id);
      return ids;
    };
    absl::Status st;
    if (j.contains("text") && j["text"].is_string()) {
      auto ids = encode(j["text"].get<std::string>(), true, true);
      if (!ids.ok()) return bad(std::string(ids.status().message()));
      pieces.push_back({std::move(*ids), true});
    } else if (j.contains("prompt") && j["prompt"].is_string() && j.contains("response") && j["response"].is_string()) {
      auto p = encode(j["prompt"].get<std::string>(), true, false);
      auto r = encode(j["response"].get<std::string>(), false, !j["response"].get<std::string>().empty());
      if (!p.ok() || !r.ok()) return bad(std::string((p.ok() ? r.status() : p.status()).message()));
      pieces.push_back({std::move(*p), false});
      pieces.push_back({std::move(*r), true});
    } else if (j.contains("messages")) {
      auto c = ConversationPieces(j["messages"], text);
      if (!c.ok()) return bad(std::string(c.status().message()));
      pieces = std::move(*c);
    } else {
      return bad("expected {\"text\": string}, {\"prompt\": string, \"response\": string} or {\"messages\": [...]}");
    }
    std::vector<int32_t> all;
    std::vector<bool> scored;
    for (const Piece& p : pieces) {
      all.insert(all.end(), p.ids.begin(), p.ids.end());
      scored.insert(scored.end(), p.ids.size(), p.scored);
    }
    if (seq_len > 0 && static_cast<int64_t>(all.size()) > seq_len) all.resize(seq_len), scored.resize(seq_len);
    model::TokenBatch b;
    b.cu_seqlens = {0, static_cast<int32_t>(all.size())};
    bool learns = false;
    for (size_t i = 0; i < all.size(); ++i) {
      const bool target = i + 1 < all.size() && scored[i + 1];
      b.tokens.push_back(all[i]);
      b.targets.push_back(target ? all[i + 1] : -1);
      b.positions.push_back(static_cast<int32_t>(i));
      learns |= target;
    }
    if (!learns) return bad("the sample has no token to learn (too short, or the response starts past seq_len)");
    d.samples.push_back(std::move(b));
    return absl::OkStatus();
  }));
  if (d.samples.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no samples"));
  return d;
}

absl::StatusOr<JsonlData> LoadJsonl(const std::string& path, int64_t seq_len) {
  return LoadJsonl(path, seq_len, tokenizer::ModelText{tokenizer::MakeByteTokenizer()});
}

absl::StatusOr<std::vector<PromptAnswer>> LoadPromptAnswers(const std::string& path) {
  std::vector<PromptAnswer> out;
  TESSERA_RETURN_IF_ERROR(ForEachJsonLine(path, [&](const nlohmann::json& j, const BadLine& bad, int64_t no) -> absl::Status {
    const bool chat = j.contains("messages") && !j.contains("prompt");
    if ((!chat && (!j.contains("prompt") || !j["prompt"].is_string())) || !j.contains("answer") || !j["answer"].is_string())
      return bad("expected {\"prompt\": string, \"answer\": string} or {\"messages\": [...], \"answer\": string}");
    PromptAnswer pa;
    pa.answer = j["answer"].get<std::string>();
    pa.line = no;
    if (chat) {
      if (!j["messages"].is_array() || j["messages"].empty()) return bad("messages: expected a non-empty list");
      pa.messages = j["messages"];
    } else {
      pa.prompt = j["prompt"].get<std::string>();
      if (pa.prompt.empty()) return bad("the prompt is empty");
    }
    out.push_back(std::move(pa));
    return absl::OkStatus();
  }));
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no prompts"));
  return out;
}

absl::StatusOr<std::vector<int32_t>> EncodePrompt(const PromptAnswer& p, const std::string& path,
                                                  const tokenizer::ModelText& text, std::string* prompt_text) {
  auto bad = [&](const absl::Status& st) {
    return absl::InvalidArgumentError(absl::StrCat(path, ":", p.line, ": ", st.message()));
  };
  std::string t = p.prompt;
  bool special = true;
  if (!p.messages.is_null()) {
    if (!text.chat) return bad(absl::InvalidArgumentError(absl::StrCat("\"messages\" needs a chat template: ", text.chat_status.message())));
    auto rendered = text.chat->Apply(nlohmann::ordered_json::parse(p.messages.dump()), /*add_generation_prompt=*/true);
    if (!rendered.ok()) return bad(rendered.status());
    t = std::move(*rendered);
    special = false;  // the template writes BOS
  }
  auto ids = text.tokenizer->Encode(t, special);
  if (!ids.ok()) return bad(ids.status());
  if (ids->empty()) return bad(absl::InvalidArgumentError("the prompt has no tokens"));
  if (prompt_text != nullptr) *prompt_text = std::move(t);
  return ids;
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
