// `tessera plan`: what a training layout costs each rank — memory of parameters,
// gradients, optimizer state and activations, and the bytes each rank sends per step —
// from the model's shape alone, following what this engine allocates (f32 parameters,
// gradients and AdamW moments; see worker/train/trainer.h, worker/model/llama.h):
//   parameters  4 B x this rank's TP shard (ZeRO-3, and ZeRO-1/2 under mixed precision:
//               its DP slice of it) + under mixed precision 2 B x the shard for the
//               compute copy (ZeRO-3: of the gathered blocks only);
//   gradients   4 B x the shard (ZeRO-2/3: the DP slice and the block being reduced);
//   optimizer   8 B x the shard (m, v; ZeRO >= 1: the DP slice).
//               For Φ parameters over N DP ranks under mixed precision: 18Φ (ZeRO-0),
//               6Φ + 12Φ/N (1), 2Φ + 16Φ/N (2), 18Φ/N (3), plus padding and blocks;
//   activations what each layer's forward keeps for its backward, for one micro-batch of
//               micro_batch x seq_len tokens (split over CP, and over TP under SP), plus
//               a chunk of the LM head's logits (the engine makes them ~512 MiB at a
//               time; a critic's head has one value per token) and the peak of one
//               layer's backward; with
//               recomputation one input per layer plus one layer's activations. A
//               pipeline stage holds its layers' parameters and the activations of as
//               many chunk passes as its schedule keeps in flight (1F1B: pp - stage;
//               interleaved: Megatron's warm-up + 1; GPipe: all); the plan reports the
//               stage that needs the most.
// Communication counts bus bytes per rank and step as nccl-tests does (all-reduce
// 2(n-1)/n, all-gather and reduce-scatter (n-1)/n, ring hops 1).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/parallel/pipeline.h"
#include "common/model/config.h"
#include "common/parallel/layout.h"

namespace tessera::plan {

struct PlanInput {
  model::LlamaConfig config;
  parallel::Layout layout;
  int64_t seq_len = 0, micro_batch = 0, global_batch = 0;
  bool recompute = false;
  bool recompute_swiglu = false;  // TrainSpec.recompute_swiglu: the SwiGLU output not kept
  parallel::Schedule schedule = parallel::Schedule::kOneFOneB;  // pp > 1
};

struct RankMemory {
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0;
  // Of params + grads: the buffers ZeRO-2/3 hold only while a block runs (its gradient
  // buffer; ZeRO-3 also the gathered weights of the block and the next).
  int64_t block_buffers = 0;
  int64_t total() const { return params + grads + optimizer + activations; }
  int64_t states() const { return params + grads + optimizer; }  // the model states at a step's peak
};

struct CommVolume {  // bus bytes per rank per optimizer step (pp: activations and gradients sent)
  double tp = 0, cp = 0, dp = 0, pp = 0;
  double total() const { return tp + cp + dp + pp; }
};

struct Plan {
  PlanInput input;
  int stage = 0;                // the pipeline stage planned: the one that needs the most memory
  int64_t params_per_rank = 0;  // elements of this rank's TP shard
  RankMemory memory;
  CommVolume comm;
};

// INVALID_ARGUMENT naming the rule when the layout cannot run the model (docs/design.md §3).
absl::StatusOr<Plan> PlanTraining(const PlanInput& in);

// The rows of the LM head's logits made at once for `tokens` tokens: the engine's chunk
// (model::kHeadChunkElements elements of this rank's vocabulary) or fewer; 0 for a value
// head.
int64_t HeadLogitRows(const model::LlamaConfig& c, const parallel::Layout& l, int64_t tokens);
// The peak of a forward with no backward after it over `tokens` tokens (log-probs,
// values, scores): one layer's activations at a time, or the head's chunk of logits.
int64_t ForwardPassBytes(const model::LlamaConfig& c, const parallel::Layout& l, int64_t tokens);

// Pipeline compute balance (pp > 1): each pipeline rank's model FLOPs for one micro-batch
// (forward and backward: a layer 6 x its matmul parameters per token plus causal
// attention 6 Hq D s per token, the final norm's and LM head's 6 h V per token on the
// last virtual stage; the embedding, a lookup, counts nothing), under the layout's split
// and under the split that balances them — the ParallelLayout.stage_layers that makes
// the busiest rank's FLOPs least (layers handed one at a time to the least loaded rank),
// then within each rank the busiest virtual stage's (one at a time to its least loaded
// chunk). The head weighs ~4 layers of a Llama-3.2-1B-shaped model, so its stage wants
// fewer layers; FLOPs are a model of time, not a measurement.
struct StageBalance {
  std::vector<int> layers;             // the layout's split, per virtual stage
  std::vector<double> rank_flops;      // per pipeline rank, under it
  std::vector<int> balanced;           // the suggested stage_layers
  std::vector<double> balanced_flops;  // per pipeline rank, under it
};
absl::StatusOr<StageBalance> BalanceStages(const PlanInput& in);

// Every layout of `devices` ranks (tp, cp, pp, dp, ZeRO stage, recomputation; sp with
// tp; vpp 1, 1F1B) that runs the model and needs at most
// `memory_bytes` per rank, cheapest first: least memory-bound choices (no recomputation,
// lower ZeRO stage) and then the fewest bytes sent.
std::vector<Plan> ProposeLayouts(const PlanInput& base, int devices, int64_t memory_bytes);

}  // namespace tessera::plan
