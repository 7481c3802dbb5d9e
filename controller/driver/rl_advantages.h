// What the driver makes of the groups' per-token answers (docs/design.md §8). PPO's
// advantages where the critic is a group of its own: the driver
// has the step's samples with the critic's values (old_value), the actor's old log-probs
// (old_logp) and, with a KL penalty in the reward, the reference's (ref_logp) — the
// per-token tensors of worker/executor/rl_batch.h — and makes the advantages and the
// returns, as the actor's in-process PPO step makes them.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tessera/v1/common.pb.h"

namespace tessera::controller {

// Adds `advantage` and `returns` [N, W] f32 to `batch`: its rows split in `actor_dp`
// equal shards (as the actor's DP ranks get them), each shard's responses through
// rl::ComputePpoAdvantages (outcome reward on the last token with rl.overlong_buffer's
// penalty, rl.kl_reward_coef's penalty by rl.kl_reward_estimator, GAE with rl.gamma and
// rl.gae_lambda, whitened over the shard's tokens).
// `reward_kl`: the penalty's mean KL over the shards. INVALID_ARGUMENT naming the tensor
// when one is missing or misshapen.
absl::Status AddPpoAdvantages(const v1::RlSpec& rl, int actor_dp, v1::TensorBatch* batch, double* reward_kl);

// A reward group's scores (tensor "score" [N] f32 of `scored`, N the batch's samples) as
// the samples' rewards: the batch's "reward" replaced; returns their mean.
// INVALID_ARGUMENT naming the tensor when one is missing or misshapen.
absl::StatusOr<double> TakeScores(const v1::TensorBatch& scored, v1::TensorBatch* batch);

}  // namespace tessera::controller
