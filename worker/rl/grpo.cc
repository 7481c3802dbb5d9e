#include "worker/rl/grpo.h"

#include <algorithm>

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/rl/rl_samples.h"

namespace tessera::engine {
namespace {
using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

namespace {
// The options against the samples a step will have.
absl::Status CheckOptions(const GrpoOptions& o, const model::Llama* reference, size_t samples, bool ref_given = false) {
  if (o.group_size < 2) return absl::InvalidArgumentError(absl::StrCat("grpo: group_size ", o.group_size, "; need >= 2"));
  if (o.epochs < 1 || o.mini_batches < 1)
    return absl::InvalidArgumentError(absl::StrCat("grpo: epochs (", o.epochs, ") and mini_batches (", o.mini_batches,
                                                   ") must be >= 1"));
  if ((o.loss.kl_coef > 0 || o.advantages.kl_reward_coef > 0) && reference == nullptr && !ref_given)
    return absl::InvalidArgumentError("grpo: kl_coef or kl_reward_coef > 0 needs a reference model or the reference's log-probs");
  if (static_cast<size_t>(o.mini_batches) > samples)
    return absl::InvalidArgumentError(absl::StrCat("grpo: ", o.mini_batches, " mini-batches of ", samples, " samples"));
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<GrpoStats> GrpoStep(RolloutEngine& rollout, model::Llama& actor, Trainer& trainer, model::Llama* reference,
                                   const std::vector<std::vector<int32_t>>& prompts, const RewardFn& reward,
                                   const GrpoOptions& o, uint64_t seed) {
  const BatchRewardFn batch = [&](const std::vector<Completion>& cs) -> absl::StatusOr<std::vector<double>> {
    std::vector<double> r;
    for (const Completion& c : cs) r.push_back(reward(static_cast<size_t>(c.request), c.tokens));
    return r;
  };
  return GrpoStep(rollout, actor, trainer, reference, prompts, batch, o, seed);
}

absl::StatusOr<GrpoStats> GrpoStep(RolloutEngine& rollout, model::Llama& actor, Trainer& trainer, model::Llama* reference,
                                   const std::vector<std::vector<int32_t>>& prompts, const BatchRewardFn& reward,
                                   const GrpoOptions& o, uint64_t seed) {
  // Checked before generating (GrpoUpdate checks the samples again).
  if (prompts.empty()) return absl::InvalidArgumentError("grpo: no prompts");
  TESSERA_RETURN_IF_ERROR(CheckOptions(o, reference, prompts.size() * std::max(o.group_size, 0)));
  // Generate group_size samples of every prompt, score them; then the update.
  TESSERA_ASSIGN_OR_RETURN(Rollouts got, GenerateAndScore(rollout, prompts, o.sampling, o.group_size, seed, reward, "grpo"));
  return GrpoUpdate(actor, trainer, reference, got, o);
}

absl::StatusOr<GrpoStats> GrpoUpdate(model::Llama& actor, Trainer& trainer, model::Llama* reference, Rollouts& got,
                                     const GrpoOptions& o) {
  const size_t total = got.samples.size();
  // The reference's log-probs made elsewhere (a reference group): every sample has them.
  const bool ref_given = total > 0 && std::all_of(got.samples.begin(), got.samples.end(), [](const RlSample& s) {
    return !s.mask.empty() && s.ref_logp.size() == s.mask.size();
  });
  TESSERA_RETURN_IF_ERROR(CheckOptions(o, reference, total, ref_given));
  if (total == 0 || total % o.group_size != 0 || got.rewards.size() != total)
    return absl::InvalidArgumentError(absl::StrCat("grpo: ", total, " samples with ", got.rewards.size(),
                                                   " rewards do not make whole groups of ", o.group_size));
  GrpoStats stats;
  std::vector<RlSample>& samples = got.samples;
  const std::vector<double>& rewards = got.rewards;
  stats.reward = got.reward, stats.response_length = got.response_length, stats.generate_s = got.generate_s;
  Clock::time_point t;
  // The reference's and the old policy's log-probs (teacher forcing), one forward per
  // micro-batch of the mini-batches.
  TESSERA_ASSIGN_OR_RETURN(const MicroBatchPlan plan,
                           PlanMicroBatches(&trainer, samples, o.mini_batches, o.max_tokens_per_micro_batch));
  const bool kl_reward = o.advantages.kl_reward_coef > 0;
  t = Clock::now();
  if ((o.loss.kl_coef > 0 || kl_reward) && !ref_given) {
    TESSERA_RETURN_IF_ERROR(FillLogProbs(*reference, samples, plan, &RlSample::ref_logp));
  }
  stats.ref_s = Since(t);
  t = Clock::now();
  TESSERA_RETURN_IF_ERROR(FillLogProbs(actor, samples, plan, &RlSample::old_logp));
  stats.old_s = Since(t);
  // Advantages (the samples come ordered by prompt, sample), over each response's tokens
  // (the mask's positions; 0 elsewhere).
  rl::OutcomeAdvantageOptions ao = o.advantages;
  ao.group_size = o.group_size;
  std::vector<rl::OutcomeResponse> in(samples.size());
  std::vector<std::vector<size_t>> at(samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    const RlSample& s = samples[i];
    at[i] = ResponsePositions(s);
    in[i].tokens = at[i].size();
    in[i].reward = rewards[i] + rl::OverlongPenalty(static_cast<int64_t>(at[i].size()), o.overlong);
    if (kl_reward)
      for (size_t k : at[i]) in[i].old_logp.push_back(s.old_logp[k]), in[i].ref_logp.push_back(s.ref_logp[k]);
  }
  TESSERA_ASSIGN_OR_RETURN(rl::OutcomeAdvantages adv, rl::ComputeOutcomeAdvantages(in, ao));
  stats.reward_kl = adv.reward_kl;
  for (size_t i = 0; i < samples.size(); ++i) {
    samples[i].advantage.assign(samples[i].mask.size(), 0.0);
    for (size_t k = 0; k < at[i].size(); ++k) samples[i].advantage[at[i][k]] = adv.advantages[i][k];
  }
  // Update: epochs x mini-batches, each one optimizer step accumulated over its micro-batches.
  t = Clock::now();
  TESSERA_ASSIGN_OR_RETURN(Trainer::PolicyStats ps, UpdateActorEpochs(trainer, samples, plan, o.epochs, o.loss, &stats.optimizer_steps));
  stats.loss = ps.loss, stats.kl = ps.kl, stats.clip_fraction = ps.clip_fraction, stats.grad_norm = ps.grad_norm;
  stats.entropy = ps.entropy, stats.tis_weight = ps.tis_weight;
  stats.update_s = Since(t);
  return stats;
}

}  // namespace tessera::engine
