#include "worker/rl/ppo.h"

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/rl/rl_samples.h"

namespace tessera::engine {
namespace {
using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

absl::Status Check(const PpoOptions& o, const model::Llama* reference, size_t prompts) {
  if (o.samples_per_prompt < 1)
    return absl::InvalidArgumentError(absl::StrCat("ppo: samples_per_prompt ", o.samples_per_prompt, "; need >= 1"));
  if (o.epochs < 1 || o.mini_batches < 1)
    return absl::InvalidArgumentError(absl::StrCat("ppo: epochs (", o.epochs, ") and mini_batches (", o.mini_batches,
                                                   ") must be >= 1"));
  if ((o.loss.kl_coef > 0 || o.kl_reward_coef > 0) && reference == nullptr)
    return absl::InvalidArgumentError("ppo: kl_coef or kl_reward_coef > 0 needs a reference model");
  if (o.kl_reward_coef < 0) return absl::InvalidArgumentError(absl::StrCat("ppo: kl_reward_coef ", o.kl_reward_coef, " < 0"));
  if (prompts == 0) return absl::InvalidArgumentError("ppo: no prompts");
  if (static_cast<size_t>(o.mini_batches) > prompts * o.samples_per_prompt)
    return absl::InvalidArgumentError(
        absl::StrCat("ppo: ", o.mini_batches, " mini-batches of ", prompts * o.samples_per_prompt, " samples"));
  return absl::OkStatus();
}

// Per sample: token rewards on its response (the outcome on the last response token, the
// KL penalty on every one), GAE over the response tokens, advantages and returns written
// back at their positions (0 elsewhere).
absl::Status Advantages(std::vector<RlSample>& samples, const std::vector<double>& rewards, const PpoOptions& o,
                        double* reward_kl) {
  double kl_sum = 0, kl_n = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    RlSample& s = samples[i];
    std::vector<size_t> at;
    for (size_t t = 0; t < s.mask.size(); ++t)
      if (s.mask[t] > 0) at.push_back(t);
    s.advantage.assign(s.mask.size(), 0.0);
    s.returns.assign(s.mask.size(), 0.0);
    if (at.empty()) continue;
    std::vector<double> r(at.size(), 0.0), v(at.size());
    for (size_t k = 0; k < at.size(); ++k) {
      v[k] = s.old_value[at[k]];
      if (o.kl_reward_coef > 0) {
        const double kl = s.old_logp[at[k]] - s.ref_logp[at[k]];
        r[k] -= o.kl_reward_coef * kl;
        kl_sum += kl, kl_n += 1;
      }
    }
    r.back() += rewards[i];
    TESSERA_ASSIGN_OR_RETURN(rl::Gae g, rl::ComputeGae(r, v, o.gamma, o.lambda));
    for (size_t k = 0; k < at.size(); ++k) s.advantage[at[k]] = g.advantages[k], s.returns[at[k]] = g.returns[k];
  }
  *reward_kl = kl_n > 0 ? kl_sum / kl_n : 0.0;
  if (!o.whiten_advantages) return absl::OkStatus();
  double n = 0, mean = 0, sq = 0;
  for (const RlSample& s : samples)
    for (size_t t = 0; t < s.mask.size(); ++t) n += s.mask[t], mean += s.mask[t] * s.advantage[t];
  if (n < 2) return absl::OkStatus();
  mean /= n;
  for (const RlSample& s : samples)
    for (size_t t = 0; t < s.mask.size(); ++t) sq += s.mask[t] * (s.advantage[t] - mean) * (s.advantage[t] - mean);
  const double inv = 1.0 / std::sqrt(sq / (n - 1) + 1e-8);
  for (RlSample& s : samples)
    for (size_t t = 0; t < s.mask.size(); ++t) s.advantage[t] = s.mask[t] > 0 ? (s.advantage[t] - mean) * inv : 0.0;
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<PpoStats> PpoStep(RolloutEngine& rollout, model::Llama& actor, Trainer& actor_trainer, model::Llama& critic,
                                 Trainer& critic_trainer, model::Llama* reference,
                                 const std::vector<std::vector<int32_t>>& prompts, const BatchRewardFn& reward,
                                 const PpoOptions& o, uint64_t seed) {
  TESSERA_RETURN_IF_ERROR(Check(o, reference, prompts.size()));
  if (!critic.config().value_head) return absl::InvalidArgumentError("ppo: the critic needs a value head");
  TESSERA_ASSIGN_OR_RETURN(Rollouts got,
                           GenerateAndScore(rollout, prompts, o.sampling, o.samples_per_prompt, seed, reward, "ppo"));
  return PpoUpdate(actor, actor_trainer, critic, critic_trainer, reference, got, o);
}

absl::StatusOr<PpoStats> PpoUpdate(model::Llama& actor, Trainer& actor_trainer, model::Llama& critic, Trainer& critic_trainer,
                                   model::Llama* reference, Rollouts& got, const PpoOptions& o) {
  if (o.samples_per_prompt < 1 || got.samples.size() % o.samples_per_prompt != 0 || got.rewards.size() != got.samples.size())
    return absl::InvalidArgumentError(absl::StrCat("ppo: ", got.samples.size(), " samples with ", got.rewards.size(),
                                                   " rewards do not make whole groups of ", o.samples_per_prompt));
  TESSERA_RETURN_IF_ERROR(Check(o, reference, got.samples.size() / std::max(1, o.samples_per_prompt)));
  if (!critic.config().value_head) return absl::InvalidArgumentError("ppo: the critic needs a value head");
  PpoStats stats;
  std::vector<RlSample>& samples = got.samples;
  const std::vector<double>& rewards = got.rewards;
  stats.reward = got.reward, stats.response_length = got.response_length, stats.generate_s = got.generate_s;
  Clock::time_point t;
  // The actor's and the critic's DP groups are the same ranks: one plan serves both.
  TESSERA_ASSIGN_OR_RETURN(const MicroBatchPlan plan,
                           PlanMicroBatches(&actor_trainer, samples, o.mini_batches, o.max_tokens_per_micro_batch));
  t = Clock::now();
  if (o.loss.kl_coef > 0 || o.kl_reward_coef > 0)
    TESSERA_RETURN_IF_ERROR(FillLogProbs(*reference, samples, plan, &RlSample::ref_logp));
  stats.ref_s = Since(t);
  t = Clock::now();
  TESSERA_RETURN_IF_ERROR(FillLogProbs(actor, samples, plan, &RlSample::old_logp));
  stats.old_s = Since(t);
  t = Clock::now();
  TESSERA_RETURN_IF_ERROR(FillValues(critic, samples, plan));
  stats.values_s = Since(t);
  TESSERA_RETURN_IF_ERROR(Advantages(samples, rewards, o, &stats.reward_kl));
  if (o.loss.kl_coef <= 0)
    for (RlSample& s : samples) s.ref_logp.clear();  // (the penalty's use only; PolicyStep wants none then)
  for (int e = 0; e < o.epochs; ++e)
    for (int mb = 0; mb < o.mini_batches; ++mb) {
      t = Clock::now();
      TESSERA_ASSIGN_OR_RETURN(Trainer::PolicyStats ps, UpdateActor(actor_trainer, samples, plan[mb], o.loss));
      stats.loss = ps.loss, stats.kl = ps.kl, stats.clip_fraction = ps.clip_fraction, stats.grad_norm = ps.grad_norm;
      stats.entropy = ps.entropy;
      stats.update_s += Since(t);
      t = Clock::now();
      TESSERA_ASSIGN_OR_RETURN(Trainer::ValueStats vs, UpdateCritic(critic_trainer, samples, plan[mb], o.value_clip));
      stats.value_loss = vs.loss, stats.value_clip_fraction = vs.clip_fraction, stats.value = vs.value;
      stats.critic_grad_norm = vs.grad_norm;
      stats.critic_s += Since(t);
      ++stats.optimizer_steps;
    }
  return stats;
}

}  // namespace tessera::engine
