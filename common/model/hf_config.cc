#include "common/model/hf_config.h"

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/util.h"

namespace tessera::model {
namespace {
using nlohmann::json;

absl::Status BadKey(const std::string& dir, const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(dir, "/config.json: ", key, ": ", what));
}

absl::StatusOr<int64_t> Int(const json& j, const std::string& dir, const char* key, bool required, int64_t dflt = 0) {
  if (!j.contains(key) || j[key].is_null()) {
    if (required) return BadKey(dir, key, "is required");
    return dflt;
  }
  if (!j[key].is_number_integer() || j[key].get<int64_t>() < 0) return BadKey(dir, key, "expected a non-negative integer");
  return j[key].get<int64_t>();
}

absl::StatusOr<double> Num(const json& j, const std::string& dir, const char* key, double dflt) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  if (!j[key].is_number()) return BadKey(dir, key, "expected a number");
  return j[key].get<double>();
}

bool Flag(const json& j, const char* key) { return j.contains(key) && j[key].is_boolean() && j[key].get<bool>(); }

}  // namespace

absl::StatusOr<LlamaConfig> ReadHfConfig(const std::string& dir) {
  TESSERA_ASSIGN_OR_RETURN(std::string text, ReadFile(dir + "/config.json"));
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(absl::StrCat(dir, "/config.json: not a JSON object"));
  const std::string type = j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  if (type != "llama" && type != "qwen2")
    return absl::UnimplementedError(absl::StrCat(dir, "/config.json: model_type '", type, "' is not supported (llama, qwen2)"));
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    return absl::UnimplementedError(absl::StrCat(dir, "/config.json: rope_scaling ", j["rope_scaling"].dump(),
                                                 " is not supported yet (plain RoPE with rope_theta only)"));
  for (const char* k : {"attention_bias", "mlp_bias"})
    if (type == "llama" && Flag(j, k))
      return absl::UnimplementedError(absl::StrCat(dir, "/config.json: ", k, ": true is not supported"));
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    return absl::UnimplementedError(absl::StrCat(dir, "/config.json: hidden_act ", j["hidden_act"].dump(), " (only silu)"));
  if (type == "qwen2" && Flag(j, "use_sliding_window"))
    return absl::UnimplementedError(absl::StrCat(dir, "/config.json: use_sliding_window: true is not supported"));
  LlamaConfig c;
  TESSERA_ASSIGN_OR_RETURN(c.vocab, Int(j, dir, "vocab_size", true));
  TESSERA_ASSIGN_OR_RETURN(c.hidden, Int(j, dir, "hidden_size", true));
  TESSERA_ASSIGN_OR_RETURN(c.layers, Int(j, dir, "num_hidden_layers", true));
  TESSERA_ASSIGN_OR_RETURN(c.heads, Int(j, dir, "num_attention_heads", true));
  TESSERA_ASSIGN_OR_RETURN(c.kv_heads, Int(j, dir, "num_key_value_heads", false, c.heads));
  TESSERA_ASSIGN_OR_RETURN(c.head_dim, Int(j, dir, "head_dim", false, 0));
  TESSERA_ASSIGN_OR_RETURN(c.ffn, Int(j, dir, "intermediate_size", true));
  TESSERA_ASSIGN_OR_RETURN(double theta, Num(j, dir, "rope_theta", 10000.0));
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {  // transformers >= 5
    const json& rp = j["rope_parameters"];
    const std::string kind = rp.contains("rope_type") && rp["rope_type"].is_string() ? rp["rope_type"].get<std::string>() : "default";
    if (kind != "default")
      return absl::UnimplementedError(absl::StrCat(dir, "/config.json: rope_parameters.rope_type '", kind,
                                                   "' is not supported yet (plain RoPE only)"));
    TESSERA_ASSIGN_OR_RETURN(theta, Num(rp, dir, "rope_theta", theta));
  }
  TESSERA_ASSIGN_OR_RETURN(double eps, Num(j, dir, "rms_norm_eps", 1e-6));
  c.rope_base = static_cast<float>(theta);
  c.norm_eps = static_cast<float>(eps);
  c.tie_embeddings = Flag(j, "tie_word_embeddings");
  c.qkv_bias = type == "qwen2";
  // A critic: a token-classification head of one label (score.weight [1, hidden]).
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const json& a : j["architectures"])
      if (a.is_string() && absl::EndsWith(a.get<std::string>(), "ForTokenClassification")) c.value_head = true;
  if (c.value_head) {
    const int64_t labels = j.contains("id2label") && j["id2label"].is_object() ? static_cast<int64_t>(j["id2label"].size())
                                                                              : j.value("num_labels", int64_t{1});
    if (labels != 1)
      return absl::UnimplementedError(absl::StrCat(dir, "/config.json: a token-classification model of ", labels,
                                                   " labels; a critic has one (its value)"));
    c.tie_embeddings = false;  // the embedding is not the head's
  }
  if (auto st = c.Validate(); !st.ok()) return absl::InvalidArgumentError(absl::StrCat(dir, "/config.json: ", st.message()));
  return c;
}

}  // namespace tessera::model
