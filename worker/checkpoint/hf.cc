#include "worker/checkpoint/hf.h"

#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "common/util.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/runtime/dtype.h"

namespace tessera::checkpoint {
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

// name -> the file holding it.
absl::StatusOr<std::map<std::string, std::string>> WeightFiles(const std::string& dir) {
  std::map<std::string, std::string> where;
  auto index = ReadFile(dir + "/model.safetensors.index.json");
  if (!index.ok()) return where;  // one file: model.safetensors
  const json j = json::parse(*index, nullptr, false);
  if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object())
    return absl::DataLossError(absl::StrCat(dir, "/model.safetensors.index.json: no weight_map object"));
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
      return absl::DataLossError(absl::StrCat(dir, "/model.safetensors.index.json: bad file for ", name));
    where[name] = file.get<std::string>();
  }
  return where;
}

}  // namespace

absl::StatusOr<model::LlamaConfig> ReadHfConfig(const std::string& dir) {
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
  model::LlamaConfig c;
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

absl::Status ImportHf(const std::string& dir, model::Llama& model) {
  TESSERA_ASSIGN_OR_RETURN(auto where, WeightFiles(dir));
  std::map<std::string, std::unique_ptr<SafetensorsReader>> open;
  for (auto& p : model.params()) {
    const std::string file = where.empty() ? "model.safetensors" : (where.count(p.name()) ? where[p.name()] : "");
    // A critic started from a causal LM (PPO's usual start): the LM's weights, and the
    // value head as the model initialized it.
    const bool fresh_head = p.name() == "score.weight";
    if (file.empty() && fresh_head) continue;
    if (file.empty()) return absl::NotFoundError(absl::StrCat(dir, ": the index lists no file for ", p.name()));
    auto& r = open[file];
    if (r == nullptr) {
      TESSERA_ASSIGN_OR_RETURN(r, SafetensorsReader::Open(absl::StrCat(dir, "/", file)));
    }
    if (fresh_head && !r->Find(p.name()).ok()) continue;
    TESSERA_ASSIGN_OR_RETURN(const TensorInfo* info, r->Find(p.name()));
    if (info->shape != p.spec.shape)
      return absl::InvalidArgumentError(absl::StrCat(r->path(), ": ", p.name(), " has shape [", absl::StrJoin(info->shape, ", "),
                                                     "], the model expects [", absl::StrJoin(p.spec.shape, ", "), "]"));
    TESSERA_ASSIGN_OR_RETURN(std::vector<float> global, r->ReadF32(p.name()));
    TESSERA_RETURN_IF_ERROR(model.SetGlobal(p, global));
  }
  return absl::OkStatus();
}

absl::Status ExportHf(const std::string& dir, model::Llama& model, const std::string& dtype, bool write,
                      comm::Communicator* pp) {
  if (dtype != "BF16" && dtype != "F32")
    return absl::InvalidArgumentError(absl::StrCat("export: dtype must be BF16 or F32, got '", dtype, "'"));
  const model::LlamaConfig& c = model.config();
  const model::StageSpec& stage = model.stage();
  const int pps = pp != nullptr ? pp->size() : 1, me = pp != nullptr ? pp->rank() : 0;
  if (pps != stage.pp) return absl::InvalidArgumentError("export: the pipeline group does not match the model's stages");
  write = write && me == 0;  // stage 0 writes; the other stages send what they hold first
  const auto specs = model::LlamaParamSpecs(c);
  std::vector<std::vector<float>> f32;
  std::vector<std::vector<uint16_t>> bf16;
  std::vector<TensorToWrite> tensors;
  f32.reserve(specs.size());
  bf16.reserve(specs.size());
  for (const auto& spec : specs) {
    int owner = 0;  // the first stage holding it (a tied embedding: stage 0)
    while (owner < pps && !model::StageHolds(spec.name, c, model::StageSpec{pps, owner, stage.vpp, stage.last_layers, stage.stage_layers})) ++owner;
    if (owner == pps) return absl::InternalError(absl::StrCat("export: no stage holds ", spec.name));
    std::vector<float> global;
    if (me == owner) {
      model::Param* p = model.Find(spec.name);
      if (p == nullptr) return absl::InternalError(absl::StrCat("export: stage ", me, " lacks ", spec.name));
      TESSERA_ASSIGN_OR_RETURN(global, model.GatherGlobal(*p, false));  // every TP rank of the stage
    }
    if (owner != 0 && (me == owner || me == 0)) {
      int64_t n = 1;
      for (int64_t d : spec.shape) n *= d;
      if (me == 0) {
        global.resize(n);
        TESSERA_RETURN_IF_ERROR(pp->Recv(global.data(), n, runtime::DType::kF32, owner));
      } else {
        TESSERA_RETURN_IF_ERROR(pp->Send(global.data(), n, runtime::DType::kF32, 0));
      }
    }
    if (!write) continue;
    f32.push_back(std::move(global));
    const auto& v = f32.back();
    if (dtype == "BF16") {
      bf16.emplace_back(v.size());
      for (size_t i = 0; i < v.size(); ++i) bf16.back()[i] = runtime::FloatToBf16(v[i]);
      tensors.push_back({spec.name, dtype, spec.shape, bf16.back().data(), v.size() * 2, {}});
    } else {
      tensors.push_back({spec.name, dtype, spec.shape, v.data(), v.size() * 4, {}});
    }
  }
  if (!write) return absl::OkStatus();
  const std::string arch = absl::StrCat(c.qkv_bias ? "Qwen2" : "Llama", c.value_head ? "ForTokenClassification" : "ForCausalLM");
  json cfg = {{"architectures", {arch}},
              {"model_type", c.qkv_bias ? "qwen2" : "llama"},
              {"vocab_size", c.vocab},
              {"hidden_size", c.hidden},
              {"intermediate_size", c.ffn},
              {"num_hidden_layers", c.layers},
              {"num_attention_heads", c.heads},
              {"num_key_value_heads", c.kv_heads},
              {"head_dim", c.HeadDim()},
              {"hidden_act", "silu"},
              {"rms_norm_eps", c.norm_eps},
              {"rope_theta", c.rope_base},
              {"tie_word_embeddings", c.tie_embeddings},
              {"torch_dtype", dtype == "BF16" ? "bfloat16" : "float32"},
              {"max_position_embeddings", 4096}};
  if (!c.qkv_bias) cfg["attention_bias"] = false;
  if (c.value_head) cfg["id2label"] = {{"0", "LABEL_0"}}, cfg["label2id"] = {{"LABEL_0", 0}};  // one label: the value
  TESSERA_RETURN_IF_ERROR(MakeDirs(dir));
  TESSERA_RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}}));
  return WriteFileAtomic(dir + "/config.json", cfg.dump(2));
}

}  // namespace tessera::checkpoint
