// The grpo driver (first version): one worker group, the actor; each executor holds the
// rollout engine on the actor's model and the frozen reference, and runs a whole GRPO
// step on its DP rank's prompts (rl_step: generate, reward, group advantages, reference
// and old log-probs, the PPO epochs — worker/executor/train.h). The driver fans the step
// out, checks that the ranks agree on the optimizer's gradient norm (DP- and TP-reduced),
// and streams the step's metrics: reward and accuracy (exact match: the same here),
// response length, KL, clip fraction, gradient norm, samples per second and the time of
// each phase (the slowest rank's). DESIGN §8's finer split — the driver calling
// generate / log_probs / update and scoring the rewards itself — comes with split pools
// and the reward service.
#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "controller/driver/driver.h"

namespace tessera::controller {

using json = nlohmann::json;

absl::StatusOr<std::string> RunGrpo(DriverContext& ctx) {
  const auto& spec = ctx.job.spec();
  const std::string& name = spec.groups(0).name();
  WorkerGroup& wg = *ctx.groups.at(name);
  TESSERA_ASSIGN_OR_RETURN(auto inits, wg.InitAll());
  TESSERA_RETURN_IF_ERROR(wg.CallOneToAll("train_init", "{}").status());
  const int steps = spec.train().steps();
  v1::Progress ready;
  ready.set_total_steps(steps);
  ready.set_message(absl::StrCat("group '", name, "': ", inits.size(), " ranks ready for GRPO"));
  ctx.progress(ready);
  const int dp = std::max(1, spec.groups(0).layout().dp());
  json rewards = json::array();
  for (int64_t s = 0; s < steps; ++s) {
    if (ctx.cancelled && *ctx.cancelled) return absl::CancelledError("cancelled");
    TESSERA_ASSIGN_OR_RETURN(auto res, wg.CallOneToAll("rl_step", json{{"step", s}}.dump()));
    // Every rank reports its DP rank's samples (TP peers the same ones): the mean over
    // ranks is the mean over DP ranks, each with the same number of samples.
    double reward = 0, length = 0, samples = 0;
    double phase[4] = {0, 0, 0, 0};  // generate, ref, old, update: the slowest rank
    json first;
    for (size_t r = 0; r < res.size(); ++r) {
      json out = json::parse(res[r].result_json(), nullptr, false);
      if (out.is_discarded() || !out.contains("reward") || !out.contains("grad_norm"))
        return absl::InternalError(absl::StrCat("rank ", r, " returned a malformed rl_step result"));
      reward += out["reward"].get<double>() / res.size();
      length += out["response_length"].get<double>() / res.size();
      samples += out["samples"].get<double>() / res.size() * dp;
      int i = 0;
      for (const char* k : {"generate_s", "ref_s", "old_s", "update_s"}) phase[i] = std::max(phase[i], out[k].get<double>()), ++i;
      if (r == 0) {
        first = out;
      } else if (std::abs(out["grad_norm"].get<double>() - first["grad_norm"].get<double>()) >
                 1e-4 * std::abs(first["grad_norm"].get<double>()) + 1e-9) {
        return absl::DataLossError(absl::StrCat("step ", s, ": rank ", r, " reports grad norm ", out["grad_norm"].dump(),
                                                " but rank 0 reports ", first["grad_norm"].dump()));
      }
    }
    rewards.push_back(reward);
    const double seconds = phase[0] + phase[1] + phase[2] + phase[3];
    v1::Progress p;
    p.set_step(static_cast<int32_t>(s + 1));
    p.set_total_steps(steps);
    p.set_message(absl::StrFormat("step %d/%d reward %.3f kl %.4f", s + 1, steps, reward, first["kl"].get<double>()));
    auto& m = *p.mutable_metrics();
    m["reward"] = reward;
    m["accuracy"] = reward;  // the reward is the exact match of the answer
    m["response_length"] = length;
    m["kl"] = first["kl"].get<double>();
    m["clip_fraction"] = first["clip_fraction"].get<double>();
    m["grad_norm"] = first["grad_norm"].get<double>();
    m["loss"] = first["loss"].get<double>();
    m["generate_s"] = phase[0], m["ref_s"] = phase[1], m["old_logprob_s"] = phase[2], m["update_s"] = phase[3];
    if (seconds > 0) m["samples_per_s"] = samples / seconds;
    ctx.progress(p);
  }
  return json{{"rewards", rewards}}.dump();
}

}  // namespace tessera::controller
