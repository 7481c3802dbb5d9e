#include "worker/rl/ppo.h"

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

absl::Status Check(const PpoOptions& o, const model::Llama* reference, size_t prompts, bool ref_given = false) {
  if (o.samples_per_prompt < 1)
    return absl::InvalidArgumentError(absl::StrCat("ppo: samples_per_prompt ", o.samples_per_prompt, "; need >= 1"));
  if (o.epochs < 1 || o.mini_batches < 1)
    return absl::InvalidArgumentError(absl::StrCat("ppo: epochs (", o.epochs, ") and mini_batches (", o.mini_batches,
                                                   ") must be >= 1"));
  if ((o.loss.kl_coef > 0 || o.kl_reward_coef > 0) && reference == nullptr && !ref_given)
    return absl::InvalidArgumentError("ppo: kl_coef or kl_reward_coef > 0 needs a reference model or the reference's log-probs");
  if (o.kl_reward_coef < 0) return absl::InvalidArgumentError(absl::StrCat("ppo: kl_reward_coef ", o.kl_reward_coef, " < 0"));
  if (prompts == 0) return absl::InvalidArgumentError("ppo: no prompts");
  if (static_cast<size_t>(o.mini_batches) > prompts * o.samples_per_prompt)
    return absl::InvalidArgumentError(
        absl::StrCat("ppo: ", o.mini_batches, " mini-batches of ", prompts * o.samples_per_prompt, " samples"));
  return absl::OkStatus();
}

// Per sample: rl::ComputePpoAdvantages over its response tokens (the mask's positions),
// advantages and returns written back at their positions (0 elsewhere).
absl::Status Advantages(std::vector<RlSample>& samples, const std::vector<double>& rewards, const PpoOptions& o,
                        double* reward_kl) {
  std::vector<rl::PpoResponse> in(samples.size());
  std::vector<std::vector<size_t>> at(samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    const RlSample& s = samples[i];
    at[i] = ResponsePositions(s);
    in[i].reward = rewards[i] + rl::OverlongPenalty(static_cast<int64_t>(at[i].size()), o.overlong);
    for (size_t t : at[i]) {
      in[i].values.push_back(s.old_value[t]);
      if (o.kl_reward_coef > 0) in[i].old_logp.push_back(s.old_logp[t]), in[i].ref_logp.push_back(s.ref_logp[t]);
    }
  }
  rl::PpoAdvantageOptions ao;
  ao.gamma = o.gamma, ao.lambda = o.lambda, ao.kl_reward_coef = o.kl_reward_coef, ao.whiten = o.whiten_advantages;
  ao.kl_reward = o.kl_reward;
  TESSERA_ASSIGN_OR_RETURN(rl::PpoAdvantages got, rl::ComputePpoAdvantages(in, ao));
  for (size_t i = 0; i < samples.size(); ++i) {
    RlSample& s = samples[i];
    s.advantage.assign(s.mask.size(), 0.0);
    s.returns.assign(s.mask.size(), 0.0);
    for (size_t k = 0; k < at[i].size(); ++k) s.advantage[at[i][k]] = got.advantages[i][k], s.returns[at[i][k]] = got.returns[i][k];
  }
  *reward_kl = got.reward_kl;
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
  // The reference's log-probs made elsewhere (a reference group): every sample has them.
  const bool ref_given = !got.samples.empty() && std::all_of(got.samples.begin(), got.samples.end(), [](const RlSample& s) {
    return !s.mask.empty() && s.ref_logp.size() == s.mask.size();
  });
  TESSERA_RETURN_IF_ERROR(Check(o, reference, got.samples.size() / std::max(1, o.samples_per_prompt), ref_given));
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
  if ((o.loss.kl_coef > 0 || o.kl_reward_coef > 0) && !ref_given)
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
      stats.entropy = ps.entropy, stats.tis_weight = ps.tis_weight;
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

namespace {
// Every sample carries `fields` at each of its positions.
absl::Status CheckGiven(const std::vector<RlSample>& samples,
                        std::initializer_list<std::pair<const char*, std::vector<double> RlSample::*>> fields) {
  for (size_t i = 0; i < samples.size(); ++i)
    for (auto [name, f] : fields)
      if ((samples[i].*f).size() != samples[i].mask.size())
        return absl::InvalidArgumentError(absl::StrCat("ppo: sample ", i, " has no ", name));
  return absl::OkStatus();
}

// A half's checks and its plan: samples, epochs and mini-batches, then the micro-batches.
absl::StatusOr<MicroBatchPlan> PlanHalf(Trainer& trainer, const Rollouts& got, const PpoOptions& o) {
  if (o.epochs < 1 || o.mini_batches < 1 || got.samples.empty())
    return absl::InvalidArgumentError(absl::StrCat("ppo: ", got.samples.size(), " samples, ", o.epochs, " epochs, ",
                                                   o.mini_batches, " mini-batches"));
  return PlanMicroBatches(&trainer, got.samples, o.mini_batches, o.max_tokens_per_micro_batch);
}
}  // namespace

absl::StatusOr<PpoStats> PpoActorUpdate(Trainer& trainer, Rollouts& got, const PpoOptions& o) {
  std::vector<RlSample>& samples = got.samples;
  TESSERA_RETURN_IF_ERROR(CheckGiven(samples, {{"old_logp", &RlSample::old_logp}, {"advantage", &RlSample::advantage}}));
  if (o.loss.kl_coef > 0) TESSERA_RETURN_IF_ERROR(CheckGiven(samples, {{"ref_logp", &RlSample::ref_logp}}));
  else for (RlSample& s : samples) s.ref_logp.clear();
  TESSERA_ASSIGN_OR_RETURN(const MicroBatchPlan plan, PlanHalf(trainer, got, o));
  PpoStats stats;
  stats.reward = got.reward, stats.response_length = got.response_length;
  const auto t = Clock::now();
  TESSERA_ASSIGN_OR_RETURN(Trainer::PolicyStats ps, UpdateActorEpochs(trainer, samples, plan, o.epochs, o.loss, &stats.optimizer_steps));
  stats.loss = ps.loss, stats.kl = ps.kl, stats.clip_fraction = ps.clip_fraction, stats.grad_norm = ps.grad_norm;
  stats.entropy = ps.entropy, stats.tis_weight = ps.tis_weight;
  stats.update_s = Since(t);
  return stats;
}

absl::StatusOr<PpoStats> PpoCriticUpdate(model::Llama& critic, Trainer& trainer, Rollouts& got, const PpoOptions& o) {
  if (!critic.config().value_head) return absl::InvalidArgumentError("ppo: the critic needs a value head");
  std::vector<RlSample>& samples = got.samples;
  TESSERA_RETURN_IF_ERROR(CheckGiven(samples, {{"old_value", &RlSample::old_value}, {"returns", &RlSample::returns}}));
  TESSERA_ASSIGN_OR_RETURN(const MicroBatchPlan plan, PlanHalf(trainer, got, o));
  PpoStats stats;
  stats.reward = got.reward, stats.response_length = got.response_length;
  const auto t = Clock::now();
  for (int e = 0; e < o.epochs; ++e)
    for (int mb = 0; mb < o.mini_batches; ++mb) {
      TESSERA_ASSIGN_OR_RETURN(Trainer::ValueStats vs, UpdateCritic(trainer, samples, plan[mb], o.value_clip));
      stats.value_loss = vs.loss, stats.value_clip_fraction = vs.clip_fraction, stats.value = vs.value;
      stats.critic_grad_norm = vs.grad_norm;
      ++stats.optimizer_steps;
    }
  stats.critic_s = Since(t);
  return stats;
}

}  // namespace tessera::engine
