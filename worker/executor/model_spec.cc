#include "worker/executor/model_spec.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/util.h"
#include "common/model/hf_config.h"

namespace tessera::executor {

absl::StatusOr<model::LlamaConfig> ModelConfigFromSpec(const v1::JobSpec& spec, v1::DeviceType device) {
  const auto& m = spec.model();
  model::LlamaConfig config;
  if (!m.hf_dir().empty()) {  // the dims from the Hugging Face directory
    TESSERA_ASSIGN_OR_RETURN(config, model::ReadHfConfig(m.hf_dir()));
  } else {
    config.vocab = m.vocab_size(), config.hidden = m.hidden(), config.layers = m.num_layers();
    config.heads = m.num_heads(), config.kv_heads = m.num_kv_heads(), config.head_dim = m.head_dim(), config.ffn = m.ffn();
    if (m.rope_base() > 0) config.rope_base = static_cast<float>(m.rope_base());
    config.tie_embeddings = m.tie_embeddings(), config.qkv_bias = m.qkv_bias();
  }
  // Mixed precision by default on GPUs (as Megatron's --bf16 / FSDP's MixedPrecision);
  // the CPU oracle stays f32 (bf16 on the CPU is emulated through f32: slower, no gain).
  const std::string& precision = spec.train().precision();
  config.dtype = precision == "bf16" || ((precision.empty() || precision == "auto") && device == v1::DEVICE_TYPE_GPU)
                     ? tessera::DType::kBF16
                     : tessera::DType::kF32;
  return config;
}

namespace {
// model.tokenizer, or model.hf_dir when it holds a tokenizer.json, or "" (bytes).
std::string TokenizerPath(const v1::ModelShape& m) {
  if (m.tokenizer() == "byte") return "";
  if (!m.tokenizer().empty()) return m.tokenizer();
  return !m.hf_dir().empty() && ReadFile(m.hf_dir() + "/tokenizer.json").ok() ? m.hf_dir() : "";
}
}  // namespace

absl::Status CopyTokenizerFiles(const v1::ModelShape& m, const std::string& to) {
  const std::string path = TokenizerPath(m);
  if (path.empty()) return absl::OkStatus();
  std::error_code ec;
  const bool is_file = !std::filesystem::is_directory(path, ec);
  const std::string dir = is_file ? path.substr(0, path.rfind('/')) : path;
  TESSERA_ASSIGN_OR_RETURN(std::string tok, ReadFile(is_file ? path : dir + "/tokenizer.json"));
  TESSERA_RETURN_IF_ERROR(WriteFileAtomic(to + "/tokenizer.json", tok));
  for (const char* f : {"tokenizer_config.json", "generation_config.json", "special_tokens_map.json"})
    if (auto text = ReadFile(dir + "/" + f); text.ok()) TESSERA_RETURN_IF_ERROR(WriteFileAtomic(to + "/" + f, *text));
  return absl::OkStatus();
}

absl::StatusOr<tokenizer::ModelText> ModelTextFromSpec(const v1::ModelShape& m, int64_t model_vocab) {
  auto text = tokenizer::LoadModelText(TokenizerPath(m));
  if (!text.ok()) return absl::Status(text.status().code(), absl::StrCat("model.tokenizer: ", text.status().message()));
  if (text->tokenizer->vocab_size() > model_vocab)
    return absl::InvalidArgumentError(absl::StrCat("model.tokenizer: ", text->tokenizer->name(), " has ",
                                                   text->tokenizer->vocab_size(), " tokens; the model's vocabulary has ",
                                                   model_vocab));
  return text;
}

}  // namespace tessera::executor
