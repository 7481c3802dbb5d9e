// What the driver makes of the groups' per-token answers (docs/design.md §8). PPO's
// advantages where the critic is a group of its own: the driver
// has the step's samples with the critic's values (old_value), the actor's old log-probs
// (old_logp) and, with a KL penalty in the reward, the reference's (ref_logp) — the
// per-token tensors of worker/executor/rl_batch.h — and makes the advantages and the
// returns, as the actor's in-process PPO step makes them.
#pragma once

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tessera/v1/common.pb.h"

namespace tessera::controller {

// Adds `advantage` and `returns` [N, W] f32 to `batch`: its rows split in `actor_dp`
// equal shards (as the actor's DP ranks get them), each shard's responses through
// rl::ComputePpoAdvantages (outcome reward on the last token with rl.overlong_buffer's
// penalty, rl.kl_reward_coef's penalty by rl.kl_reward_estimator, GAE with rl.gamma and
// rl.gae_lambda, whitened over the shard's tokens). A multi-turn batch's responses are
// the tokens its completion_mask marks sampled (observations are not steps of GAE).
// `reward_kl`: the penalty's mean KL over the shards. INVALID_ARGUMENT naming the tensor
// when one is missing or misshapen.
absl::Status AddPpoAdvantages(const v1::RlSpec& rl, int actor_dp, v1::TensorBatch* batch, double* reward_kl);

// A reward group's scores (tensor "score" [N] f32 of `scored`, N the batch's samples) as
// the samples' rewards: the batch's "reward" replaced; returns their mean.
// INVALID_ARGUMENT naming the tensor when one is missing or misshapen.
absl::StatusOr<double> TakeScores(const v1::TensorBatch& scored, v1::TensorBatch* batch);

// The tokens of a samples batch: the sum of its "prompt_len" and "completion_len" [N] i32.
absl::StatusOr<double> BatchTokens(const v1::TensorBatch& batch);

// DAPO's dynamic sampling (rl.filter_groups) over one step's generations: each
// generation's prompt groups (group_size consecutive rows of a samples batch, "reward" [N]
// among its tensors) whose rewards are all equal carry no signal and are set aside. Take
// gives `groups` groups — those with a signal in the order generated, then, where there
// are too few, set-aside ones in that order — as one batch of the generations' tensors.
class GroupFilter {
 public:
  GroupFilter(int groups, int group_size) : groups_(groups), group_size_(group_size) {}
  // INVALID_ARGUMENT naming the tensor when the batch's rows are not whole groups.
  absl::Status Add(v1::TensorBatch generated);
  bool full() const { return static_cast<int>(kept_.size()) >= groups_; }
  absl::StatusOr<v1::TensorBatch> Take();
  int kept() const { return static_cast<int>(kept_.size()); }  // groups with a signal so far
  int dropped() const { return static_cast<int>(dropped_.size()); }  // all-equal groups so far
  int filled() const { return filled_; }  // set-aside groups Take used to fill the batch

 private:
  int groups_, group_size_, filled_ = 0;
  std::vector<v1::TensorBatch> batches_;
  std::vector<std::pair<size_t, int64_t>> kept_, dropped_;  // (batch, group)
};

}  // namespace tessera::controller
