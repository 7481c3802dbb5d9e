// The sessions of a grpo / ppo job's groups beside the actor, by role (docs/design.md
// §8). Each starts from the actor's starting weights as the actor's session does
// (model.hf_dir, train.checkpoint.load or the seeded initialization), on its own layout:
//  - RlReferenceSession (role reference): the frozen reference policy — its compute copy
//    only (model::Llama::Freeze), no optimizer; RlForward answers ref_logp.
//  - RlCriticSession (role critic, ppo): the value model — the starting weights under a
//    fresh one-output head, as the actor's in-process critic — with its own optimizer at
//    rl.critic_lr; RlForward answers old_value, RlUpdate takes PPO's value steps on the
//    driver's returns. With train.checkpoint.dir it saves under dir/critic (named by the
//    RL step, as the actor's) and resumes from the step the driver names (the actor's).
//  - RlRewardSession (role reward): a reward model — rl.reward_model's sequence
//    classifier (its own Hugging Face directory and shape), frozen; RlForward answers each
//    sample's score (engine::SequenceScores), which replaces the rule verifier's reward.
// Threading: one call at a time (the executor serializes them).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "tessera/v1/executor_service.pb.h"
#include "worker/executor/train_session.h"

namespace tessera::executor {

class RlReferenceSession final : public TrainSession {
 public:
  static absl::StatusOr<std::unique_ptr<RlReferenceSession>> Create(const v1::JobSpec& spec, GroupComms& comms,
                                                                    v1::DeviceType device, int device_index);
  // ref_logp of this DP rank's samples of RL step `step`.
  absl::StatusOr<v1::RlForwardStats> Forward(int64_t step, const v1::TensorBatch& samples, v1::TensorBatch* out);

 private:
  RlReferenceSession() = default;
  v1::RlSpec rl_;
};

class RlCriticSession final : public TrainSession {
 public:
  // `resume_step` > 0: the critic's checkpoint of that step, under train.checkpoint.dir/critic.
  static absl::StatusOr<std::unique_ptr<RlCriticSession>> Create(const v1::JobSpec& spec, GroupComms& comms,
                                                                 v1::DeviceType device, int device_index,
                                                                 int64_t resume_step);
  // old_value of this DP rank's samples of RL step `step`.
  absl::StatusOr<v1::RlForwardStats> Forward(int64_t step, const v1::TensorBatch& samples, v1::TensorBatch* out);
  // The critic's updates of RL step `step` on this DP rank's samples with their old_value
  // and returns (engine::PpoCriticUpdate), then its checkpoint; the statistics in the
  // response's `critic`.
  absl::StatusOr<v1::RlUpdateResponse> Update(int64_t step, const v1::TensorBatch& samples);

 private:
  RlCriticSession() = default;
  v1::RlSpec rl_;
};

class RlRewardSession final : public TrainSession {
 public:
  static absl::StatusOr<std::unique_ptr<RlRewardSession>> Create(const v1::JobSpec& spec, GroupComms& comms,
                                                                 v1::DeviceType device, int device_index);
  // The score [N] f32 of this DP rank's samples of RL step `step`.
  absl::StatusOr<v1::RlForwardStats> Forward(int64_t step, const v1::TensorBatch& samples, v1::TensorBatch* out);

 private:
  RlRewardSession() = default;
  v1::RlSpec rl_;
};

}  // namespace tessera::executor
