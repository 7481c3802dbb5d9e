#include "worker/tokenizer/chat_template.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/util.h"

namespace tessera::tokenizer {

using Json = nlohmann::ordered_json;

namespace {

// A token field: "text", {"content": "text", ...} or null.
std::string TokenText(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return "";
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::FromSource(const std::string& source, std::string bos, std::string eos) {
  auto t = JinjaTemplate::Parse(source);
  if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat("chat template: ", t.status().message()));
  return ChatTemplate(std::move(*t), std::move(bos), std::move(eos));
}

absl::StatusOr<ChatTemplate> ChatTemplate::Load(const std::string& dir) {
  const std::string file = dir + "/tokenizer_config.json";
  auto text = ReadFile(file);
  if (!text.ok()) return absl::NotFoundError(absl::StrCat("chat template: ", file, ": ", text.status().message()));
  const Json j = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(absl::StrCat(file, ": not a JSON object"));
  std::string source;
  const Json ct = j.value("chat_template", Json());
  if (ct.is_string()) {
    source = ct.get<std::string>();
  } else if (ct.is_array()) {
    for (const auto& t : ct)
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string()) source = t["template"];
  }
  if (source.empty()) return absl::InvalidArgumentError(absl::StrCat(file, ": chat_template: expected a template string (or a list with a \"default\" one)"));
  auto t = FromSource(source, TokenText(j.value("bos_token", Json())), TokenText(j.value("eos_token", Json())));
  if (!t.ok()) return absl::InvalidArgumentError(absl::StrCat(file, ": ", t.status().message()));
  return t;
}

absl::StatusOr<std::string> ChatTemplate::Apply(const Json& messages, bool add_generation_prompt, const Json& tools,
                                                const Json& extra) const {
  if (!messages.is_array() || messages.empty()) return absl::InvalidArgumentError("messages: expected a non-empty list of {\"role\", \"content\"}");
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "]: expected an object with a string \"role\""));
    if (m.contains("content") && !m["content"].is_string() && !m["content"].is_null() && !m["content"].is_array())
      return absl::InvalidArgumentError(absl::StrCat("messages[", i, "].content: expected a string"));
  }
  if (!tools.is_null() && !tools.is_array()) return absl::InvalidArgumentError("tools: expected a list");
  Json vars = {{"messages", messages}, {"add_generation_prompt", add_generation_prompt}, {"bos_token", bos_}, {"eos_token", eos_}};
  if (!tools.is_null()) vars["tools"] = tools;
  if (!extra.is_null()) {
    if (!extra.is_object()) return absl::InvalidArgumentError("chat template variables: expected an object");
    for (auto it = extra.begin(); it != extra.end(); ++it) {
      if (vars.contains(it.key()))
        return absl::InvalidArgumentError(absl::StrCat("chat template variables: '", it.key(), "' is set by the conversation"));
      vars[it.key()] = it.value();
    }
  }
  auto out = template_.Render(vars);
  if (!out.ok()) return absl::InvalidArgumentError(absl::StrCat("chat template: ", out.status().message()));
  return out;
}

}  // namespace tessera::tokenizer
