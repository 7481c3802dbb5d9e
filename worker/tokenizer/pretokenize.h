// Pre-tokenization: text split into the pieces BPE merges within, by the regular
// expressions of the GPT-2, Llama-3 and Qwen2 tokenizers. The patterns need Unicode
// classes and a look-ahead, which std::regex lacks; each is a hand-written scanner with
// the regex's leftmost-first alternation semantics (as llama.cpp does), checked against
// the Python `regex` engine on generated cases (tests/worker/tokenizer).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::tokenizer {

enum class SplitPattern {
  kGpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kLlama3,  // (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  kQwen2,   // as Llama-3 with \p{N} (one digit per piece)
};

// The pattern a tokenizer.json gives (its exact text); UNIMPLEMENTED naming the regex
// and the supported ones otherwise.
absl::StatusOr<SplitPattern> PatternFromRegex(std::string_view regex);
const char* PatternRegex(SplitPattern p);

// The pieces, in order; their concatenation is `text` (bytes that are not UTF-8 are
// classed as U+FFFD, "other", and kept).
std::vector<std::string_view> PreTokenize(SplitPattern p, std::string_view text);

}  // namespace tessera::tokenizer
