#include "worker/engine/grpo.h"

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tessera::engine {
namespace {
using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// One sample as a sequence (CompletionSequence) with its per-token RL inputs.
struct Sample {
  model::TokenBatch batch;
  std::vector<double> mask, ref_logp, old_logp;
  double advantage = 0;
};

Sample MakeSample(const std::vector<int32_t>& prompt, const std::vector<int32_t>& completion) {
  Sample s;
  s.batch = CompletionSequence(prompt, completion, &s.mask);
  return s;
}

// Samples [begin, end) packed into one micro-batch (varlen: each attends to itself).
model::TokenBatch PackBatch(const std::vector<Sample>& samples, size_t begin, size_t end) {
  model::TokenBatch batch;
  batch.cu_seqlens = {0};
  for (size_t i = begin; i < end; ++i) {
    const model::TokenBatch& b = samples[i].batch;
    batch.tokens.insert(batch.tokens.end(), b.tokens.begin(), b.tokens.end());
    batch.targets.insert(batch.targets.end(), b.targets.begin(), b.targets.end());
    batch.positions.insert(batch.positions.end(), b.positions.begin(), b.positions.end());
    batch.cu_seqlens.push_back(static_cast<int32_t>(batch.tokens.size()));
  }
  return batch;
}

// The same with the samples' per-token RL inputs alongside.
void Pack(const std::vector<Sample>& samples, size_t begin, size_t end, model::TokenBatch* batch,
          Trainer::PolicyTokens* tokens) {
  *batch = PackBatch(samples, begin, end);
  for (size_t i = begin; i < end; ++i) {
    const Sample& s = samples[i];
    tokens->mask.insert(tokens->mask.end(), s.mask.begin(), s.mask.end());
    tokens->old_logp.insert(tokens->old_logp.end(), s.old_logp.begin(), s.old_logp.end());
    tokens->ref_logp.insert(tokens->ref_logp.end(), s.ref_logp.begin(), s.ref_logp.end());
    tokens->advantage.insert(tokens->advantage.end(), s.batch.size(), s.advantage);
  }
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
  if (o.group_size < 2) return absl::InvalidArgumentError(absl::StrCat("grpo: group_size ", o.group_size, "; need >= 2"));
  if (o.epochs < 1 || o.mini_batches < 1)
    return absl::InvalidArgumentError(absl::StrCat("grpo: epochs (", o.epochs, ") and mini_batches (", o.mini_batches,
                                                   ") must be >= 1"));
  if (o.loss.kl_coef > 0 && reference == nullptr)
    return absl::InvalidArgumentError("grpo: kl_coef > 0 needs a reference model");
  if (prompts.empty()) return absl::InvalidArgumentError("grpo: no prompts");
  const size_t total = prompts.size() * o.group_size;
  if (static_cast<size_t>(o.mini_batches) > total)
    return absl::InvalidArgumentError(absl::StrCat("grpo: ", o.mini_batches, " mini-batches of ", total, " samples"));
  GrpoStats stats;
  // Generate: group_size samples of every prompt, each prompt its own seed.
  Clock::time_point t = Clock::now();
  std::vector<GenerationRequest> requests(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    requests[i].prompt = prompts[i];
    requests[i].params = o.sampling;
    requests[i].params.n = o.group_size;
    requests[i].params.seed = seed * 1000003ull + i * 7919ull;
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<Completion> completions, rollout.Generate(requests));
  stats.generate_s = Since(t);
  // Rewards and group-normalized advantages (completions come ordered by prompt, sample).
  TESSERA_ASSIGN_OR_RETURN(std::vector<double> rewards, reward(completions));
  if (rewards.size() != completions.size())
    return absl::InvalidArgumentError(absl::StrCat("grpo: ", rewards.size(), " rewards for ", completions.size(), " completions"));
  std::vector<Sample> samples;
  for (size_t i = 0; i < completions.size(); ++i) {
    const Completion& c = completions[i];
    if (!std::isfinite(rewards[i])) return absl::InvalidArgumentError(absl::StrCat("grpo: reward ", i, " is not finite"));
    samples.push_back(MakeSample(prompts[c.request], c.tokens));
    stats.reward += rewards[i] / total;
    stats.response_length += static_cast<double>(c.tokens.size()) / total;
  }
  rl::GroupAdvantageOptions ao = o.advantages;
  ao.group_size = o.group_size;
  TESSERA_ASSIGN_OR_RETURN(std::vector<double> adv, rl::GroupNormalizedAdvantages(rewards, ao));
  for (size_t i = 0; i < samples.size(); ++i) samples[i].advantage = adv[i];
  // The reference's and the old policy's log-probs (teacher forcing), one forward per
  // mini-batch's samples packed, split back per sample.
  auto log_probs = [&](model::Llama& m, std::vector<double> Sample::*field) -> absl::Status {
    for (int mb = 0; mb < o.mini_batches; ++mb) {
      const size_t begin = total * mb / o.mini_batches, end = total * (mb + 1) / o.mini_batches;
      TESSERA_ASSIGN_OR_RETURN(model::Llama::TokenStats st, m.TokenLogProbs(PackBatch(samples, begin, end)));
      size_t at = 0;
      for (size_t i = begin; i < end; ++i) {
        const size_t n = samples[i].batch.size();
        (samples[i].*field).assign(st.logprob.begin() + at, st.logprob.begin() + at + n);
        at += n;
      }
    }
    return absl::OkStatus();
  };
  t = Clock::now();
  if (o.loss.kl_coef > 0) TESSERA_RETURN_IF_ERROR(log_probs(*reference, &Sample::ref_logp));
  stats.ref_s = Since(t);
  t = Clock::now();
  TESSERA_RETURN_IF_ERROR(log_probs(actor, &Sample::old_logp));
  stats.old_s = Since(t);
  // Update: epochs x mini-batches, each one optimizer step over one packed micro-batch.
  t = Clock::now();
  for (int e = 0; e < o.epochs; ++e)
    for (int mb = 0; mb < o.mini_batches; ++mb) {
      const size_t begin = total * mb / o.mini_batches, end = total * (mb + 1) / o.mini_batches;
      model::TokenBatch batch;
      Trainer::PolicyTokens tokens;
      Pack(samples, begin, end, &batch, &tokens);
      TESSERA_ASSIGN_OR_RETURN(Trainer::PolicyStats ps, trainer.PolicyStep({batch}, {tokens}, o.loss));
      stats.loss = ps.loss, stats.kl = ps.kl, stats.clip_fraction = ps.clip_fraction, stats.grad_norm = ps.grad_norm;
      stats.entropy = ps.entropy;
      ++stats.optimizer_steps;
    }
  stats.update_s = Since(t);
  return stats;
}

}  // namespace tessera::engine
