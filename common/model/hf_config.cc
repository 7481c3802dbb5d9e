#include "common/model/hf_config.h"

#include <algorithm>
#include <iterator>

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

// The keys a config.json of the supported families may carry, beyond those read below:
// metadata and settings with no effect on the forward (initialization, caching, token ids
// of the tokenizer, where the checkpoint came from). Any other key is refused by name.
const char* const kInertKeys[] = {"_name_or_path", "architectures", "model_type", "transformers_version", "torch_dtype",
                                  "dtype", "initializer_range", "use_cache", "bos_token_id", "eos_token_id",
                                  "pad_token_id", "pretraining_tp", "id2label", "label2id", "num_labels", "problem_type",
                                  "output_attentions", "output_hidden_states", "return_dict", "tokenizer_class",
                                  "max_window_layers", "sliding_window", "layer_types", "use_sliding_window",
                                  "attention_bias", "mlp_bias", "attention_dropout", "hidden_act", "rope_scaling",
                                  "rope_parameters", "partial_rotary_factor"};
const char* const kReadKeys[] = {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                 "num_key_value_heads", "head_dim", "intermediate_size", "rope_theta", "rms_norm_eps",
                                 "tie_word_embeddings", "max_position_embeddings"};

// rope_scaling (transformers 4) or rope_parameters (5: rope_theta inside) into c.
absl::Status ReadRope(const json& j, const std::string& dir, LlamaConfig& c) {
  const bool v5 = j.contains("rope_parameters") && !j["rope_parameters"].is_null();
  const char* key = v5 ? "rope_parameters" : "rope_scaling";
  if (!j.contains(key) || j[key].is_null()) return absl::OkStatus();
  const json& r = j[key];
  if (!r.is_object()) return BadKey(dir, key, "expected an object");
  static const char* const kRopeKeys[] = {"rope_type", "type", "rope_theta", "factor", "original_max_position_embeddings",
                                          "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow",
                                          "attention_factor", "mscale", "mscale_all_dim", "truncate",
                                          "partial_rotary_factor"};
  for (auto it = r.begin(); it != r.end(); ++it)
    if (std::find(std::begin(kRopeKeys), std::end(kRopeKeys), it.key()) == std::end(kRopeKeys))
      return absl::UnimplementedError(absl::StrCat(dir, "/config.json: ", key, ".", it.key(), " is not supported"));
  std::string type = "default";
  for (const char* k : {"rope_type", "type"})
    if (r.contains(k) && r[k].is_string()) type = r[k].get<std::string>();
  const std::string where = std::string(key) + ".";
  auto num = [&](const char* k, double dflt) -> absl::StatusOr<double> {
    if (!r.contains(k) || r[k].is_null()) return dflt;
    if (!r[k].is_number()) return BadKey(dir, where + k, "expected a number");
    return r[k].get<double>();
  };
  TESSERA_ASSIGN_OR_RETURN(const double partial, num("partial_rotary_factor", 1.0));
  if (partial != 1.0)
    return absl::UnimplementedError(absl::StrCat(dir, "/config.json: ", where, "partial_rotary_factor ", partial,
                                                 " is not supported (RoPE over the whole head)"));
  if (v5) {
    TESSERA_ASSIGN_OR_RETURN(const double theta, num("rope_theta", c.rope_base));
    c.rope_base = static_cast<float>(theta);
  }
  RopeScaling& s = c.rope_scaling;
  using T = RopeScaling::Type;
  if (type == "default") s.type = T::kDefault;
  else if (type == "linear") s.type = T::kLinear;
  else if (type == "dynamic") s.type = T::kDynamic;
  else if (type == "yarn") s.type = T::kYarn;
  else if (type == "llama3") s.type = T::kLlama3;
  else
    return absl::UnimplementedError(absl::StrCat(dir, "/config.json: ", where, "rope_type '", type,
                                                 "' is not supported (default, linear, dynamic, yarn, llama3)"));
  if (s.type == T::kDefault) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(s.factor, num("factor", 0));
  if (!(s.factor > 0) && !(s.type == T::kYarn && s.factor == 0))  // yarn without one: the context lengths' ratio
    return BadKey(dir, where + "factor", absl::StrCat("rope_type ", type, " needs a factor > 0"));
  TESSERA_ASSIGN_OR_RETURN(const double original, num("original_max_position_embeddings", 0));
  if (original < 0 || original != static_cast<double>(static_cast<int64_t>(original)))
    return BadKey(dir, where + "original_max_position_embeddings", "expected a non-negative integer");
  s.original_max_positions = static_cast<int64_t>(original);
  if (s.type == T::kLlama3) {
    TESSERA_ASSIGN_OR_RETURN(s.low_freq_factor, num("low_freq_factor", 0));
    TESSERA_ASSIGN_OR_RETURN(s.high_freq_factor, num("high_freq_factor", 0));
    if (!(s.low_freq_factor > 0) || !(s.high_freq_factor > s.low_freq_factor))
      return BadKey(dir, where + "low_freq_factor", "llama3 scaling needs 0 < low_freq_factor < high_freq_factor");
    if (s.original_max_positions <= 0 && c.max_positions <= 0)  // transformers: max_position_embeddings by default
      return BadKey(dir, where + "original_max_position_embeddings", "llama3 scaling needs it or max_position_embeddings");
  }
  if (s.type == T::kYarn) {
    TESSERA_ASSIGN_OR_RETURN(s.beta_fast, num("beta_fast", 32));
    TESSERA_ASSIGN_OR_RETURN(s.beta_slow, num("beta_slow", 1));
    TESSERA_ASSIGN_OR_RETURN(s.attention_factor, num("attention_factor", 0));
    TESSERA_ASSIGN_OR_RETURN(s.mscale, num("mscale", 0));
    TESSERA_ASSIGN_OR_RETURN(s.mscale_all_dim, num("mscale_all_dim", 0));
    if (r.contains("truncate") && !r["truncate"].is_null()) {
      if (!r["truncate"].is_boolean()) return BadKey(dir, where + "truncate", "expected true or false");
      s.truncate = r["truncate"].get<bool>();
    }
    if (s.beta_fast == 0) s.beta_fast = 32;  // transformers: `or 32`
    if (s.beta_slow == 0) s.beta_slow = 1;
    if (s.original_max_positions <= 0 && c.max_positions <= 0)
      return BadKey(dir, "max_position_embeddings", "yarn scaling needs it or original_max_position_embeddings");
    if (s.factor == 0 && (s.original_max_positions <= 0 || c.max_positions <= 0))
      return BadKey(dir, where + "factor", "yarn scaling needs a factor, or both context lengths to derive it");
  }
  if (s.type == T::kDynamic && c.max_positions <= 0)
    return BadKey(dir, "max_position_embeddings", "dynamic scaling needs it (> 0)");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LlamaConfig> ReadHfConfig(const std::string& dir) {
  TESSERA_ASSIGN_OR_RETURN(std::string text, ReadFile(dir + "/config.json"));
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return absl::InvalidArgumentError(absl::StrCat(dir, "/config.json: not a JSON object"));
  const std::string type = j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  if (type != "llama" && type != "qwen2" && type != "qwen3")
    return absl::UnimplementedError(absl::StrCat(dir, "/config.json: model_type '", type,
                                                 "' is not supported (llama, qwen2, qwen3)"));
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    const bool known = std::find(std::begin(kInertKeys), std::end(kInertKeys), k) != std::end(kInertKeys) ||
                       std::find(std::begin(kReadKeys), std::end(kReadKeys), k) != std::end(kReadKeys);
    if (!known) return absl::UnimplementedError(absl::StrCat(dir, "/config.json: ", k, " is not supported"));
  }
  for (const char* k : {"attention_bias", "mlp_bias"})
    if (type != "qwen2" && Flag(j, k))
      return absl::UnimplementedError(absl::StrCat(dir, "/config.json: ", k, ": true is not supported"));
  if (j.contains("hidden_act") && j["hidden_act"] != "silu")
    return absl::UnimplementedError(absl::StrCat(dir, "/config.json: hidden_act ", j["hidden_act"].dump(), " (only silu)"));
  if (Flag(j, "use_sliding_window"))
    return absl::UnimplementedError(absl::StrCat(dir, "/config.json: use_sliding_window: true is not supported"));
  if (j.contains("layer_types") && j["layer_types"].is_array())
    for (const json& l : j["layer_types"])
      if (l != "full_attention")
        return absl::UnimplementedError(absl::StrCat(dir, "/config.json: layer_types: ", l.dump(),
                                                     " is not supported (full_attention only)"));
  if (j.contains("attention_dropout") && j["attention_dropout"].is_number() && j["attention_dropout"].get<double>() != 0)
    return absl::UnimplementedError(absl::StrCat(dir, "/config.json: attention_dropout ", j["attention_dropout"].dump(),
                                                 " is not supported (no dropout)"));
  if (j.contains("partial_rotary_factor") && j["partial_rotary_factor"].is_number() &&
      j["partial_rotary_factor"].get<double>() != 1.0)
    return absl::UnimplementedError(absl::StrCat(dir, "/config.json: partial_rotary_factor ",
                                                 j["partial_rotary_factor"].dump(), " is not supported (RoPE over the whole head)"));
  LlamaConfig c;
  TESSERA_ASSIGN_OR_RETURN(c.vocab, Int(j, dir, "vocab_size", true));
  TESSERA_ASSIGN_OR_RETURN(c.hidden, Int(j, dir, "hidden_size", true));
  TESSERA_ASSIGN_OR_RETURN(c.layers, Int(j, dir, "num_hidden_layers", true));
  TESSERA_ASSIGN_OR_RETURN(c.heads, Int(j, dir, "num_attention_heads", true));
  TESSERA_ASSIGN_OR_RETURN(c.kv_heads, Int(j, dir, "num_key_value_heads", false, c.heads));
  TESSERA_ASSIGN_OR_RETURN(c.head_dim, Int(j, dir, "head_dim", false, 0));
  TESSERA_ASSIGN_OR_RETURN(c.ffn, Int(j, dir, "intermediate_size", true));
  TESSERA_ASSIGN_OR_RETURN(double theta, Num(j, dir, "rope_theta", 10000.0));
  c.rope_base = static_cast<float>(theta);
  TESSERA_ASSIGN_OR_RETURN(c.max_positions, Int(j, dir, "max_position_embeddings", false, 0));
  TESSERA_RETURN_IF_ERROR(ReadRope(j, dir, c));
  TESSERA_ASSIGN_OR_RETURN(double eps, Num(j, dir, "rms_norm_eps", 1e-6));
  c.norm_eps = static_cast<float>(eps);
  c.tie_embeddings = Flag(j, "tie_word_embeddings");
  c.qkv_bias = type == "qwen2";
  c.qk_norm = type == "qwen3";
  // A critic: a token-classification head of one label (score.weight [1, hidden]); a
  // reward model: a sequence-classification head of one label (the same weight, read at
  // the last token).
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const json& a : j["architectures"]) {
      if (!a.is_string()) continue;
      if (absl::EndsWith(a.get<std::string>(), "ForTokenClassification")) c.value_head = true;
      if (absl::EndsWith(a.get<std::string>(), "ForSequenceClassification")) c.value_head = c.sequence_score = true;
    }
  if (c.value_head) {
    const int64_t labels = j.contains("id2label") && j["id2label"].is_object() ? static_cast<int64_t>(j["id2label"].size())
                                                                              : j.value("num_labels", int64_t{1});
    if (labels != 1)
      return absl::UnimplementedError(absl::StrCat(dir, "/config.json: a ", c.sequence_score ? "sequence" : "token",
                                                   "-classification model of ", labels, " labels; a ",
                                                   c.sequence_score ? "reward model has one (its score)" : "critic has one (its value)"));
    c.tie_embeddings = false;  // the embedding is not the head's
  }
  if (auto st = c.Validate(); !st.ok()) return absl::InvalidArgumentError(absl::StrCat(dir, "/config.json: ", st.message()));
  return c;
}

}  // namespace tessera::model
