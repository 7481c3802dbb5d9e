// A model's text side, as a generate (or RL) job needs it: the tokenizer, the chat
// template when the directory has one, and the token ids generation stops at by default.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/tokenizer/chat_template.h"
#include "worker/tokenizer/tokenizer.h"

namespace tessera::tokenizer {

struct ModelText {
  std::unique_ptr<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat = std::nullopt;  // from tokenizer_config.json, when it has one
  absl::Status chat_status = absl::OkStatus();      // why there is none (reported when a conversation needs it)
  // tokenizer_config.json's eos_token: what SFT appends to a response so that the model
  // learns to stop (none for the byte tokenizer).
  std::optional<int32_t> eos_id = std::nullopt;
  // Where generation stops by default: eos_id and generation_config.json's eos_token_id(s).
  std::vector<int32_t> eos_ids = {};
  // generation_config.json's default sampling, where it sets it (do_sample is not read:
  // the values are the defaults, as vLLM takes them).
  std::optional<double> temperature = std::nullopt, top_p = std::nullopt;
  std::optional<int32_t> top_k = std::nullopt;
};

// The token of each stop string (a job's `field`, e.g. "generate.stop"): each must be one
// token of the tokenizer — INVALID_ARGUMENT naming field[i] and its token count.
absl::StatusOr<std::vector<int32_t>> StopTokens(const Tokenizer& tokenizer, const std::vector<std::string>& stops,
                                                const std::string& field);

// `path`: "byte" (or empty) for the byte tokenizer; a tokenizer.json, or a directory
// holding one (and, beside it, tokenizer_config.json / generation_config.json).
// INVALID_ARGUMENT naming generation_config.json's key for a sampling value out of range
// (temperature < 0, top_p outside (0, 1], top_k < 0).
absl::StatusOr<ModelText> LoadModelText(const std::string& path);

}  // namespace tessera::tokenizer
