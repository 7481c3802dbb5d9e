#include "common/spec/rl_options.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tessera {
namespace {

template <typename T, typename Parse>
absl::StatusOr<T> Named(const std::string& field, const std::string& value, const char* fallback, Parse parse) {
  auto got = parse(value.empty() ? fallback : value);
  if (!got.ok()) return absl::InvalidArgumentError(absl::StrCat("rl.", field, ": ", got.status().message()));
  return *got;
}

}  // namespace

absl::StatusOr<rl::PolicyLossOptions> PolicyLossOf(const v1::RlSpec& r) {
  rl::PolicyLossOptions l;
  l.kl_coef = r.kl_coef();
  l.entropy_coef = r.entropy_coef();
  l.clip_low = r.clip_low() > 0 ? r.clip_low() : r.clip();
  l.clip_high = r.clip_high() > 0 ? r.clip_high() : r.clip();
  l.dual_clip = r.has_dual_clip() ? r.dual_clip() : 3.0;
  TESSERA_ASSIGN_OR_RETURN(l.kl, Named<rl::KlEstimator>("kl_estimator", r.kl_estimator(), "k3", rl::ParseKlEstimator));
  TESSERA_ASSIGN_OR_RETURN(l.aggregation,
                           Named<rl::LossAggregation>("loss_agg", r.loss_agg(), "token_mean", rl::ParseLossAggregation));
  l.norm_length = r.max_new_tokens();
  l.tis_cap = r.tis_cap();
  return l;
}

absl::StatusOr<rl::OutcomeAdvantageOptions> OutcomeAdvantagesOf(const v1::RlSpec& r) {
  rl::OutcomeAdvantageOptions o;
  TESSERA_ASSIGN_OR_RETURN(o.estimator,
                           Named<rl::AdvantageEstimator>("advantage", r.advantage(), "grpo", rl::ParseAdvantageEstimator));
  o.scale_by_std = !r.has_norm_adv_by_std() || r.norm_adv_by_std();
  o.gamma = r.gamma() > 0 ? r.gamma() : 1.0;
  o.kl_reward_coef = r.kl_reward_coef();
  TESSERA_ASSIGN_OR_RETURN(o.kl_reward, KlRewardEstimatorOf(r));
  return o;
}

absl::StatusOr<rl::KlEstimator> KlRewardEstimatorOf(const v1::RlSpec& r) {
  return Named<rl::KlEstimator>("kl_reward_estimator", r.kl_reward_estimator(), "k1", rl::ParseKlEstimator);
}

rl::OverlongOptions OverlongOf(const v1::RlSpec& r) {
  rl::OverlongOptions o;
  o.max_length = r.max_new_tokens(), o.buffer = r.overlong_buffer();
  o.factor = r.overlong_buffer() > 0 ? (r.overlong_penalty() > 0 ? r.overlong_penalty() : 1.0) : 0.0;
  return o;
}

}  // namespace tessera
