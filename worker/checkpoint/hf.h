// Hugging Face Llama / Qwen2 / Qwen3 model directories: config.json plus model.safetensors,
// or shards listed by model.safetensors.index.json. Our parameter names are Hugging
// Face's (common/model/config.h), and our RoPE rotates halves as theirs does, so weights
// map one to one.
//
// The shape comes from model::ReadHfConfig (common/model/hf_config.h), which says what is
// supported and refuses, naming the key, what is not. Critics (LlamaConfig::value_head)
// are *ForTokenClassification with one label (score.weight), and a critic imports a
// causal LM's directory too, keeping its own value head (PPO starts its critic so).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "common/model/hf_config.h"
#include "worker/model/llama.h"

namespace tessera::checkpoint {

// Loads every parameter from the directory's safetensors — model.safetensors, or the
// files model.safetensors.index.json maps — into the model (any TP layout: each rank
// reads only its slice of each tensor; F32, BF16 and F16 files). The tensors' shapes must
// match the model's. Reads of about piece_bytes (consecutive rows of a slice) run on up
// to 8 threads into the backend's staging buffers (page-locked on a GPU) while the
// calling thread uploads them in order, as stored, and widens them on the device.
// A critic's value head (score.weight) keeps its initialization where the directory has
// none (a critic started from a causal LM); a reward model's (sequence_score) must be there.
// Call before Trainer::Create (ZeRO-3 shards the full values it finds).
inline constexpr int64_t kDefaultImportPieceBytes = int64_t{32} << 20;  // 32 MiB
absl::Status ImportHf(const std::string& dir, model::Llama& model, int64_t piece_bytes = kDefaultImportPieceBytes);

// Writes config.json (the family's model_type and architecture, the RoPE scaling in
// transformers 4's rope_scaling spelling, which transformers 5 reads too) and the weights
// (dtype "BF16" or "F32") into dir, as save_pretrained lays them out: model.safetensors,
// or above max_shard_bytes model-0000k-of-0000n.safetensors files of consecutive tensors
// with model.safetensors.index.json; an earlier export's weight files are removed first.
// Streamed: each tensor is gathered and cast to dtype on the device, then written by a
// writer thread while the next one is gathered (host memory: two of the largest tensor).
// Every TP rank calls it (the weights are gathered over TP; under ZeRO-3 call
// Trainer::GatherParams first); only ranks with `write` set write. A pipeline stage (pp:
// its pipeline group) sends the parameters it is the first to hold to stage 0, whose
// ranks with `write` set write the whole model; every stage calls it. A failed write
// removes the weight files it wrote and still takes part in the other ranks' remaining
// gathers before returning its error.
inline constexpr int64_t kDefaultMaxShardBytes = int64_t{5} << 30;  // 5 GiB
absl::Status ExportHf(const std::string& dir, model::Llama& model, const std::string& dtype, bool write,
                      comm::Communicator* pp = nullptr, int64_t max_shard_bytes = kDefaultMaxShardBytes);

}  // namespace tessera::checkpoint
