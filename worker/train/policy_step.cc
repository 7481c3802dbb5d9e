// Trainer::PolicyStep and Trainer::ValueStep: the RL actor's and critic's optimizer steps
// (see trainer.h).
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/train/trainer.h"

namespace tessera::engine {
namespace {
double MaskSum(const std::vector<double>& mask) {
  double n = 0;
  for (double m : mask) n += m;
  return n;
}
}  // namespace

// What both RL steps do first: no pipeline; the mini-batch's counted (masked) tokens over
// every DP rank — each micro-batch's token mean is scaled by its share of them — and the
// step begun. `who` names the step in errors.
absl::StatusOr<float> Trainer::BeginMaskedStep(const char* who, const std::vector<model::TokenBatch>& micro_batches,
                                               const std::vector<const std::vector<double>*>& masks, float* also, int n_also) {
  if (pp_ != nullptr) return absl::UnimplementedError(absl::StrCat("trainer: the ", who, " does not run with pipelines yet"));
  float sums[3] = {0, 0, 0};  // the weights; then `also`'s values
  if (n_also < 0 || n_also > 2) return absl::InternalError(absl::StrCat(who, ": ", n_also, " values to reduce beside the mask"));
  for (int i = 0; i < n_also; ++i) sums[1 + i] = also[i];
  for (const std::vector<double>* mask : masks)
    for (double m : *mask) sums[0] += static_cast<float>(m);
  TESSERA_RETURN_IF_ERROR(AllReduceHost(dp_, sums, 1 + n_also));
  if (sums[0] <= 0) return absl::InvalidArgumentError(absl::StrCat(who, ": the mini-batch has no counted (masked) tokens"));
  for (int i = 0; i < n_also; ++i) also[i] = sums[1 + i];
  TESSERA_RETURN_IF_ERROR(BeginStep(micro_batches));
  return sums[0];
}

absl::StatusOr<Trainer::PolicyStats> Trainer::PolicyStep(const std::vector<model::TokenBatch>& micro_batches,
                                                         const std::vector<PolicyTokens>& tokens,
                                                         const rl::PolicyLossOptions& options) {
  if (tokens.size() != micro_batches.size())
    return absl::InvalidArgumentError(absl::StrCat("policy step: ", tokens.size(), " token sets for ",
                                                   micro_batches.size(), " micro-batches"));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const size_t t = micro_batches[i].tokens.size();
    const PolicyTokens& p = tokens[i];
    if (p.old_logp.size() != t || p.advantage.size() != t || p.mask.size() != t ||
        (options.kl_coef > 0 && p.ref_logp.size() != t) || (options.tis_cap > 0 && p.rollout_logp.size() != t))
      return absl::InvalidArgumentError(absl::StrCat("policy step: micro-batch ", i, " has ", t,
                                                     " tokens; old_logp, advantage, mask",
                                                     options.kl_coef > 0 ? ", ref_logp" : "",
                                                     options.tis_cap > 0 ? ", rollout_logp" : "", " need one value each"));
  }
  // Each token's weight and the loss's denominator under the aggregation (token mean:
  // the mask and the counted tokens).
  std::vector<rl::LossWeights> weights(tokens.size());
  float units = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    auto w = rl::ComputeLossWeights(tokens[i].mask, micro_batches[i].cu_seqlens, options.aggregation, options.norm_length);
    if (!w.ok()) return absl::InvalidArgumentError(absl::StrCat("policy step: micro-batch ", i, ": ", w.status().message()));
    weights[i] = *std::move(w);
    units += static_cast<float>(weights[i].units);
  }
  std::vector<const std::vector<double>*> masks;
  for (const rl::LossWeights& w : weights) masks.push_back(&w.weight);
  // Reduced with the weights: the loss's denominator and the counted tokens.
  float also[2] = {units, 0.f};
  for (const PolicyTokens& p : tokens) also[1] += static_cast<float>(MaskSum(p.mask));
  TESSERA_ASSIGN_OR_RETURN(const float counted, BeginMaskedStep("policy step", micro_batches, masks, also, 2));
  units = also[0];
  const float all_tokens = also[1];
  // Sums over the counted tokens of this rank, weighted: loss, pg loss, kl, clipped tokens,
  // entropy; and the importance weights' sum over the counted tokens.
  float sums[6] = {0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const PolicyTokens& p = tokens[i];
    const std::vector<double>& weight = weights[i].weight;
    const double local = MaskSum(weight);
    // A micro-batch where nothing counts still runs (its gradient is zero): the group's
    // ranks take part in the same collectives (ZeRO-3's gathers) micro-batch by micro-batch.
    auto grad = [&](const model::Llama::TokenStats& st) -> absl::StatusOr<model::Llama::TokenGrads> {
      if (local == 0) return model::Llama::TokenGrads{std::vector<float>(st.logprob.size(), 0.f), {}};
      rl::PolicyTokens in;
      in.logp.assign(st.logprob.begin(), st.logprob.end());
      in.old_logp = p.old_logp, in.advantage = p.advantage, in.mask = weight;
      if (options.kl_coef > 0) in.ref_logp = p.ref_logp;
      if (options.entropy_coef > 0) in.entropy.assign(st.entropy.begin(), st.entropy.end());
      if (options.tis_cap > 0) {
        in.is_weight.resize(p.old_logp.size());
        for (size_t t = 0; t < in.is_weight.size(); ++t) {
          in.is_weight[t] = rl::TisWeight(p.old_logp[t], p.rollout_logp[t], options.tis_cap);
          if (p.mask[t] > 0) sums[5] += static_cast<float>(in.is_weight[t]);
        }
      }
      TESSERA_ASSIGN_OR_RETURN(rl::PolicyLoss l, rl::ComputePolicyLoss(in, options));
      const double share = local / units;  // micro-batch weighted mean -> the mini-batch's aggregation
      sums[0] += static_cast<float>(l.loss * local), sums[1] += static_cast<float>(l.pg_loss * local);
      sums[2] += static_cast<float>(l.kl * local), sums[3] += static_cast<float>(l.clip_fraction * local);
      for (size_t t = 0; t < st.entropy.size() && t < weight.size(); ++t)  // reported with or without the bonus
        sums[4] += static_cast<float>(weight[t] * st.entropy[t]);
      model::Llama::TokenGrads g;
      g.dlogprob.resize(l.dlogp.size());
      for (size_t t = 0; t < l.dlogp.size(); ++t) g.dlogprob[t] = static_cast<float>(l.dlogp[t] * share);
      g.dentropy.resize(l.dentropy.size());
      for (size_t t = 0; t < l.dentropy.size(); ++t) g.dentropy[t] = static_cast<float>(l.dentropy[t] * share);
      return g;
    };
    TESSERA_RETURN_IF_ERROR(model_->ForwardBackwardLogProbs(micro_batches[i], grad).status());
  }
  TESSERA_RETURN_IF_ERROR(AllReduceHost(dp_, sums, 6));
  PolicyStats out;
  out.tokens = static_cast<int64_t>(std::lround(all_tokens));
  // The loss as aggregated; the KL, clip fraction and entropy as weighted means (token
  // means under token_mean and the token sums, means of the responses' means otherwise).
  out.loss = sums[0] / units, out.pg_loss = sums[1] / units, out.kl = sums[2] / counted;
  out.clip_fraction = sums[3] / counted, out.entropy = sums[4] / counted;
  if (options.tis_cap > 0 && all_tokens > 0) out.tis_weight = sums[5] / all_tokens;
  StepStats st;
  TESSERA_RETURN_IF_ERROR(FinishStep(st));
  out.grad_norm = st.grad_norm, out.lr = st.lr;
  return out;
}

absl::StatusOr<Trainer::ValueStats> Trainer::ValueStep(const std::vector<model::TokenBatch>& micro_batches,
                                                       const std::vector<ValueTokens>& tokens, double clip) {
  if (tokens.size() != micro_batches.size())
    return absl::InvalidArgumentError(absl::StrCat("value step: ", tokens.size(), " token sets for ",
                                                   micro_batches.size(), " micro-batches"));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const size_t t = micro_batches[i].tokens.size();
    const ValueTokens& v = tokens[i];
    if (v.old_value.size() != t || v.returns.size() != t || v.mask.size() != t)
      return absl::InvalidArgumentError(absl::StrCat("value step: micro-batch ", i, " has ", t,
                                                     " tokens; old_value, returns and mask need one value each"));
  }
  std::vector<const std::vector<double>*> masks;
  for (const ValueTokens& v : tokens) masks.push_back(&v.mask);
  TESSERA_ASSIGN_OR_RETURN(const float counted, BeginMaskedStep("value step", micro_batches, masks));
  float sums[3] = {0, 0, 0};  // this rank's sums over the counted tokens: loss, clipped, value
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const ValueTokens& v = tokens[i];
    const double local = MaskSum(v.mask);
    auto grad = [&](const std::vector<float>& values) -> absl::StatusOr<std::vector<float>> {
      if (local == 0) return std::vector<float>(values.size(), 0.f);  // (it runs: see PolicyStep)
      rl::ValueTokens in;
      in.value.assign(values.begin(), values.end());
      in.old_value = v.old_value, in.returns = v.returns, in.mask = v.mask;
      TESSERA_ASSIGN_OR_RETURN(rl::ValueLoss l, rl::ComputeValueLoss(in, clip));
      const double share = local / counted;  // micro-batch token mean -> mini-batch token mean
      sums[0] += static_cast<float>(l.loss * local), sums[1] += static_cast<float>(l.clip_fraction * local);
      for (size_t t = 0; t < values.size(); ++t) sums[2] += static_cast<float>(v.mask[t] * values[t]);
      std::vector<float> d(l.dvalue.size());
      for (size_t t = 0; t < d.size(); ++t) d[t] = static_cast<float>(l.dvalue[t] * share);
      return d;
    };
    TESSERA_RETURN_IF_ERROR(model_->ForwardBackwardValues(micro_batches[i], grad).status());
  }
  TESSERA_RETURN_IF_ERROR(AllReduceHost(dp_, sums, 3));
  ValueStats out;
  out.tokens = static_cast<int64_t>(std::lround(counted));
  out.loss = sums[0] / counted, out.clip_fraction = sums[1] / counted, out.value = sums[2] / counted;
  StepStats st;
  TESSERA_RETURN_IF_ERROR(FinishStep(st));
  out.grad_norm = st.grad_norm, out.lr = st.lr;
  return out;
}

}  // namespace tessera::engine
