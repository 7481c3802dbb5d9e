#include "worker/rl/rl_samples.h"

#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/rollout/rollout.h"

namespace tessera::engine {

RlSample MakeRlSample(const std::vector<int32_t>& prompt, const std::vector<int32_t>& completion) {
  RlSample s;
  s.batch = CompletionSequence(prompt, completion, &s.mask);
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
                      const std::vector<double>& rewards) {
  Rollouts out;
  const size_t total = completions.size();
  for (size_t i = 0; i < total; ++i) {
    out.samples.push_back(MakeRlSample(prompts[i], completions[i]));
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
    out.samples.push_back(MakeRlSample(prompts[completions[i].request], completions[i].tokens));
    out.reward += out.rewards[i] / total;
    out.response_length += static_cast<double>(completions[i].tokens.size()) / total;
  }
  return out;
}

model::TokenBatch PackSamples(const std::vector<RlSample>& samples, size_t begin, size_t end) {
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

namespace {
void Append(std::vector<double>& to, const std::vector<double>& from) { to.insert(to.end(), from.begin(), from.end()); }
}  // namespace

absl::StatusOr<Trainer::PolicyStats> UpdateActor(Trainer& trainer, const std::vector<RlSample>& samples, size_t begin,
                                                 size_t end, const rl::PolicyLossOptions& loss) {
  Trainer::PolicyTokens tokens;
  for (size_t i = begin; i < end; ++i) {
    const RlSample& s = samples[i];
    Append(tokens.mask, s.mask), Append(tokens.old_logp, s.old_logp), Append(tokens.ref_logp, s.ref_logp);
    Append(tokens.advantage, s.advantage);
  }
  return trainer.PolicyStep({PackSamples(samples, begin, end)}, {tokens}, loss);
}

absl::StatusOr<Trainer::ValueStats> UpdateCritic(Trainer& trainer, const std::vector<RlSample>& samples, size_t begin,
                                                 size_t end, double value_clip) {
  Trainer::ValueTokens tokens;
  for (size_t i = begin; i < end; ++i) {
    const RlSample& s = samples[i];
    Append(tokens.mask, s.mask), Append(tokens.old_value, s.old_value), Append(tokens.returns, s.returns);
  }
  return trainer.ValueStep({PackSamples(samples, begin, end)}, {tokens}, value_clip);
}

namespace {
template <typename Forward>
absl::Status Fill(std::vector<RlSample>& samples, int parts, std::vector<double> RlSample::*field, Forward forward) {
  const size_t total = samples.size();
  for (int mb = 0; mb < parts; ++mb) {
    const size_t begin = total * mb / parts, end = total * (mb + 1) / parts;
    TESSERA_ASSIGN_OR_RETURN(std::vector<float> got, forward(PackSamples(samples, begin, end)));
    size_t at = 0;
    for (size_t i = begin; i < end; ++i) {
      const size_t n = samples[i].batch.size();
      (samples[i].*field).assign(got.begin() + at, got.begin() + at + n);
      at += n;
    }
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status FillLogProbs(model::Llama& m, std::vector<RlSample>& samples, int parts,
                          std::vector<double> RlSample::*field) {
  return Fill(samples, parts, field, [&](const model::TokenBatch& b) -> absl::StatusOr<std::vector<float>> {
    // The kernels the update's step will run (it prepares the same shapes): the old
    // policy's log-probs then equal the first epoch's, and a shape's plan is built here,
    // before the forward, never inside it.
    TESSERA_RETURN_IF_ERROR(m.PrepareKernels(b));
    TESSERA_ASSIGN_OR_RETURN(model::Llama::TokenStats st, m.TokenLogProbs(b));
    return std::move(st.logprob);
  });
}

absl::Status FillValues(model::Llama& critic, std::vector<RlSample>& samples, int parts) {
  return Fill(samples, parts, &RlSample::old_value, [&](const model::TokenBatch& b) -> absl::StatusOr<std::vector<float>> {
    TESSERA_RETURN_IF_ERROR(critic.PrepareKernels(b));  // as FillLogProbs
    return critic.TokenValues(b);
  });
}

}  // namespace tessera::engine
