// The training session of a grpo or ppo job's actor (train_session.h). At creation: the
// frozen reference (the starting weights: a train.checkpoint.load warm start or the
// initialization; made when a KL term needs it and the job has no reference group),
// ppo's critic (the actor's shape with a value head, started from the actor's weights
// and a fresh head, with its own trainer at rl.critic_lr; unless the job has a critic
// group), and — when the job has no rollout group — a rollout engine on the
// actor's own model. With train.checkpoint.dir, a checkpoint after every save_every
// steps and the last one, named by the RL step (step + 1), the critic's under dir/critic;
// a resumed session (start_step() = N) loads the directory's latest into the actor —
// weights, AdamW moments, the optimizer's step count (N x epochs x mini-batches) — while
// the reference stays the warm start: steps N.. then repeat an uninterrupted run's.
// Calls: RolloutGenerate (colocated), RlUpdate, RlEval.
#pragma once

#include <memory>
#include <string>

#include "tessera/v1/executor_service.pb.h"
#include "worker/executor/environment_client.h"
#include "worker/executor/rl_prompts.h"
#include "worker/executor/train_session.h"
#include "worker/rl/grpo.h"
#include "worker/rl/ppo.h"
#include "worker/rollout/rollout.h"

namespace tessera::executor {

class RlActorSession final : public TrainSession {
 public:
  static absl::StatusOr<std::unique_ptr<RlActorSession>> Create(const v1::JobSpec& spec, GroupComms& comms,
                                                                v1::DeviceType device, int device_index);
  // Whether the session generates its own samples (no rollout group in the job).
  bool has_rollout() const { return rollout_ != nullptr; }
  // RL step `step`'s samples of this DP rank, from the session's own rollout engine
  // (GenerateSamples, rollout_pool.h); FAILED_PRECONDITION without one. The KV cache is
  // released after (RolloutEngine::ReleaseCache): training runs next on these devices.
  absl::StatusOr<v1::RolloutStats> RolloutGenerate(int64_t step, int refill, v1::TensorBatch* out);
  // Greedy accuracy of the current policy on this DP rank's share of held-out problems
  // [0, problems) (HeldOutEval, rl_prompts.h: the arithmetic operand pairs that no job
  // trains on, or rl.eval_data's), from the session's own rollout engine (its cache
  // released after, as RolloutGenerate).
  absl::StatusOr<v1::RlEvalResponse> RlEval(int64_t problems);
  // The update of RL step `step` (advantages, reference and old log-probs, the epochs of
  // mini-batch updates — engine::GrpoUpdate, or engine::PpoUpdate with the critic — and
  // the checkpoint) on this DP rank's samples (rollout_pool.h has the batch's tensors).
  // INVALID_ARGUMENT for a malformed batch or the wrong number of samples.
  // With the job's reference group the batch carries its ref_logp; with a critic group
  // (ppo) also old_logp and advantage (the driver's), and the update is the actor's half
  // (engine::PpoActorUpdate). INVALID_ARGUMENT when one of them is missing.
  absl::StatusOr<v1::RlUpdateResponse> RlUpdate(int64_t step, const v1::TensorBatch& batch);
  // The old policy's log-probs (old_logp) of this DP rank's samples, planned as the
  // update plans them, and the actor's own reference's (ref_logp) where it holds one:
  // with a critic group the driver makes PPO's advantages from them.
  absl::StatusOr<v1::RlForwardStats> Forward(int64_t step, const v1::TensorBatch& samples, v1::TensorBatch* out);
  // The actor's states, its own reference's and critic's, after its rollout engine's cache.
  void ReleaseForOffload(std::vector<runtime::Tensor>* states) override;

 private:
  RlActorSession() = default;
  absl::Status MakeRl(const v1::JobSpec& spec, const engine::OptimizerOptions& actor_options);
  absl::Status SaveCompanions(int64_t done) override;
  engine::SamplingParams Sampling() const;
  // The rl section's ppo options (common/spec/rl_options.h); grpo's share the loss's.
  absl::StatusOr<engine::PpoOptions> PpoOpts() const;

  v1::RlSpec rl_;
  bool ppo_ = false;
  std::unique_ptr<model::Llama> reference_;  // null with a reference group, or no KL term
  std::unique_ptr<engine::RolloutEngine> rollout_;
  std::unique_ptr<model::Llama> critic_;  // ppo without a critic group
  std::unique_ptr<engine::Trainer> critic_trainer_;
  RlPrompts prompts_;
  std::unique_ptr<RewardServiceClient> rewards_;  // rl.reward_service (null: the built-in verifier)
  std::unique_ptr<EnvironmentClient> env_;        // rl.environment where the session generates (null: single-turn)
};

}  // namespace tessera::executor
