// The model shape of a Hugging Face Llama / Qwen2 / Qwen3 directory, read from its
// config.json: what `tessera plan`, the controller's admission check and the executors'
// import share.
//
// Supported: model_type llama (Llama 2 / 3.x), qwen2 (Qwen2 / 2.5: q/k/v bias) and qwen3
// (per-head q/k RMSNorm), grouped-query attention, head_dim independent of hidden / heads,
// tied embeddings, rope_theta, rms_norm_eps, max_position_embeddings, RoPE scaling in
// transformers 4's rope_scaling or 5's rope_parameters spelling (default, linear, dynamic,
// yarn, llama3: common/model/rope.h); critics (LlamaConfig::value_head) as
// *ForTokenClassification and reward models (also sequence_score) as
// *ForSequenceClassification, each with one label. Every other key is either inert (metadata,
// initialization, caching, token ids) or refused with UNIMPLEMENTED naming it — never
// silently ignored: other RoPE types (longrope, ...), partial rotary factors, attention /
// MLP biases on Llama and Qwen3, activations other than silu, sliding windows and
// layer types other than full attention, attention dropout.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/model/config.h"

namespace tessera::model {

// The model shape from dir/config.json (INVALID_ARGUMENT or UNIMPLEMENTED naming the key).
absl::StatusOr<LlamaConfig> ReadHfConfig(const std::string& dir);

}  // namespace tessera::model
