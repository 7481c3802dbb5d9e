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
// (old_logp - ref_logp) on every token: InstructGPT's k1 penalty), GAE over its tokens
// (bootstrapped with 0 after the last), then — with `whiten` — the advantages whitened
// over all the batch's tokens (unbiased deviation; verl's default). Per response: its
// tokens' critic values, and with the penalty the old policy's and the reference's
// log-probs (as many as values). reward_kl: the penalty's mean k1 over the tokens.
struct PpoAdvantageOptions {
  double gamma = 1.0, lambda = 0.95;
  double kl_reward_coef = 0;
  bool whiten = true;
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
// k3 = exp(ref - logp) - (ref - logp) - 1 (unbiased, always >= 0). KlGrad is d k / d logp.
enum class KlEstimator { kK1, kK2, kK3 };
double Kl(KlEstimator k, double logp, double ref_logp);
double KlGrad(KlEstimator k, double logp, double ref_logp);

// The actor's loss over a mini-batch's tokens (mask = 1: a response token that counts),
// token mean: L = sum_t mask_t (pg_t + kl_coef k_t - entropy_coef H_t) / sum_t mask_t, with
// ratio_t = exp(logp_t - old_logp_t) and the clipped surrogate
// pg_t = max(-A_t ratio_t, -A_t clip(ratio_t, 1 - clip_low, 1 + clip_high)), capped at
// -dual_clip A_t where A_t < 0 (dual clip, off when dual_clip <= 1).
struct PolicyLossOptions {
  double clip_low = 0.2, clip_high = 0.2;
  double dual_clip = 3.0;
  double kl_coef = 0;  // > 0: KL to the reference as a loss term (needs ref_logp)
  KlEstimator kl = KlEstimator::kK3;
  double entropy_coef = 0;  // > 0: entropy bonus (needs entropy)
};
struct PolicyTokens {
  std::vector<double> logp, old_logp, advantage, mask;
  std::vector<double> ref_logp;  // empty unless kl_coef > 0
  std::vector<double> entropy;   // empty unless entropy_coef > 0
};
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
