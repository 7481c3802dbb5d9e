// The grpo driver (first version): one worker group, the actor; each executor holds the
// rollout engine on the actor's model and the frozen reference, and runs a whole GRPO
// step on its DP rank's prompts (rl_step: generate, reward, group advantages, reference
// and old log-probs, the PPO epochs — worker/executor/train.h). The driver fans the step
// out, checks that the ranks agree on the optimizer's gradient norm (DP- and TP-reduced),
// and streams the step's metrics: reward (exact match of the sampled answers; on JSONL
// prompts, of the final answer after "####"), held-out accuracy (arithmetic problems
// only: greedy, rl_eval, at the start, every rl.eval_every steps and at the end),
// response length, KL, clip fraction, gradient norm, samples per second and the time of
// each phase (the slowest rank's). With train.checkpoint.dir the executors save every
// save_every GRPO steps and after the last; a resumed job (train_init's start_step)
// continues from its checkpoint's step, and its result's first_step says where its
// rewards start (1-based, as pretrain's losses). docs/design.md §8's finer split — the driver calling
// generate / log_probs / update and scoring the rewards itself — comes with split pools
// and the reward service. ppo jobs run through the same driver: their executors also
// hold the critic, and the step's metrics add the critic's (value loss, value clip
// fraction, mean value, critic grad norm — checked across ranks like the actor's — and
// the values and critic-update times).
#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/spec/job_spec.h"
#include "common/status.h"
#include "controller/driver/driver.h"

namespace tessera::controller {

using json = nlohmann::json;

absl::StatusOr<std::string> RunGrpoSplit(DriverContext& ctx);  // driver/grpo_split.cc

absl::StatusOr<std::string> RunGrpo(DriverContext& ctx) {
  const auto& spec = ctx.job.spec();
  if (RolloutPool(spec) != nullptr) return RunGrpoSplit(ctx);  // a rollout pool on devices of its own
  const std::string& name = spec.groups(0).name();
  WorkerGroup& wg = *ctx.groups.at(name);
  TESSERA_ASSIGN_OR_RETURN(auto inits, wg.InitAll());
  TESSERA_ASSIGN_OR_RETURN(auto started, wg.CallOneToAll("train_init", "{}"));
  TESSERA_ASSIGN_OR_RETURN(const int64_t start, AgreedStartStep(started));  // a resumed job's GRPO step
  const int steps = spec.train().steps();
  v1::Progress ready;
  ready.set_total_steps(steps);
  ready.set_step(static_cast<int32_t>(std::min<int64_t>(start, steps)));
  const bool ppo = spec.kind() == "ppo";
  ready.set_message(absl::StrCat("group '", name, "': ", inits.size(), " ranks ready for ", ppo ? "PPO" : "GRPO",
                                 start > 0 ? absl::StrCat(", resumed from the checkpoint of step ", start) : ""));
  ctx.progress(ready);
  const int dp = std::max(1, spec.groups(0).layout().dp()), tp = std::max(1, spec.groups(0).layout().tp());
  HeldOutEvaluator held_out(spec, wg, tp);
  TESSERA_RETURN_IF_ERROR(held_out.Start(ctx, start, steps));
  json rewards = json::array(), grad_norms = json::array(), kls = json::array();
  Preemption preemption(ctx, !spec.train().checkpoint().dir().empty());
  for (int64_t s = start; s < steps; ++s) {
    if (ctx.cancelled && *ctx.cancelled) return absl::CancelledError("cancelled");
    TESSERA_ASSIGN_OR_RETURN(const bool save, preemption.Before(s));
    TESSERA_ASSIGN_OR_RETURN(auto res, wg.CallOneToAll("rl_step", json{{"step", s}, {"save", save}}.dump()));
    // Every rank reports its DP rank's samples (TP peers the same ones): the mean over
    // ranks is the mean over DP ranks, each with the same number of samples.
    double reward = 0, length = 0, samples = 0;
    double phase[6] = {0, 0, 0, 0, 0, 0};  // generate, ref, old, update (ppo: values, critic): the slowest rank
    double checkpoint_s = -1;
    json first;
    for (size_t r = 0; r < res.size(); ++r) {
      json out = json::parse(res[r].result_json(), nullptr, false);
      if (out.is_discarded() || !out.contains("reward") || !out.contains("grad_norm"))
        return absl::InternalError(absl::StrCat("rank ", r, " returned a malformed rl_step result"));
      reward += out["reward"].get<double>() / res.size();
      length += out["response_length"].get<double>() / res.size();
      samples += out["samples"].get<double>() / res.size() * dp;
      int i = 0;
      for (const char* k : {"generate_s", "ref_s", "old_s", "update_s", "values_s", "critic_s"})
        phase[i] = std::max(phase[i], out.value(k, 0.0)), ++i;
      checkpoint_s = std::max(checkpoint_s, out.value("checkpoint_seconds", -1.0));
      if (r == 0) {
        first = out;
      } else if (std::abs(out["grad_norm"].get<double>() - first["grad_norm"].get<double>()) >
                 1e-4 * std::abs(first["grad_norm"].get<double>()) + 1e-9) {
        return absl::DataLossError(absl::StrCat("step ", s, ": rank ", r, " reports grad norm ", out["grad_norm"].dump(),
                                                " but rank 0 reports ", first["grad_norm"].dump()));
      } else if (ppo && std::abs(out.value("critic_grad_norm", 0.0) - first.value("critic_grad_norm", 0.0)) >
                            1e-4 * std::abs(first.value("critic_grad_norm", 0.0)) + 1e-9) {
        return absl::DataLossError(absl::StrCat("step ", s, ": rank ", r, " reports critic grad norm ",
                                                out.value("critic_grad_norm", 0.0), " but rank 0 reports ",
                                                first.value("critic_grad_norm", 0.0)));
      }
    }
    rewards.push_back(reward);
    grad_norms.push_back(first["grad_norm"]);
    kls.push_back(first["kl"]);
    const double seconds = phase[0] + phase[1] + phase[2] + phase[3] + phase[4] + phase[5];
    v1::Progress p;
    p.set_step(static_cast<int32_t>(s + 1));
    p.set_total_steps(steps);
    p.set_message(absl::StrFormat("step %d/%d reward %.3f kl %.4f", s + 1, steps, reward, first["kl"].get<double>()));
    auto& m = *p.mutable_metrics();
    m["reward"] = reward;  // the exact match of the sampled answers: the training accuracy
    m["response_length"] = length;
    m["kl"] = first["kl"].get<double>();
    m["clip_fraction"] = first["clip_fraction"].get<double>();
    m["entropy"] = first["entropy"].get<double>();  // predictive entropy of the response tokens
    m["grad_norm"] = first["grad_norm"].get<double>();
    m["loss"] = first["loss"].get<double>();
    m["generate_s"] = phase[0], m["ref_s"] = phase[1], m["old_logprob_s"] = phase[2], m["update_s"] = phase[3];
    if (ppo) {
      for (const char* k : {"value_loss", "value_clip_fraction", "value", "critic_grad_norm"}) m[k] = first.value(k, 0.0);
      if (spec.rl().kl_reward_coef() > 0) {  // the KL in the reward: the mean over the DP ranks' response tokens
        double kl = 0;
        for (const auto& r : res) kl += json::parse(r.result_json(), nullptr, false).value("reward_kl", 0.0) / res.size();
        m["reward_kl"] = kl;
      }
      m["values_s"] = phase[4], m["critic_update_s"] = phase[5];
    }
    if (seconds > 0) m["samples_per_s"] = samples / seconds;
    if (checkpoint_s >= 0) {
      m["checkpoint_s"] = checkpoint_s;  // the slowest rank
      p.set_message(absl::StrCat(p.message(), " (checkpoint saved)"));
    }
    TESSERA_RETURN_IF_ERROR(held_out.AfterStep(s, steps, &p));
    ctx.progress(p);
    TESSERA_RETURN_IF_ERROR(preemption.After(s, steps));
  }
  return json{{"first_step", start + 1}, {"rewards", rewards}, {"grad_norms", grad_norms}, {"kl", kls},
              {"accuracy", held_out.curve()}}
      .dump();
}

HeldOutEvaluator::HeldOutEvaluator(const v1::JobSpec& spec, WorkerGroup& group, int tp)
    : spec_(spec), group_(group), tp_(std::max(1, tp)), on_(spec.train().data().kind() != "jsonl") {}

absl::StatusOr<double> HeldOutEvaluator::Evaluate() {
  TESSERA_ASSIGN_OR_RETURN(auto res, group_.CallOneToAll("rl_eval", json{{"problems", spec_.rl().eval_problems()}}.dump()));
  int64_t correct = 0, problems = 0;
  for (size_t r = 0; r < res.size(); r += tp_) {
    json out = json::parse(res[r].result_json(), nullptr, false);
    if (out.is_discarded() || !out.contains("correct") || !out.contains("problems"))
      return absl::InternalError(absl::StrCat("rank ", r, " returned a malformed rl_eval result"));
    correct += out["correct"].get<int64_t>(), problems += out["problems"].get<int64_t>();
  }
  if (problems != spec_.rl().eval_problems())
    return absl::InternalError(absl::StrCat("rl_eval: the ranks answered ", problems, " of ", spec_.rl().eval_problems(), " problems"));
  return double(correct) / problems;
}

absl::Status HeldOutEvaluator::Start(DriverContext& ctx, int64_t start, int steps) {
  if (!on_) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(double a, Evaluate());
  curve_.push_back(json{{"step", start}, {"accuracy", a}});
  v1::Progress p;
  p.set_total_steps(steps);
  p.set_message(absl::StrFormat("held-out accuracy at the start: %.3f (%d problems)", a, spec_.rl().eval_problems()));
  (*p.mutable_metrics())["accuracy"] = a;
  ctx.progress(p);
  return absl::OkStatus();
}

absl::Status HeldOutEvaluator::AfterStep(int64_t s, int steps, v1::Progress* p) {
  if (!on_ || ((s + 1) % spec_.rl().eval_every() != 0 && s + 1 != steps)) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(double a, Evaluate());
  curve_.push_back(json{{"step", s + 1}, {"accuracy", a}});
  (*p->mutable_metrics())["accuracy"] = a;
  p->set_message(absl::StrCat(p->message(), absl::StrFormat(" held-out accuracy %.3f", a)));
  return absl::OkStatus();
}

}  // namespace tessera::controller
