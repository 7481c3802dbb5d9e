// The model shape of a Hugging Face Llama / Qwen2 directory, read from its config.json:
// what `tessera plan`, the controller's admission check and the executors' import share.
//
// Supported: model_type llama and qwen2 (q/k/v bias), grouped-query attention, head_dim,
// tied embeddings, rope_theta, rms_norm_eps; critics (LlamaConfig::value_head) as
// *ForTokenClassification with one label. Refused with a message naming the key:
// rope_scaling (e.g. Llama 3.1's "llama3"), attention_bias / mlp_bias on Llama (biases on
// o_proj / the MLP), hidden activations other than silu, sliding windows.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/model/config.h"

namespace tessera::model {

// The model shape from dir/config.json (INVALID_ARGUMENT or UNIMPLEMENTED naming the key).
absl::StatusOr<LlamaConfig> ReadHfConfig(const std::string& dir);

}  // namespace tessera::model
