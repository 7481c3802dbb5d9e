// Built-in training data that needs no download (docs/design.md §8): multi-digit addition in
// decimal, "a+b=c\n", as byte tokens (the byte-level tokenizer: token = byte value).
// Every micro-batch is a pure function of (seed, index), so any split of a global batch
// over data-parallel ranks and micro-batches sees the same sequences.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "worker/model/llama.h"
#include "worker/tokenizer/model_text.h"

namespace tessera::engine {

struct ArithmeticData {
  int digits = 3;      // operands in [0, 10^digits)
  uint64_t seed = 0;
  int64_t seq_len = 0;  // sequences longer than this are cut (0: no limit)
  bool answer_only = false;  // SFT: loss only on the answer ("c\n"), not on the prompt "a+b="
  // The operand pairs (a, b) fall in two fixed splits: about 1 in 10 pairs (a hash of
  // the pair) is held out — never drawn for training — and held_out data draws only
  // those, so an evaluation on it measures problems no job trained on.
  bool held_out = false;
  // A careless teacher (SFT data with systematic mistakes, for the RL demo): this
  // fraction of the problems whose units digits carry get the answer without the carry
  // (17+25=32): SFT imitates the mistake; a verifier that checks the true sum (GRPO's
  // reward) does not. Training data only: held-out problems always carry their true sum.
  double careless = 0;
  // A teacher that uses a calculator (the multi-turn RL demo's SFT data): this fraction of
  // the problems is answered through a call, "17+25=(17+25)[42]42\n" — the call "(17+25)",
  // the calculator's observation "[42]" (never a target: MakeArithmeticBatch), then the
  // answer; never careless. Training data only.
  double calculator = 0;
};

// Whether the pair (a, b) belongs to the held-out split.
bool IsHeldOutPair(int64_t a, int64_t b);

// One problem: its text ("17+305=322\n").
std::string ArithmeticProblem(const ArithmeticData& d, int64_t index);

// Micro-batch `index` (global numbering): `sequences` problems packed, next-byte
// targets on every token but the last of each sequence (answer_only: only where the
// predicted byte belongs to the answer) and none inside a calculator's observation "[c]".
model::TokenBatch MakeArithmeticBatch(const ArithmeticData& d, int64_t index, int sequences);

}  // namespace tessera::engine

namespace tessera::engine {

// JSONL training data (one JSON object per line; byte-level tokens — token = UTF-8 byte —
// unless a tokenizer is given):
// {"text": "..."} — the loss on every next byte — or {"prompt": "...", "response": "..."}
// — the loss only on the response's bytes (SFT). Samples are cut to seq_len. Micro-batch
// `index` holds samples index·sequences ... (wrapping round the file), so it is a pure
// function of its index as the built-in data is (resume and any DP split see the same).
struct JsonlData {
  std::string path;
  std::vector<model::TokenBatch> samples;  // one sequence each (cu_seqlens {0, n})
};

// INVALID_ARGUMENT naming the file and line: not JSON, neither text nor prompt/response,
// an empty sample; NOT_FOUND when the file cannot be read; an empty file is an error.
absl::StatusOr<JsonlData> LoadJsonl(const std::string& path, int64_t seq_len);
// The same through a model's tokenizer (docs/tokenizers.md): "text" is encoded with the
// tokenizer's special tokens (Llama-3: BOS) and the EOS token appended; "prompt" likewise
// and "response" without BOS, with EOS, the loss on the response and its EOS; and
// {"messages": [{"role", "content"}...]} goes through the chat template, the loss on
// each assistant turn (its end-of-turn token included). With the byte tokenizer this is
// the overload above (no BOS/EOS; "messages" needs a chat template).
absl::StatusOr<JsonlData> LoadJsonl(const std::string& path, int64_t seq_len, const tokenizer::ModelText& text);
model::TokenBatch MakeJsonlBatch(const JsonlData& d, int64_t index, int sequences);

// RL prompts with a reference answer (grpo jobs on JSONL): {"prompt": string, "answer":
// string} or {"messages": [...], "answer": string} (a conversation for the chat
// template) per line, blank lines skipped. INVALID_ARGUMENT naming the file and line (not
// JSON, a missing or non-string field, an empty prompt), NOT_FOUND when unreadable; an
// empty file is an error.
struct PromptAnswer {
  std::string prompt, answer;
  nlohmann::json messages;  // null unless the line gives a conversation
  int64_t line = 0;         // in the file
};
// The prompt's tokens: "prompt" with the tokenizer's special tokens (BOS), "messages"
// through the chat template with the generation prompt. `text` gets the prompt's text
// (what a reward service sees). INVALID_ARGUMENT naming the file and line.
absl::StatusOr<std::vector<int32_t>> EncodePrompt(const PromptAnswer& p, const std::string& path,
                                                  const tokenizer::ModelText& text, std::string* prompt_text);
absl::StatusOr<std::vector<PromptAnswer>> LoadPromptAnswers(const std::string& path);

}  // namespace tessera::engine
