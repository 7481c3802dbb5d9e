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
#include "common/dtype.h"

namespace tessera::checkpoint {
namespace {
using nlohmann::json;

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

namespace {
// rope_scaling as transformers 4 spells it (transformers 5 reads it too).
json RopeScalingJson(const model::RopeScaling& s) {
  using T = model::RopeScaling::Type;
  json r = {{"rope_type", model::RopeTypeName(s.type)}, {"factor", s.factor}};
  if (s.original_max_positions > 0) r["original_max_position_embeddings"] = s.original_max_positions;
  if (s.type == T::kLlama3) r["low_freq_factor"] = s.low_freq_factor, r["high_freq_factor"] = s.high_freq_factor;
  if (s.type == T::kYarn) {
    r["beta_fast"] = s.beta_fast, r["beta_slow"] = s.beta_slow, r["truncate"] = s.truncate;
    if (s.attention_factor > 0) r["attention_factor"] = s.attention_factor;
    if (s.mscale > 0) r["mscale"] = s.mscale;
    if (s.mscale_all_dim > 0) r["mscale_all_dim"] = s.mscale_all_dim;
  }
  return r;
}
}  // namespace

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
        TESSERA_RETURN_IF_ERROR(pp->Recv(global.data(), n, tessera::DType::kF32, owner));
      } else {
        TESSERA_RETURN_IF_ERROR(pp->Send(global.data(), n, tessera::DType::kF32, 0));
      }
    }
    if (!write) continue;
    f32.push_back(std::move(global));
    const auto& v = f32.back();
    if (dtype == "BF16") {
      bf16.emplace_back(v.size());
      for (size_t i = 0; i < v.size(); ++i) bf16.back()[i] = tessera::FloatToBf16(v[i]);
      tensors.push_back({spec.name, dtype, spec.shape, bf16.back().data(), v.size() * 2, {}});
    } else {
      tensors.push_back({spec.name, dtype, spec.shape, v.data(), v.size() * 4, {}});
    }
  }
  if (!write) return absl::OkStatus();
  const char* family = c.qk_norm ? "Qwen3" : c.qkv_bias ? "Qwen2" : "Llama";
  const std::string arch = absl::StrCat(family, c.value_head ? "ForTokenClassification" : "ForCausalLM");
  json cfg = {{"architectures", {arch}},
              {"model_type", c.qk_norm ? "qwen3" : c.qkv_bias ? "qwen2" : "llama"},
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
              {"max_position_embeddings", c.max_positions > 0 ? c.max_positions : 4096}};
  if (!c.qkv_bias) cfg["attention_bias"] = false;
  if (c.rope_scaling.type != model::RopeScaling::Type::kDefault) cfg["rope_scaling"] = RopeScalingJson(c.rope_scaling);
  if (c.value_head) cfg["id2label"] = {{"0", "LABEL_0"}}, cfg["label2id"] = {{"LABEL_0", 0}};  // one label: the value
  TESSERA_RETURN_IF_ERROR(MakeDirs(dir));
  TESSERA_RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", tensors, {{"format", "pt"}}));
  return WriteFileAtomic(dir + "/config.json", cfg.dump(2));
}

}  // namespace tessera::checkpoint
