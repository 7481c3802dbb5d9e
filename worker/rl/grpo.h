// One GRPO step on one rank (docs/design.md §8), over the pieces the executor's RL session will
// call one by one for the controller's driver: the rollout engine samples `group_size`
// completions per prompt from the actor's current weights (colocated, same TP: no weight
// copy), `reward` scores each, the reference model's and the actor's (old policy,
// recomputed by the training engine) log-probs of every completion are taken, rewards
// (with an overlong penalty and a KL penalty where asked) become advantages
// (rl::ComputeOutcomeAdvantages: group-normalized by default), and the
// actor makes `epochs` passes over `mini_batches` mini-batches of the samples
// (Trainer::PolicyStep: clipped surrogate, dual clip, KL to the reference as a loss term,
// token mean). With data parallelism every DP rank calls it with its own prompts (whole
// groups stay on one rank); PolicyStep's token mean spans the ranks.
#pragma once

#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rl.h"
#include "worker/rollout/rollout.h"
#include "worker/train/trainer.h"

namespace tessera::engine {

struct GrpoOptions {
  int group_size = 4;           // completions per prompt
  SamplingParams sampling;      // its n is group_size
  rl::PolicyLossOptions loss;   // kl_coef > 0 needs a reference model
  // The estimator (grpo, rloo, reinforce_plus_plus), Dr. GRPO's scale_by_std, a KL
  // penalty in the reward (needs the reference); group_size is filled in.
  rl::OutcomeAdvantageOptions advantages;
  rl::OverlongOptions overlong;  // DAPO's overlong penalty on the rewards (off by default)
  int epochs = 1;
  int mini_batches = 1;  // per epoch, each an optimizer step
  // Tokens per micro-batch of every pass over the samples (PlanMicroBatches; 0: one
  // micro-batch per mini-batch).
  int64_t max_tokens_per_micro_batch = 0;
};

struct GrpoStats {
  double reward = 0, response_length = 0;  // means over the samples (the reward before any penalty)
  double reward_kl = 0;  // advantages.kl_reward_coef > 0: the penalty's mean KL per response token
  double loss = 0, kl = 0, clip_fraction = 0, entropy = 0, grad_norm = 0;  // of the last optimizer step
  double tis_weight = 0;  // loss.tis_cap > 0: the last step's mean importance weight
  int optimizer_steps = 0;
  double generate_s = 0, ref_s = 0, old_s = 0, update_s = 0;  // phase times (host clock)
};

// The reward of a completion (its new tokens) of prompt `prompt`.
using RewardFn = std::function<double(size_t prompt, const std::vector<int32_t>& completion)>;

absl::StatusOr<GrpoStats> GrpoStep(RolloutEngine& rollout, model::Llama& actor, Trainer& trainer, model::Llama* reference,
                                   const std::vector<std::vector<int32_t>>& prompts, const RewardFn& reward,
                                   const GrpoOptions& options, uint64_t seed);
// The same with all of a step's completions scored in one call (an external reward
// service): one reward per completion, in order; an error fails the step.
using BatchRewardFn = std::function<absl::StatusOr<std::vector<double>>(const std::vector<Completion>& completions)>;
absl::StatusOr<GrpoStats> GrpoStep(RolloutEngine& rollout, model::Llama& actor, Trainer& trainer, model::Llama* reference,
                                   const std::vector<std::vector<int32_t>>& prompts, const BatchRewardFn& reward,
                                   const GrpoOptions& options, uint64_t seed);

// The step's second half on samples generated elsewhere (a rollout pool on its own
// devices): `rollouts` holds this rank's samples in (prompt, sample) order — whole groups
// of group_size — with their rewards; advantages, the reference's and the old policy's
// log-probs and the updates as GrpoStep; where every sample carries ref_logp already (a
// reference group's), `reference` may be null and is not run. generate_s stays 0.
struct Rollouts;
absl::StatusOr<GrpoStats> GrpoUpdate(model::Llama& actor, Trainer& trainer, model::Llama* reference, Rollouts& rollouts,
                                     const GrpoOptions& options);

}  // namespace tessera::engine
