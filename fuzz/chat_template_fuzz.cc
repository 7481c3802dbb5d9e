// The chat-template interpreter (worker/tokenizer/jinja.h) on arbitrary template sources,
// rendered with a fixed conversation: parse errors and render errors are statuses —
// never a crash, unbounded recursion or undefined behaviour.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "worker/tokenizer/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(
      R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
          {"role": "assistant", "content": "Hello!", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]}])");
  static const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  const std::string source(reinterpret_cast<const char*>(data), size);
  auto t = tessera::tokenizer::ChatTemplate::FromSource(source, "<s>", "</s>");
  if (t.ok()) (void)t->Apply(messages, size % 2 == 0, size % 3 == 0 ? tools : nlohmann::ordered_json());
  return 0;
}
