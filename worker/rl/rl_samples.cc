#include "worker/rl/rl_samples.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/rollout/rollout.h"

namespace tessera::engine {

std::vector<size_t> ResponsePositions(const RlSample& s) {
  std::vector<size_t> at;
  for (size_t t = 0; t < s.mask.size(); ++t)
    if (s.mask[t] > 0) at.push_back(t);
  return at;
}

RlSample MakeRlSample(const std::vector<int32_t>& prompt, const std::vector<int32_t>& completion,
                      const std::vector<float>& logprobs, const std::vector<uint8_t>& sampled) {
  RlSample s;
  s.batch = CompletionSequence(prompt, completion, &s.mask);
  // Position t's target is completion token t + 1 - |prompt|.
  const size_t first = prompt.empty() ? 0 : prompt.size() - 1;
  if (!sampled.empty())
    for (size_t t = first; t < s.mask.size(); ++t)
      if (t - first < sampled.size() && sampled[t - first] == 0) s.mask[t] = 0;
  if (!logprobs.empty()) {
    s.rollout_logp.assign(s.mask.size(), 0.0);
    for (size_t t = first; t < s.mask.size(); ++t)
      if (s.mask[t] > 0 && t - first < logprobs.size()) s.rollout_logp[t] = logprobs[t - first];
  }
  return s;
}

absl::StatusOr<Rollouts> GenerateAndScore(RolloutEngine& rollout, const std::vector<std::vector<int32_t>>& prompts,
                                          const SamplingParams& sampling, int n, uint64_t seed,
                                          const BatchRewardFn& reward, const char* who) {
  std::vector<uint64_t> seeds(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) seeds[i] = PromptSeed(seed, i);
  return GenerateAndScore(rollout, prompts, sampling, n, seeds, reward, who);
}

Rollouts MakeRollouts(const std::vector<std::vector<int32_t>>& prompts, const std::vector<std::vector<int32_t>>& completions,
                      const std::vector<double>& rewards, const std::vector<std::vector<uint8_t>>* sampled) {
  Rollouts out;
  const size_t total = completions.size();
  for (size_t i = 0; i < total; ++i) {
    out.samples.push_back(MakeRlSample(prompts[i], completions[i], {}, sampled != nullptr ? (*sampled)[i] : std::vector<uint8_t>()));
    out.reward += rewards[i] / total;
    out.response_length += static_cast<double>(completions[i].size()) / total;
  }
  out.rewards = rewards;
  return out;
}

absl::StatusOr<Rollouts> GenerateAndScore(RolloutEngine& rollout, const std::vector<std::vector<int32_t>>& prompts,
                                          const SamplingParams& sampling, int n, const std::vector<uint64_t>& seeds,
                                          const BatchRewardFn& reward, const char* who) {
  const auto t = std::chrono::steady_clock::now();
  std::vector<GenerationRequest> requests(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    requests[i].prompt = prompts[i];
    requests[i].params = sampling;
    requests[i].params.n = n;
    requests[i].params.seed = seeds[i];
  }
  TESSERA_ASSIGN_OR_RETURN(std::vector<Completion> completions, rollout.Generate(requests));
  Rollouts out;
  out.generate_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  TESSERA_ASSIGN_OR_RETURN(out.rewards, reward(completions));
  if (out.rewards.size() != completions.size())
    return absl::InvalidArgumentError(absl::StrCat(who, ": ", out.rewards.size(), " rewards for ", completions.size(), " completions"));
  const size_t total = completions.size();
  for (size_t i = 0; i < total; ++i) {
    if (!std::isfinite(out.rewards[i])) return absl::InvalidArgumentError(absl::StrCat(who, ": reward ", i, " is not finite"));
    out.samples.push_back(MakeRlSample(prompts[completions[i].request], completions[i].tokens, completions[i].logprobs,
                                       completions[i].sampled));
    out.reward += out.rewards[i] / total;
    out.response_length += static_cast<double>(completions[i].tokens.size()) / total;
  }
  return out;
}

namespace {
// Samples [begin, end) into micro-batches of at most max_tokens (a longer sample alone),
// at least `count` of them (empty ones where there are too few samples).
std::vector<MicroBatch> Split(const std::vector<RlSample>& samples, size_t begin, size_t end, int64_t max_tokens,
                              size_t count) {
  std::vector<size_t> order;
  for (size_t i = begin; i < end; ++i) order.push_back(i);
  auto len = [&](size_t i) { return static_cast<int64_t>(samples[i].batch.size()); };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return len(a) > len(b); });
  int64_t tokens = 0;
  for (size_t i : order) tokens += len(i);
  const size_t least =
      max_tokens > 0 ? std::min(order.size(), static_cast<size_t>((tokens + max_tokens - 1) / max_tokens)) : 1;
  for (size_t bins = std::max<size_t>({count, least, 1});; ++bins) {
    std::vector<MicroBatch> out(bins);
    std::vector<int64_t> load(bins, 0);
    bool fits = true;
    for (size_t i : order) {
      const size_t k = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
      if (max_tokens > 0 && load[k] > 0 && load[k] + len(i) > max_tokens) {
        fits = false;
        break;
      }
      out[k].samples.push_back(i);
      load[k] += len(i);
    }
    if (!fits) continue;  // one more micro-batch (at most one per sample: always fits)
    for (MicroBatch& m : out) std::sort(m.samples.begin(), m.samples.end());
    return out;
  }
}
}  // namespace

absl::StatusOr<MicroBatchPlan> PlanMicroBatches(Trainer* trainer, const std::vector<RlSample>& samples, int mini_batches,
                                                int64_t max_tokens) {
  if (mini_batches < 1 || static_cast<size_t>(mini_batches) > samples.size())
    return absl::InvalidArgumentError(absl::StrCat(mini_batches, " mini-batches of ", samples.size(), " samples"));
  const size_t total = samples.size();
  auto range = [&](int mb) {
    return std::pair<size_t, size_t>{total * mb / mini_batches, total * (mb + 1) / mini_batches};
  };
  MicroBatchPlan plan(mini_batches);
  std::vector<int64_t> counts(mini_batches);
  for (int mb = 0; mb < mini_batches; ++mb) {
    plan[mb] = Split(samples, range(mb).first, range(mb).second, max_tokens, 1);
    counts[mb] = static_cast<int64_t>(plan[mb].size());
  }
  if (trainer != nullptr) TESSERA_RETURN_IF_ERROR(trainer->AgreeMax(counts));
  for (int mb = 0; mb < mini_batches; ++mb) {
    const auto [begin, end] = range(mb);
    if (static_cast<int64_t>(plan[mb].size()) < counts[mb])  // another rank needs more: split again
      plan[mb] = Split(samples, begin, end, max_tokens, static_cast<size_t>(counts[mb]));
    size_t shortest = begin;
    for (size_t i = begin; i < end; ++i)
      if (samples[i].batch.size() < samples[shortest].batch.size()) shortest = i;
    for (MicroBatch& m : plan[mb])
      if (m.samples.empty()) m.samples = {shortest}, m.pad = true;
  }
  return plan;
}

model::TokenBatch PackSamples(const std::vector<RlSample>& samples, const MicroBatch& micro) {
  model::TokenBatch batch;
  batch.cu_seqlens = {0};
  for (size_t i : micro.samples) {
    const model::TokenBatch& b = samples[i].batch;
    batch.tokens.insert(batch.tokens.end(), b.tokens.begin(), b.tokens.end());
    batch.targets.insert(batch.targets.end(), b.targets.begin(), b.targets.end());
    batch.positions.insert(batch.positions.end(), b.positions.begin(), b.positions.end());
    batch.cu_seqlens.push_back(static_cast<int32_t>(batch.tokens.size()));
  }
  return batch;
}

namespace {
// A per-token input of a micro-batch's samples, or zeros for a pad (nothing counts).
void Append(std::vector<double>& to, const std::vector<RlSample>& samples, const MicroBatch& micro,
            std::vector<double> RlSample::*field) {
  for (size_t i : micro.samples) {
    const std::vector<double>& from = samples[i].*field;
    if (micro.pad) to.resize(to.size() + samples[i].batch.size(), 0.0);
    else to.insert(to.end(), from.begin(), from.end());
  }
}
}  // namespace

absl::StatusOr<Trainer::PolicyStats> UpdateActor(Trainer& trainer, const std::vector<RlSample>& samples,
                                                 const std::vector<MicroBatch>& mini_batch, const rl::PolicyLossOptions& loss) {
  std::vector<model::TokenBatch> batches;
  std::vector<Trainer::PolicyTokens> tokens(mini_batch.size());
  for (size_t k = 0; k < mini_batch.size(); ++k) {
    const MicroBatch& m = mini_batch[k];
    batches.push_back(PackSamples(samples, m));
    Append(tokens[k].mask, samples, m, &RlSample::mask), Append(tokens[k].old_logp, samples, m, &RlSample::old_logp);
    Append(tokens[k].advantage, samples, m, &RlSample::advantage);
    if (loss.kl_coef > 0) Append(tokens[k].ref_logp, samples, m, &RlSample::ref_logp);
    if (loss.tis_cap > 0) Append(tokens[k].rollout_logp, samples, m, &RlSample::rollout_logp);
  }
  return trainer.PolicyStep(batches, tokens, loss);
}

absl::StatusOr<Trainer::ValueStats> UpdateCritic(Trainer& trainer, const std::vector<RlSample>& samples,
                                                 const std::vector<MicroBatch>& mini_batch, double value_clip) {
  std::vector<model::TokenBatch> batches;
  std::vector<Trainer::ValueTokens> tokens(mini_batch.size());
  for (size_t k = 0; k < mini_batch.size(); ++k) {
    const MicroBatch& m = mini_batch[k];
    batches.push_back(PackSamples(samples, m));
    Append(tokens[k].mask, samples, m, &RlSample::mask), Append(tokens[k].old_value, samples, m, &RlSample::old_value);
    Append(tokens[k].returns, samples, m, &RlSample::returns);
  }
  return trainer.ValueStep(batches, tokens, value_clip);
}

namespace {
template <typename Forward>
absl::Status Fill(std::vector<RlSample>& samples, const MicroBatchPlan& plan, std::vector<double> RlSample::*field,
                  Forward forward) {
  for (const std::vector<MicroBatch>& mini : plan)
    for (const MicroBatch& m : mini) {
      TESSERA_ASSIGN_OR_RETURN(std::vector<float> got, forward(PackSamples(samples, m)));
      if (m.pad) continue;  // run for the group's collectives; nothing to keep
      size_t at = 0;
      for (size_t i : m.samples) {
        const size_t n = samples[i].batch.size();
        (samples[i].*field).assign(got.begin() + at, got.begin() + at + n);
        at += n;
      }
    }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<Trainer::PolicyStats> UpdateActorEpochs(Trainer& trainer, const std::vector<RlSample>& samples,
                                                       const MicroBatchPlan& plan, int epochs,
                                                       const rl::PolicyLossOptions& loss, int* optimizer_steps) {
  Trainer::PolicyStats last;
  for (int e = 0; e < epochs; ++e)
    for (const std::vector<MicroBatch>& mini_batch : plan) {
      TESSERA_ASSIGN_OR_RETURN(last, UpdateActor(trainer, samples, mini_batch, loss));
      ++*optimizer_steps;
    }
  return last;
}

absl::Status FillLogProbs(model::Llama& m, std::vector<RlSample>& samples, const MicroBatchPlan& plan,
                          std::vector<double> RlSample::*field) {
  return Fill(samples, plan, field, [&](const model::TokenBatch& b) -> absl::StatusOr<std::vector<float>> {
    // The kernels the update's step will run (it prepares the same shapes): the old
    // policy's log-probs then equal the first epoch's, and a shape's plan is built here,
    // before the forward, never inside it.
    TESSERA_RETURN_IF_ERROR(m.PrepareKernels(b));
    TESSERA_ASSIGN_OR_RETURN(model::Llama::TokenStats st, m.TokenLogProbs(b));
    return std::move(st.logprob);
  });
}

absl::Status FillValues(model::Llama& critic, std::vector<RlSample>& samples, const MicroBatchPlan& plan) {
  return Fill(samples, plan, &RlSample::old_value, [&](const model::TokenBatch& b) -> absl::StatusOr<std::vector<float>> {
    TESSERA_RETURN_IF_ERROR(critic.PrepareKernels(b));  // as FillLogProbs
    return critic.TokenValues(b);
  });
}

absl::StatusOr<std::vector<double>> SequenceScores(model::Llama& reward_model, const std::vector<RlSample>& samples,
                                                   const MicroBatchPlan& plan) {
  std::vector<double> scores(samples.size(), 0.0);
  for (const std::vector<MicroBatch>& mini : plan)
    for (const MicroBatch& m : mini) {
      const model::TokenBatch b = PackSamples(samples, m);
      TESSERA_RETURN_IF_ERROR(reward_model.PrepareKernels(b));
      TESSERA_ASSIGN_OR_RETURN(std::vector<float> values, reward_model.TokenValues(b));
      if (m.pad) continue;
      for (size_t k = 0; k < m.samples.size(); ++k) scores[m.samples[k]] = values[b.cu_seqlens[k + 1] - 1];
    }
  return scores;
}

}  // namespace tessera::engine
