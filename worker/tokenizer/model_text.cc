#include "worker/tokenizer/model_text.h"

#include <sys/stat.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/util.h"

namespace tessera::tokenizer {

absl::StatusOr<std::vector<int32_t>> StopTokens(const Tokenizer& tokenizer, const std::vector<std::string>& stops,
                                                const std::string& field) {
  std::vector<int32_t> out;
  for (size_t i = 0; i < stops.size(); ++i) {
    TESSERA_ASSIGN_OR_RETURN(auto ids, tokenizer.Encode(stops[i]));
    if (ids.size() != 1)
      return absl::InvalidArgumentError(absl::StrCat(field, "[", i, "]: '", stops[i], "' is ", ids.size(), " tokens of ",
                                                     tokenizer.name(), "; a stop string must be one token"));
    out.push_back(ids[0]);
  }
  return out;
}

absl::StatusOr<ModelText> LoadModelText(const std::string& path) {
  ModelText t;
  if (path.empty() || path == "byte") {
    t.tokenizer = MakeByteTokenizer();
    t.chat_status = absl::FailedPreconditionError("the byte tokenizer has no chat template");
    return t;
  }
  TESSERA_ASSIGN_OR_RETURN(t.tokenizer, LoadHfTokenizer(path));
  struct stat st;
  const bool is_dir = stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
  const std::string dir = is_dir ? path : path.substr(0, path.rfind('/') == std::string::npos ? 0 : path.rfind('/'));
  const std::string base = dir.empty() ? "." : dir;
  auto chat = ChatTemplate::Load(base);
  if (chat.ok()) t.chat = std::move(*chat);
  else t.chat_status = chat.status();
  if (auto text = ReadFile(base + "/tokenizer_config.json"); text.ok()) {
    const auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("eos_token")) {
      const auto& e = j["eos_token"];
      const std::string eos = e.is_string() ? e.get<std::string>()
                              : e.is_object() && e.contains("content") && e["content"].is_string() ? e["content"].get<std::string>()
                                                                                                   : "";
      if (auto id = t.tokenizer->SpecialId(eos)) t.eos_id = *id, t.eos_ids.push_back(*id);
    }
  }
  if (auto text = ReadFile(dir + "/generation_config.json"); text.ok()) {
    const auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("eos_token_id")) {
      const auto& e = j["eos_token_id"];
      for (const auto& id : e.is_array() ? e : nlohmann::json::array({e}))
        if (id.is_number_integer() && id.get<int64_t>() >= 0 && id.get<int64_t>() < t.tokenizer->vocab_size())
          t.eos_ids.push_back(id.get<int32_t>());
    }
    auto number = [&](const char* key, bool integer, double lo, bool lo_open, double hi) -> absl::StatusOr<std::optional<double>> {
      if (!j.is_object() || !j.contains(key) || j[key].is_null()) return std::optional<double>();
      const auto& v = j[key];
      const bool ok = integer ? v.is_number_integer() : v.is_number();
      const double x = ok ? v.get<double>() : 0;
      if (!ok || x < lo || (lo_open && x == lo) || x > hi)
        return absl::InvalidArgumentError(absl::StrCat(dir, "/generation_config.json: ", key, " must be ",
                                                       integer ? "an integer" : "a number", " in ", lo_open ? "(" : "[",
                                                       lo, ", ", hi, "], got ", v.dump()));
      return std::optional<double>(x);
    };
    TESSERA_ASSIGN_OR_RETURN(t.temperature, number("temperature", false, 0, false, 1e6));
    TESSERA_ASSIGN_OR_RETURN(t.top_p, number("top_p", false, 0, true, 1));
    TESSERA_ASSIGN_OR_RETURN(auto top_k, number("top_k", true, 0, false, 1e9));
    if (top_k) t.top_k = static_cast<int32_t>(*top_k);
  }
  std::sort(t.eos_ids.begin(), t.eos_ids.end());
  t.eos_ids.erase(std::unique(t.eos_ids.begin(), t.eos_ids.end()), t.eos_ids.end());
  return t;
}

}  // namespace tessera::tokenizer
