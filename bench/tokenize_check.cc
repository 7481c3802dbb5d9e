// Our tokenizer and chat template on a model directory, for bench/tokenizer_check.py
// (run where Hugging Face's `tokenizers` and `transformers` are: a GPU host) to compare
// against, line by line:
//   tokenize_check DIR < cases.jsonl > ours.jsonl
// Each input line is {"text": s, "add_special": bool} or {"messages": [...],
// "add_generation_prompt": bool}; each output line {"ids": [...], "decoded": s} (and, for
// messages, "chat": the template's text, whose ids are encoded without special tokens),
// or {"error": message}.
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "worker/tokenizer/model_text.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: tokenize_check MODEL_DIR < cases.jsonl\n";
    return 2;
  }
  auto text = tessera::tokenizer::LoadModelText(argv[1]);
  if (!text.ok()) {
    std::cerr << text.status() << "\n";
    return 1;
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    const auto j = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
    nlohmann::ordered_json out;
    std::string s;
    bool special = j.value("add_special", false);
    if (j.contains("messages")) {
      if (!text->chat) {
        out["error"] = std::string(text->chat_status.message());
      } else {
        auto chat = text->chat->Apply(j["messages"], j.value("add_generation_prompt", false));
        if (!chat.ok()) out["error"] = std::string(chat.status().message());
        else s = *chat, out["chat"] = s, special = false;
      }
    } else {
      s = j.value("text", "");
    }
    if (!out.contains("error")) {
      auto ids = text->tokenizer->Encode(s, special);
      if (!ids.ok()) {
        out["error"] = std::string(ids.status().message());
      } else {
        out["ids"] = *ids;
        out["decoded"] = *text->tokenizer->Decode(*ids);
      }
    }
    std::cout << out.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
  }
  return 0;
}
