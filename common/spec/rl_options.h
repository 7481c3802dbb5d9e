// The rl section's algorithm settings (v1::RlSpec, normalized by
// NormalizeAndValidateJobSpec) as the RL library's options (common/rl.h): one reading of
// the knobs for the executors' updates and the driver's advantages alike. An unset name
// reads as its default; a name the library does not know is INVALID_ARGUMENT naming the
// field (the validator refuses it first).
#pragma once

#include "absl/status/statusor.h"
#include "common/rl.h"
#include "tessera/v1/common.pb.h"

namespace tessera {

// The actor's loss: clip_low / clip_high (default clip), dual_clip (default 3, 0: off),
// kl_coef with kl_estimator (default k3), entropy_coef, loss_agg (default token_mean;
// seq_mean_token_sum_norm over max_new_tokens), tis_cap.
absl::StatusOr<rl::PolicyLossOptions> PolicyLossOf(const v1::RlSpec& r);
// grpo jobs' advantages: the estimator (default grpo), norm_adv_by_std, kl_reward_coef
// with kl_reward_estimator (default k1), gamma (reinforce_plus_plus; default 1).
// group_size is the caller's to fill.
absl::StatusOr<rl::OutcomeAdvantageOptions> OutcomeAdvantagesOf(const v1::RlSpec& r);
// The reward penalty's estimator (default k1).
absl::StatusOr<rl::KlEstimator> KlRewardEstimatorOf(const v1::RlSpec& r);
// DAPO's overlong penalty over max_new_tokens (off without overlong_buffer).
rl::OverlongOptions OverlongOf(const v1::RlSpec& r);

}  // namespace tessera
