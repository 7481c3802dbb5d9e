// The arithmetic of the RL objectives (docs/design.md §8), on host values: GRPO's group-normalized
// advantages, PPO's GAE, the three KL estimators, and the per-token policy loss (clipped
// surrogate with dual clip, KL to the reference as a loss term, entropy bonus, token
// mean) with its gradient with respect to each token's log-probability and entropy. The
// driver computes advantages (and a KL reward penalty) from these; the actor's update
// turns the per-token gradients into logit gradients. Pure functions: no state, no
// threads; bad shapes or options are INVALID_ARGUMENT naming the field.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::rl {

// GRPO: each of the rewards' consecutive groups of `group_size` (the samples of one
// prompt) becomes (r - mean) / (std + eps), std the unbiased sample deviation (as
// torch.std, which verl uses); with scale_by_std false, r - mean (Dr. GRPO).
struct GroupAdvantageOptions {
  int group_size = 0;  // >= 2, dividing the number of rewards
  bool scale_by_std = true;
  double eps = 1e-6;
};
absl::StatusOr<std::vector<double>> GroupNormalizedAdvantages(const std::vector<double>& rewards,
                                                              const GroupAdvantageOptions& o);

// The KL estimators (Kl below).
enum class KlEstimator { kK1, kK2, kK3, kLowVarK3 };

// PPO: generalized advantage estimation over one response's tokens. values[t] is the
// critic's value before token t, `last_value` the one after the last token (0 at the end
// of a finished sequence). delta_t = r_t + gamma V_{t+1} - V_t,
// A_t = delta_t + gamma lambda A_{t+1}, returns_t = A_t + V_t.
struct Gae {
  std::vector<double> advantages, returns;
};
absl::StatusOr<Gae> ComputeGae(const std::vector<double>& rewards, const std::vector<double>& values, double gamma,
                               double lambda, double last_value = 0);

// PPO's advantages and returns over a batch of responses: each response's token rewards
// (its outcome `reward` on the last token; with kl_reward_coef > 0 minus kl_reward_coef
// x KL(old || ref) on every token, by the kl_reward estimator — k1, old_logp - ref_logp,
// is InstructGPT's penalty), GAE over its tokens
// (bootstrapped with 0 after the last), then — with `whiten` — the advantages whitened
// over all the batch's tokens (unbiased deviation; verl's default). Per response: its
// tokens' critic values, and with the penalty the old policy's and the reference's
// log-probs (as many as values). reward_kl: the penalty's mean KL over the tokens.
struct PpoAdvantageOptions {
  double gamma = 1.0, lambda = 0.95;
  double kl_reward_coef = 0;
  bool whiten = true;
  KlEstimator kl_reward = KlEstimator::kK1;  // the penalty's estimator (k1: InstructGPT's)
};
struct PpoResponse {
  double reward = 0;
  std::vector<double> values, old_logp, ref_logp;
};
struct PpoAdvantages {
  std::vector<std::vector<double>> advantages, returns;  // per response, per token
  double reward_kl = 0;
};
absl::StatusOr<PpoAdvantages> ComputePpoAdvantages(const std::vector<PpoResponse>& responses, const PpoAdvantageOptions& o);

// KL(policy || reference) per token from the two log-probabilities of the sampled token
// (Schulman's estimators): k1 = logp - ref, k2 = (logp - ref)^2 / 2,
// k3 = exp(ref - logp) - (ref - logp) - 1 (unbiased, always >= 0), and k3 made safe for
// far-apart policies ("low_var_kl", verl's): ref - logp clamped to [-20, 20], the result to
// [-10, 10] (no gradient where either clamp bites). KlGrad is d k / d logp.
// ParseKlEstimator reads "k1", "k2", "k3", "low_var_kl".
double Kl(KlEstimator k, double logp, double ref_logp);
double KlGrad(KlEstimator k, double logp, double ref_logp);
absl::StatusOr<KlEstimator> ParseKlEstimator(std::string_view name);
const char* KlEstimatorName(KlEstimator k);

// The critic-free advantage estimators over a step's responses, each response's token
// rewards being its outcome `reward` on the last token and, with kl_reward_coef > 0,
// -kl_reward_coef x KL(old policy || reference) on every token (the `kl_reward`
// estimator over old_logp and ref_logp; verl's use_kl_in_reward):
//  - grpo: each response's score (the sum of its token rewards) normalized within its
//    group of group_size consecutive responses, (s - mean) / (std + eps) (unbiased std),
//    or s - mean without scale_by_std (Dr. GRPO); every token gets it;
//  - rloo: s minus the mean of the other group_size - 1 scores (REINFORCE leave-one-out);
//  - reinforce_plus_plus: per token the discounted return of the token rewards from there
//    on (gamma), whitened over all the responses' tokens (REINFORCE++);
// gae needs a critic (ComputePpoAdvantages). reward_kl: the penalty's mean KL per token.
// ParseAdvantageEstimator reads "grpo", "rloo", "reinforce_plus_plus", "gae".
enum class AdvantageEstimator { kGrpo, kRloo, kReinforcePlusPlus, kGae };
absl::StatusOr<AdvantageEstimator> ParseAdvantageEstimator(std::string_view name);
struct OutcomeAdvantageOptions {
  AdvantageEstimator estimator = AdvantageEstimator::kGrpo;
  int group_size = 0;  // grpo, rloo: >= 2, dividing the number of responses
  bool scale_by_std = true;
  double eps = 1e-6;
  double gamma = 1.0;  // reinforce_plus_plus
  double kl_reward_coef = 0;
  KlEstimator kl_reward = KlEstimator::kK1;
};
struct OutcomeResponse {
  double reward = 0;
  size_t tokens = 0;                       // response tokens
  std::vector<double> old_logp, ref_logp;  // kl_reward_coef > 0: one per token
};
struct OutcomeAdvantages {
  std::vector<std::vector<double>> advantages;  // per response, per token
  double reward_kl = 0;
};
absl::StatusOr<OutcomeAdvantages> ComputeOutcomeAdvantages(const std::vector<OutcomeResponse>& responses,
                                                           const OutcomeAdvantageOptions& o);

// DAPO's soft overlong punishment: 0 for a response of at most max_length - buffer
// tokens, then falling linearly to -factor at max_length: -factor x (length - (max_length
// - buffer)) / buffer (buffer <= 0 or factor <= 0: off). Added to the response's reward
// before its advantage.
struct OverlongOptions {
  int64_t max_length = 0, buffer = 0;
  double factor = 0;
};
double OverlongPenalty(int64_t length, const OverlongOptions& o);

// How the actor's per-token losses l_t over a mini-batch (all DP ranks) become its loss,
// S the mini-batch's responses, n_i response i's counted tokens (verl's loss_agg_mode):
//  - token_mean: sum_t l_t / sum_i n_i;
//  - seq_mean_token_sum: sum_i sum_t l_t / S;
//  - seq_mean_token_mean: sum_i (sum_t l_t / n_i) / S;
//  - seq_mean_token_sum_norm: sum_i sum_t l_t / (S x norm_length) (Dr. GRPO's constant
//    normalization: norm_length the longest response, max_new_tokens).
// LossWeights gives a packed batch's per-token weights w_t (the mask times 1 / n_i for
// seq_mean_token_mean) and its share `units` of the denominator (sum of the mask for
// token_mean; its responses with a counted token, times norm_length for the last), so
// that the loss is sum_t w_t l_t / sum of units over the mini-batch's batches.
// ParseLossAggregation reads "token_mean", "seq_mean_token_sum", "seq_mean_token_mean",
// "seq_mean_token_sum_norm" (also with '-' for '_', as verl writes them).
enum class LossAggregation { kTokenMean, kSeqMeanTokenSum, kSeqMeanTokenMean, kSeqMeanTokenSumNorm };
absl::StatusOr<LossAggregation> ParseLossAggregation(std::string_view name);
struct LossWeights {
  std::vector<double> weight;
  double units = 0;
};
// cu_seqlens: the batch's sequence boundaries (0 ... mask.size()).
absl::StatusOr<LossWeights> ComputeLossWeights(const std::vector<double>& mask, const std::vector<int32_t>& cu_seqlens,
                                               LossAggregation a, double norm_length);

// The actor's loss over a mini-batch's tokens (mask = 1: a response token that counts;
// other values weigh the token, see LossWeights),
// weighted mean: L = sum_t mask_t (pg_t + kl_coef k_t - entropy_coef H_t) / sum_t mask_t, with
// ratio_t = exp(logp_t - old_logp_t) and the clipped surrogate
// pg_t = max(-A_t ratio_t, -A_t clip(ratio_t, 1 - clip_low, 1 + clip_high)), capped at
// -dual_clip A_t where A_t < 0 (dual clip, off when dual_clip <= 1), times is_weight_t
// where given.
struct PolicyLossOptions {
  double clip_low = 0.2, clip_high = 0.2;
  double dual_clip = 3.0;
  double kl_coef = 0;  // > 0: KL to the reference as a loss term (needs ref_logp)
  KlEstimator kl = KlEstimator::kK3;
  double entropy_coef = 0;  // > 0: entropy bonus (needs entropy)
  // How a mini-batch's token losses aggregate (Trainer::PolicyStep applies it).
  LossAggregation aggregation = LossAggregation::kTokenMean;
  double norm_length = 0;  // seq_mean_token_sum_norm's constant (> 0)
  // > 0: truncated importance sampling — the surrogate of each token weighted by
  // TisWeight(old_logp, the rollout's log-prob, tis_cap), where the samples carry the
  // rollout engine's log-probs (Trainer::PolicyStep makes PolicyTokens::is_weight).
  double tis_cap = 0;
};
struct PolicyTokens {
  std::vector<double> logp, old_logp, advantage, mask;
  std::vector<double> ref_logp;   // empty unless kl_coef > 0
  std::vector<double> entropy;    // empty unless entropy_coef > 0
  std::vector<double> is_weight;  // empty: 1; else a constant weight on each token's surrogate (and its gradient)
};
// Truncated importance sampling (the rollout engine and the trainer disagree a little on
// the same weights, and more where the rollout's weights are a step old): the weight of a
// token sampled with log-prob `rollout_logp` under a policy whose log-prob is `old_logp`,
// min(exp(old_logp - rollout_logp), cap).
double TisWeight(double old_logp, double rollout_logp, double cap);
struct PolicyLoss {
  double loss = 0;       // the token mean above
  double pg_loss = 0;    // its policy-gradient part (token mean)
  double kl = 0;         // token mean of the chosen estimator (0 without a reference)
  double entropy = 0;    // token mean (0 without entropies)
  double clip_fraction = 0;  // tokens whose ratio was clipped (either clip), of the counted
  std::vector<double> dlogp;     // dL / dlogp_t
  std::vector<double> dentropy;  // dL / dH_t (empty without entropies)
};
absl::StatusOr<PolicyLoss> ComputePolicyLoss(const PolicyTokens& in, const PolicyLossOptions& o);

// PPO's critic loss over a mini-batch's tokens, token mean, with value clipping (as the
// PPO paper's implementations and verl): v_clip_t = old_v_t + clip(v_t - old_v_t, -c, c),
// L = sum_t mask_t 0.5 max((v_t - R_t)^2, (v_clip_t - R_t)^2) / sum_t mask_t, R the
// returns (GAE's). c <= 0: no clipping. dvalue is dL / dv_t (zero where the clipped term
// wins and v_t is outside the clip range).
struct ValueTokens {
  std::vector<double> value, old_value, returns, mask;
};
struct ValueLoss {
  double loss = 0;
  double clip_fraction = 0;  // counted tokens whose clipped term was the larger one
  std::vector<double> dvalue;
};
absl::StatusOr<ValueLoss> ComputeValueLoss(const ValueTokens& in, double clip);

// Built-in rule verifier (prompts from JSONL with an "answer"): a completion's final answer
// is the content of its last \boxed{...} (braces balanced; the MATH / DeepSeek-R1
// convention) if it has one, else the text after its last "####" (GSM8K's), else the
// whole completion, with surrounding whitespace removed. The reward is 1 when it equals
// the reference answer (its own \boxed{} or "####" taken the same way) as math answers
// compare — inside surrounding $...$, without spaces or thin spaces (\, \! \;), and
// as numbers where both are one ("1,000" = "1000.0", "-3" = "-3.00") — else 0.
std::string FinalAnswer(std::string_view completion);
bool SameAnswer(std::string_view a, std::string_view b);
double ExactAnswerReward(std::string_view completion, std::string_view answer);

}  // namespace tessera::rl
