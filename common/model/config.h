// Llama-family model configuration (docs/design.md §6): Llama 2/3.x, Qwen2/2.5 (QKV bias) and
// Qwen3 (per-head q/k RMSNorm) shapes, optional tied embeddings, RoPE with the scalings
// released configs use (common/model/rope.h). Parameter names follow Hugging Face's so checkpoints map
// one to one (model.layers.{i}.self_attn.q_proj.weight, ...).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace tessera::model {

// RoPE frequency scaling, as Hugging Face's rope_scaling / rope_parameters name it
// (common/model/rope.h computes the frequencies exactly as transformers does).
struct RopeScaling {
  enum class Type { kDefault, kLinear, kDynamic, kYarn, kLlama3 };
  Type type = Type::kDefault;
  double factor = 1;                    // linear, dynamic, yarn (0: max_positions / original_max_positions), llama3
  int64_t original_max_positions = 0;   // original_max_position_embeddings (llama3, yarn; 0: max_positions)
  double low_freq_factor = 1, high_freq_factor = 4;  // llama3
  double beta_fast = 32, beta_slow = 1;              // yarn
  double attention_factor = 0;          // yarn: the cos/sin factor (0: from factor, mscale, mscale_all_dim)
  double mscale = 0, mscale_all_dim = 0;  // yarn (0: unset)
  bool truncate = true;                 // yarn: the correction range rounded outwards
};
const char* RopeTypeName(RopeScaling::Type t);

// The LM head's logits are made in chunks of this many elements of a rank's vocabulary
// shard (worker/model/llama.h; ~512 MiB of bf16); the planner counts one chunk.
inline constexpr int64_t kHeadChunkElements = int64_t{1} << 28;

struct LlamaConfig {
  int64_t vocab = 0;
  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;  // 0: hidden / heads
  int64_t ffn = 0;       // SwiGLU intermediate size
  float rope_base = 10000.f;
  RopeScaling rope_scaling;
  int64_t max_positions = 0;  // max_position_embeddings (dynamic and yarn scaling read it; 0: unset)
  float norm_eps = 1e-5f;
  bool tie_embeddings = false;
  bool qkv_bias = false;  // Qwen2
  // Qwen3: RMSNorm over each head of q and of k (q_norm / k_norm weights [head_dim],
  // shared by the heads) after the projections and before RoPE.
  bool qk_norm = false;
  // A critic (PPO): the LM head is replaced by a value head, score.weight [1, hidden] —
  // one value per token from the final norm's output (Hugging Face's
  // LlamaForTokenClassification with one label), replicated over TP. Not tied.
  bool value_head = false;
  // A reward model (RL's reward group): the same value head, its score read at each
  // sequence's last token (Hugging Face's LlamaForSequenceClassification with one label).
  // Set together with value_head; only Hugging Face import and export read it.
  bool sequence_score = false;
  // Compute dtype of activations and of the weights' compute copies: f32, or bf16 (mixed
  // precision: master weights, gradients and optimizer state stay f32).
  tessera::DType dtype = tessera::DType::kF32;

  int64_t HeadDim() const { return head_dim > 0 ? head_dim : (heads > 0 ? hidden / heads : 0); }
  // INVALID_ARGUMENT naming the field and the expected value when a size is missing or
  // inconsistent (heads % kv_heads, hidden % heads without head_dim, ...).
  absl::Status Validate() const;
  // Parameter count (tied embeddings counted once).
  int64_t NumParams() const;
  // INVALID_ARGUMENT naming the numbers unless tensor parallelism of degree tp can split
  // heads, the MLP and the vocabulary evenly, and the kv heads evenly or — tp a multiple
  // of kv_heads — replicate them (every group of tp / kv_heads ranks shares one KV head).
  absl::Status ValidateTensorParallel(int tp) const;
  // The KV heads one rank of tensor parallelism of degree tp holds: kv_heads / tp, or 1
  // when tp exceeds kv_heads (replicated).
  int64_t LocalKvHeads(int tp) const { return kv_heads >= tp ? kv_heads / tp : 1; }
};

// One parameter: its Hugging Face name and (global) shape. Linear weights are [out, in].
// shard_dim: the dimension tensor parallelism splits (Megatron: column-parallel q/k/v,
// gate/up and their biases and the vocab-parallel embedding and LM head split dim 0;
// row-parallel o and down split dim 1); -1: replicated (norms).
// max_parts: the most slices it splits into (0: no limit): the KV heads for k/v weights
// and biases, so that with more TP ranks than KV heads each head is one slice that
// tp / kv_heads ranks hold alike (Megatron's and vLLM's KV-head replication).
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  int shard_dim = -1;
  int64_t max_parts = 0;
};

// How tensor parallelism of degree tp lays a parameter out on TP rank `rank`: `parts`
// distinct slices along `dim` (-1: not split), this rank holding slice `index`; each slice
// held alike by `replicas` ranks (rank = index * replicas + replica; a parameter TP does
// not split: dim -1, one part, tp replicas). Every TP-sharded
// reader and writer (the model, the trainer's norm, checkpoints, weight sync) goes by it.
struct TpSplit {
  int dim = -1;
  int parts = 1, index = 0;
  int replicas = 1, replica = 0;
};
TpSplit TpSplitOf(const ParamSpec& s, int tp, int rank);

// Every parameter of the model, in a fixed order: embedding, then per layer (input
// norm, q/k/v (+bias), q/k norm (Qwen3), o, post-attention norm, gate, up, down), final norm, LM head
// (absent when tied).
std::vector<ParamSpec> LlamaParamSpecs(const LlamaConfig& c);

// This rank's place in a pipeline (docs/design.md §6): pp stages, vpp model chunks per rank;
// chunk c of rank r is virtual stage c·pp + r and holds layers [s·L/(pp·vpp), (s+1)·L/(pp·vpp)),
// or with last_layers > 0 / stage_layers an uneven split (parallel::VirtualStageLayers).
// Virtual stage 0 also holds the embedding, the last one the final norm and the LM head
// (with tied embeddings it keeps its own copy of the embedding, whose gradient the
// trainer sums with the first stage's).
struct StageSpec {
  int pp = 1, rank = 0, vpp = 1;
  int last_layers = 0;             // ParallelLayout.last_stage_layers
  std::vector<int> stage_layers{};  // ParallelLayout.stage_layers (one count per virtual stage)
};
// Layers [begin, end) of this rank's chunk c.
std::pair<int64_t, int64_t> ChunkLayers(const LlamaConfig& c, const StageSpec& s, int chunk);
// The pipeline rank whose chunks hold a parameter: a layer's by the rule above, the
// embedding 0, the final norm and LM head pp - 1 (checkpoints write a tied embedding
// from stage 0 only).
int StageOf(const std::string& param, const LlamaConfig& c, const StageSpec& s);
// Whether stage s.rank holds the parameter (the last stage also a tied embedding).
bool StageHolds(const std::string& param, const LlamaConfig& c, const StageSpec& s);

// This TP rank's part of a global tensor ([rows] or [rows, cols]) split along dim
// (dim < 0 or parts 1: all of it).
std::vector<float> TpShardOf(const std::vector<float>& global, const std::vector<int64_t>& shape, int dim, int parts,
                             int index);

}  // namespace tessera::model
