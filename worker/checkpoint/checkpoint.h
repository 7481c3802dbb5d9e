// Sharded training checkpoints (docs/design.md §6).
//
// Layout on disk, under a checkpoint directory D:
//   D/step-00000042/rank-00003.safetensors   what rank 3 holds (parameters and AdamW moments, f32)
//   D/step-00000042/rank-00003.sha256        its size and SHA-256
//   D/step-00000042/metadata.json            every global tensor -> its shards, the step, the layout
//   D/latest                                 "step-00000042": the last committed checkpoint
// A shard is elements [begin, begin + len) of the flattened TP-local tensor of TP rank r
// (of tp_size, split along tp_dim; tp_dim -1: not TP-sharded) — a slice index of
// model::TpSplitOf, so with KV heads replicated over TP, tp_size is the KV heads and r the
// head. Who writes what follows
// from the layout: a value is written by DP rank 0 (ZeRO-3: each DP rank its slice), the
// moments by DP rank 0 (ZeRO >= 1: each its slice); a tensor TP ranks share (or a
// replicated KV head), by the first TP rank holding it;
// under PP, by the stage holding it (a tied embedding by the first stage).
//
// Saving is atomic: everything goes into D/step-N.tmp, fsynced; rank 0 writes the
// metadata, renames the directory to D/step-N, fsyncs D and then replaces D/latest. A
// crash at any point leaves the previous `latest` valid. Loading reads any layout's
// checkpoint into any other (it assembles each global tensor and keeps this rank's part),
// checks file sizes and SHA-256 sums and every shard's bounds, and restores the step (the
// data position and LR follow from it; the model has no other random state).
//
// Every rank of the training group (TP x DP) calls Save and Load together; a failure on
// any rank fails the call on every rank (no rank is left waiting).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/train/trainer.h"
#include "worker/model/llama.h"

namespace tessera::checkpoint {

struct Group {
  model::Llama* model = nullptr;
  engine::Trainer* trainer = nullptr;
  comm::Communicator* tp = nullptr;  // null: tp = 1
  comm::Communicator* dp = nullptr;  // the DP (x CP) group; null: dp = 1
  comm::Communicator* pp = nullptr;  // the pipeline group; null: one stage (each stage writes its parameters)
};

// "step-00000042"
std::string StepDirName(int64_t step);

// With keep > 0, after the commit rank 0 prunes dir to the newest `keep` checkpoints
// (PruneCheckpoints); a prune that fails is logged, not returned: the save itself stands.
absl::Status SaveCheckpoint(const std::string& dir, int64_t step, const Group& g, int keep = 0);

// Removes the committed step-N directories of dir beyond the newest `keep` by step,
// never the one dir/latest names (a job resumed from an earlier step keeps it), nor
// anything else in dir (a save in progress, step-N.tmp; other files). Returns the names
// removed, oldest first. keep <= 0 removes nothing; so does a `latest` that cannot be
// read (its error is returned: what it protects is unknown).
absl::StatusOr<std::vector<std::string>> PruneCheckpoints(const std::string& dir, int keep);

// The directory D/latest names; NOT_FOUND when there is none yet.
absl::StatusOr<std::string> LatestCheckpoint(const std::string& dir);

// Loads a committed checkpoint directory (D/step-N) into this rank; returns N. Without a
// trainer (inference) only the weights are loaded, into the model.
absl::StatusOr<int64_t> LoadCheckpoint(const std::string& path, const Group& g);

}  // namespace tessera::checkpoint
