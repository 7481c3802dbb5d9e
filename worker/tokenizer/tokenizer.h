// Tokenizers: text <-> token ids (docs/design.md §10 worker/tokenizer).
//  - ByteTokenizer: token = byte (the default; the built-in tasks and demo models).
//  - Hugging Face `tokenizer.json` byte-level BPE (GPT-2, Llama-3, Qwen2 style):
//    added/special tokens split out first (leftmost-longest; lstrip/rstrip honoured),
//    the NFC normalizer (Qwen2), the pre-tokenizer regex (pretokenize.h), byte-to-unicode
//    mapping, BPE merges by rank (ignore_merges as Llama-3), the TemplateProcessing
//    post-processor's BOS/EOS when `add_special`, and the byte-level decoder. What a
//    tokenizer.json asks for beyond that (WordPiece, Metaspace, byte_fallback, other
//    normalizers...) is refused when it is loaded, naming the field.
// Encode never loses bytes: text that is not UTF-8 still encodes (byte-level), and
// Decode(Encode(t)) == t. Instances are immutable after loading: thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tessera::tokenizer {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // `add_special`: the post-processor's tokens around the text (Llama-3's BOS). Text
  // that names a special token ("<|eot_id|>") encodes to that token, as Hugging Face's
  // tokenizers do.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text, bool add_special = false) const = 0;
  // Ids out of range are INVALID_ARGUMENT naming the id.
  virtual absl::StatusOr<std::string> Decode(absl::Span<const int32_t> ids, bool skip_special = false) const = 0;
  // Every id is below this (the model's vocabulary may be padded larger).
  virtual int64_t vocab_size() const = 0;
  // The id of an added/special token's text, if there is one.
  virtual std::optional<int32_t> SpecialId(std::string_view content) const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;
  virtual std::string name() const = 0;
};

std::unique_ptr<Tokenizer> MakeByteTokenizer();

// Loads `path`: a tokenizer.json, or a directory holding one. INVALID_ARGUMENT /
// UNIMPLEMENTED naming the file and field for what it cannot read.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& path);

}  // namespace tessera::tokenizer
