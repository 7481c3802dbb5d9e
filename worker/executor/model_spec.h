// The job's model section read on an executor: the model's dims and compute dtype, and
// its text side (tokenizer and chat template). Shared by every session kind (training,
// rollout pools, batch generation).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "tessera/v1/common.pb.h"
#include "worker/tokenizer/model_text.h"

namespace tessera::executor {

// The model's dims (the job's model section, or model.hf_dir's config.json) and compute
// dtype (train.precision; auto: bf16 on GPUs, f32 on the CPU).
absl::StatusOr<model::LlamaConfig> ModelConfigFromSpec(const v1::JobSpec& spec, v1::DeviceType device);
// The model's text side (model.tokenizer; default model.hf_dir's tokenizer.json when it
// has one, else the byte tokenizer). Errors name model.tokenizer; a tokenizer with more
// tokens than the model's vocabulary is refused.
absl::StatusOr<tokenizer::ModelText> ModelTextFromSpec(const v1::ModelShape& m, int64_t model_vocab);
// The model's tokenizer files (tokenizer.json and, where present, tokenizer_config.json,
// generation_config.json, special_tokens_map.json) copied into the exported Hugging Face
// directory `to`, as save_pretrained writes them; nothing for the byte tokenizer.
absl::Status CopyTokenizerFiles(const v1::ModelShape& m, const std::string& to);

}  // namespace tessera::executor
