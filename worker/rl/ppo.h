// One PPO step on one rank (docs/design.md §8, with a critic): the rollout engine samples
// `samples_per_prompt` completions per prompt from the actor, `reward` scores each (an
// outcome reward on the last response token), the reference's log-probs (for a KL term in
// the loss, or per token in the reward: InstructGPT's penalty -kl_reward_coef (logp_old -
// logp_ref)), the old policy's log-probs and the critic's values are taken, GAE
// (rl::ComputeGae, per response, bootstrapped with 0 after its last token) gives
// advantages and returns, the advantages are whitened over this rank's response tokens
// (verl's default), and for `epochs` passes over `mini_batches` mini-batches the actor
// takes a PolicyStep (clipped surrogate, dual clip, KL, entropy bonus) and the critic a
// ValueStep (clipped value loss on the returns). With data parallelism every DP rank
// calls it with its own prompts; the steps' token means span the ranks.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "common/rl.h"
#include "worker/rl/grpo.h"
#include "worker/rollout/rollout.h"
#include "worker/train/trainer.h"

namespace tessera::engine {

struct PpoOptions {
  int samples_per_prompt = 1;
  SamplingParams sampling;     // its n is samples_per_prompt
  rl::PolicyLossOptions loss;  // kl_coef > 0 needs a reference model
  double kl_reward_coef = 0;   // > 0: the KL to the reference as a per-token reward penalty (needs one)
  rl::KlEstimator kl_reward = rl::KlEstimator::kK1;  // its estimator
  rl::OverlongOptions overlong;  // DAPO's overlong penalty on the rewards (off by default)
  double gamma = 1.0, lambda = 0.95;
  double value_clip = 0.2;      // the critic's value clipping (<= 0: none)
  bool whiten_advantages = true;
  int epochs = 1;
  int mini_batches = 1;  // per epoch, each an optimizer step of the actor and one of the critic
  int64_t max_tokens_per_micro_batch = 0;  // as GrpoOptions'
};

struct PpoStats {
  double reward = 0, response_length = 0;                                 // means over the samples
  double loss = 0, kl = 0, clip_fraction = 0, entropy = 0, grad_norm = 0;  // the actor's last step
  double tis_weight = 0;  // loss.tis_cap > 0: its mean importance weight
  double value_loss = 0, value_clip_fraction = 0, value = 0, critic_grad_norm = 0;  // the critic's last step
  double reward_kl = 0;  // kl_reward_coef > 0: mean k1 KL (old policy vs reference) of the response tokens
  int optimizer_steps = 0;
  double generate_s = 0, ref_s = 0, old_s = 0, values_s = 0, update_s = 0, critic_s = 0;  // host clock
};

absl::StatusOr<PpoStats> PpoStep(RolloutEngine& rollout, model::Llama& actor, Trainer& actor_trainer, model::Llama& critic,
                                 Trainer& critic_trainer, model::Llama* reference,
                                 const std::vector<std::vector<int32_t>>& prompts, const BatchRewardFn& reward,
                                 const PpoOptions& options, uint64_t seed);
// The step's second half on samples generated elsewhere (a rollout pool): `rollouts`
// holds this rank's samples in (prompt, sample) order with their rewards.
struct Rollouts;
absl::StatusOr<PpoStats> PpoUpdate(model::Llama& actor, Trainer& actor_trainer, model::Llama& critic, Trainer& critic_trainer,
                                   model::Llama* reference, Rollouts& rollouts, const PpoOptions& options);

// PPO's halves where the critic is a group of its own (the driver gathers the critic's
// values and the actor's old log-probs and makes advantages and returns with
// rl::ComputePpoAdvantages, per actor DP rank as PpoUpdate does):
//  - the actor's: `rollouts`' samples carry old_logp and advantage (and ref_logp for a
//    KL loss term); epochs x mini-batches of PolicyStep. Fills the actor's fields of the
//    stats (update_s).
//  - the critic's: the samples carry old_value and returns; epochs x mini-batches of
//    ValueStep. Fills value_loss, value_clip_fraction, value, critic_grad_norm, critic_s.
// INVALID_ARGUMENT when a sample lacks one of its inputs.
absl::StatusOr<PpoStats> PpoActorUpdate(Trainer& trainer, Rollouts& rollouts, const PpoOptions& options);
absl::StatusOr<PpoStats> PpoCriticUpdate(model::Llama& critic, Trainer& trainer, Rollouts& rollouts, const PpoOptions& options);

}  // namespace tessera::engine
