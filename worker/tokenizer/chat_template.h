// A model's chat template: tokenizer_config.json's `chat_template` (Jinja, rendered by
// jinja.h the way transformers' apply_chat_template does) with its bos/eos tokens.
// Immutable after loading; thread-safe.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "worker/tokenizer/jinja.h"

namespace tessera::tokenizer {

class ChatTemplate {
 public:
  // From `dir`/tokenizer_config.json: chat_template (a string, or a list of {name,
  // template} of which "default" is taken), bos_token and eos_token (strings or
  // {"content": ...}). NOT_FOUND without the file; INVALID_ARGUMENT naming the file and
  // field when there is no template or it does not parse.
  static absl::StatusOr<ChatTemplate> Load(const std::string& dir);
  static absl::StatusOr<ChatTemplate> FromSource(const std::string& source, std::string bos_token, std::string eos_token);

  // The prompt text of a conversation: `messages` a list of {"role": string, "content":
  // string or null, ...} (other keys, e.g. tool_calls, go to the template as they are);
  // `tools` a list or null; `extra` null or an object of further template variables, as
  // apply_chat_template's keyword arguments (e.g. Qwen3's enable_thinking). INVALID_ARGUMENT
  // naming the message and field, or the template's own raise_exception message.
  absl::StatusOr<std::string> Apply(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                    const nlohmann::ordered_json& tools = nullptr,
                                    const nlohmann::ordered_json& extra = nullptr) const;
  const std::string& bos_token() const { return bos_; }
  const std::string& eos_token() const { return eos_; }

 private:
  ChatTemplate(JinjaTemplate t, std::string bos, std::string eos) : template_(std::move(t)), bos_(std::move(bos)), eos_(std::move(eos)) {}
  JinjaTemplate template_;
  std::string bos_, eos_;
};

}  // namespace tessera::tokenizer
