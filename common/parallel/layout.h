// Parallel layout: the rank arithmetic of docs/design.md §3 as pure functions.
//
// Ranks are ordered tp-cp-dp-pp with tp fastest (Megatron's RankGenerator):
//   rank = tp_r + tp*(cp_r + cp*(dp_r + dp*pp_r))
// so a TP group is a run of contiguous ranks, which the scheduler keeps on one node.
// Nothing here touches a network or a global: the executor and the scheduler call
// these with the layout they were given.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tessera::parallel {

struct Layout {
  int tp = 1;
  int cp = 1;
  int dp = 1;
  int pp = 1;
  int vpp = 1;
  bool sp = false;
  int zero = 0;
  int last_stage_layers = 0;  // 0: an even split (see VirtualStageLayers)
  std::vector<int> stage_layers{};  // empty, or the layers of each of the pp·vpp virtual stages

  int world() const { return tp * cp * dp * pp; }
  std::string ToString() const;
};

// Model and batch dimensions validated against the layout; 0 means "not given"
// and skips the rules that need it.
struct ModelShape {
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int vocab_size = 0;
  int seq_len = 0;
  int global_batch = 0;
  int micro_batch = 0;
};

// Every rule of docs/design.md §3 that needs no placement information. `world` is the
// number of devices the group was given. Errors are INVALID_ARGUMENT and name the
// numbers involved.
absl::Status ValidateLayout(const Layout& layout, int world, const ModelShape& model);

struct Coords {
  int tp = 0, cp = 0, dp = 0, pp = 0;
};

Coords CoordsOf(const Layout& layout, int rank);
int RankOf(const Layout& layout, const Coords& c);

enum class GroupKind { kTp, kCp, kDp, kPp, kDpCp, kMp, kEmbedding, kWorld };
constexpr GroupKind kAllGroupKinds[] = {GroupKind::kTp,   GroupKind::kCp,   GroupKind::kDp,
                                        GroupKind::kPp,   GroupKind::kDpCp, GroupKind::kMp,
                                        GroupKind::kEmbedding, GroupKind::kWorld};
const char* GroupKindName(GroupKind kind);
absl::StatusOr<GroupKind> ParseGroupKind(const std::string& name);

// All groups of one kind, each a sorted list of global ranks, in a deterministic
// order (by the smallest rank). The groups of a kind partition the world, except
// kEmbedding, which holds the first and last pipeline stage of each PP group.
std::vector<std::vector<int>> BuildGroups(const Layout& layout, GroupKind kind);

// The group of `kind` that contains `rank` (empty for an embedding group that
// `rank` is not part of, i.e. a middle pipeline stage), and the index of that
// group among BuildGroups(layout, kind).
struct GroupMembership {
  std::vector<int> ranks;
  int index = -1;        // which group of this kind
  int rank_in_group = -1;
};
GroupMembership GroupOf(const Layout& layout, GroupKind kind, int rank);

// Layers of virtual stage s = chunk*pp + pp_rank; contiguous blocks of
// num_layers/(pp*vpp) layers. Returns [first, last) for each model chunk of pp_rank.
std::vector<std::pair<int, int>> LayersOfRank(const Layout& layout, int num_layers, int pp_rank);
// Layers [begin, end) of virtual stage v (0 .. stages-1; chunk c of pipeline rank r is
// virtual stage c·pp + r). With `stage_layers` (one count per virtual stage, Megatron's
// --pipeline-model-parallel-layout) the counts in order — a stage may hold none: the
// first then runs only the embedding, the last only the final norm, the LM head and
// the loss. Otherwise with last_stage_layers 0 num_layers / stages each; with
// last_stage_layers > 0 that many on the last one and the rest over the others, the
// first ones taking one more each where they do not divide evenly (Megatron's uneven
// pipeline split: the last stage also runs the LM head and the loss). ValidateLayout
// checks the numbers.
std::pair<int64_t, int64_t> VirtualStageLayers(int64_t num_layers, int stages, int64_t last_stage_layers,
                                               const std::vector<int>& stage_layers, int v);
// INVALID_ARGUMENT naming the numbers unless num_layers splits over pp·vpp virtual stages
// as VirtualStageLayers does (evenly; every stage at least one layer with
// last_stage_layers; or stage_layers: pp·vpp counts, none negative, summing to
// num_layers, and not with last_stage_layers).
absl::Status CheckLayerSplit(int64_t num_layers, int pp, int vpp, int64_t last_stage_layers,
                             const std::vector<int>& stage_layers);

// The model FLOPs per token, forward and backward, of one decoder layer (6 x its matmul
// parameters, plus causal attention's 6 Hq D s) and of what the last virtual stage runs
// besides its layers (the final norm and LM head: 6 h V): the costs a pipeline split
// balances. Dimensions as in the job's model shape; the embedding, a lookup, costs nothing.
struct StageCosts {
  double layer = 0, head = 0;
};
StageCosts LlamaStageCosts(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t ffn,
                           int64_t vocab, int64_t seq_len);
// The stage_layers (pp·vpp counts summing to num_layers) that make the busiest pipeline
// rank's cost least: layers handed one at a time to the least loaded rank (the last
// virtual stage's rank starting with the head), then within each rank one at a time to
// its least loaded chunk (the earliest on ties). `layout.stage_layers: auto` and
// `tessera plan`'s suggestion. Needs pp >= 1, vpp >= 1, num_layers >= 0.
std::vector<int> BalancedStageLayers(int64_t num_layers, int pp, int vpp, const StageCosts& costs);

}  // namespace tessera::parallel
