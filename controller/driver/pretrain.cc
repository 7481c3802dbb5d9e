// The pretrain driver: one worker group trains the job's Llama on the built-in data.
// It builds the group's communicators, asks every executor to set up its training
// session (model shard, optimizer, data shard), then runs the steps: every rank takes
// part in each step, and every rank reports the same global loss (DP- and TP-reduced),
// which the driver checks before streaming it as progress (with tokens/s, the model
// TFLOP/s of all ranks over the slowest rank's step time, and the largest rank's peak
// memory). A session that resumed from a checkpoint reports its step from TrainInit;
// every rank must report the same one, and the loop continues from there (the result's
// first_step says which step its losses start at). With a pipeline it also reports the
// step's bubble (the slowest stage's schedule time over the stages' mean busy time,
// minus 1) next to the ideal (pp - 1) / (vpp * micro-batches per DP rank).
// When a node of the job is leaving or drained with move_jobs (DriverContext::preempt), the next step also saves a
// checkpoint (TrainStep's save) and the driver then ends the attempt with UNAVAILABLE
// naming that step; the restarted attempt resumes from it. Without train.checkpoint the
// attempt ends at once (the job will start over).
#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "controller/driver/driver.h"

namespace tessera::controller {

using json = nlohmann::json;

absl::StatusOr<int64_t> AgreedStartStep(const std::vector<v1::TrainInitResponse>& train_init) {
  int64_t start = -1;
  for (size_t r = 0; r < train_init.size(); ++r) {
    const int64_t s = train_init[r].start_step();
    if (start >= 0 && s != start)
      return absl::DataLossError(absl::StrCat("rank ", r, " resumed from step ", s, " but rank 0 from step ", start));
    start = s;
  }
  return std::max<int64_t>(start, 0);
}

absl::StatusOr<bool> Preemption::Before(int64_t step) {
  if (ctx_.preempt == nullptr || !*ctx_.preempt) return false;
  if (!checkpoints_)
    return absl::UnavailableError(absl::StrCat("a node of the job is leaving or was drained; with no train.checkpoint the job ",
                                               "starts over elsewhere (it was at step ", step, ")"));
  saving_ = true;
  return true;
}

absl::Status Preemption::After(int64_t step, int64_t steps) const {
  if (!saving_ || step + 1 >= steps) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("a node of the job is leaving or was drained: saved the checkpoint of step ", step + 1,
                                             "; the job resumes from it elsewhere"));
}

absl::StatusOr<std::string> RunPretrain(DriverContext& ctx) {
  const auto& spec = ctx.job.spec();
  const std::string& name = spec.groups(0).name();
  WorkerGroup& wg = *ctx.groups.at(name);
  TESSERA_ASSIGN_OR_RETURN(auto inits, wg.InitAll());
  TESSERA_ASSIGN_OR_RETURN(auto started, wg.OneToAll(&ExecutorClient::TrainInit, v1::TrainInitRequest{}));
  TESSERA_ASSIGN_OR_RETURN(const int64_t start, AgreedStartStep(started));
  const int steps = spec.train().steps();
  v1::Progress ready;
  ready.set_total_steps(steps);
  ready.set_step(static_cast<int32_t>(std::min<int64_t>(start, steps)));
  ready.set_message(absl::StrCat("group '", name, "': ", inits.size(), " ranks ready to train",
                                 start > 0 ? absl::StrCat(", resumed from the checkpoint of step ", start) : ""));
  ctx.progress(ready);
  json losses = json::array(), norms = json::array();
  int64_t tokens = 0;
  const v1::ParallelLayout& layout = spec.groups(0).layout();
  const int64_t micro_per_rank =
      spec.model().micro_batch() > 0 ? spec.model().global_batch() / spec.model().micro_batch() / std::max(1, layout.dp()) : 0;
  const double ideal_bubble = layout.pp() > 1 && micro_per_rank > 0
                                  ? (layout.pp() - 1.0) / (std::max(1, layout.vpp()) * micro_per_rank)
                                  : 0;
  Preemption preemption(ctx, !spec.train().checkpoint().dir().empty());
  for (int64_t s = start; s < steps; ++s) {
    if (ctx.cancelled && *ctx.cancelled) return absl::CancelledError("cancelled");
    TESSERA_ASSIGN_OR_RETURN(const bool save, preemption.Before(s));
    v1::TrainStepRequest step;
    step.set_step(s);
    step.set_save(save);
    TESSERA_ASSIGN_OR_RETURN(auto res, wg.OneToAll(&ExecutorClient::TrainStep, step));
    const v1::TrainStepResponse& first = res[0];
    double seconds = 0, flops = 0, peak_memory = 0, checkpoint_seconds = -1, peak_flops = 0;
    double pipeline_max = 0, pipeline_busy = 0;  // the slowest stage's schedule; busy time summed
    double dp_wait = 0;                          // the longest exposed gradient reduction
    int pipeline_ranks = 0;
    bool all_peaks = true;  // MFU only when every rank knows its device's peak
    for (size_t r = 0; r < res.size(); ++r) {
      const v1::TrainStepResponse& out = res[r];
      seconds = std::max(seconds, out.seconds());
      flops += out.model_flops();
      peak_flops += out.peak_flops();
      all_peaks &= out.peak_flops() > 0;
      peak_memory = std::max(peak_memory, static_cast<double>(out.memory_peak_bytes()));
      if (out.has_checkpoint_seconds()) checkpoint_seconds = std::max(checkpoint_seconds, out.checkpoint_seconds());
      dp_wait = std::max(dp_wait, out.dp_wait_seconds());
      if (out.pipeline_seconds() > 0) {
        pipeline_max = std::max(pipeline_max, out.pipeline_seconds());
        pipeline_busy += out.pipeline_busy_seconds();
        ++pipeline_ranks;
      }
      if (r > 0 && std::abs(out.loss() - first.loss()) > 1e-5 * std::abs(first.loss()))
        return absl::DataLossError(absl::StrCat("step ", s, ": rank ", r, " reports loss ", out.loss(), " but rank 0 reports ",
                                                first.loss(), " (the ranks disagree on the global loss)"));
    }
    losses.push_back(first.loss());
    norms.push_back(first.grad_norm());
    tokens += first.tokens();
    v1::Progress p;
    p.set_step(static_cast<int32_t>(s + 1));
    p.set_total_steps(steps);
    p.set_message(absl::StrFormat("step %d/%d loss %.4f%s", s + 1, steps, first.loss(),
                                  checkpoint_seconds >= 0 ? " (checkpoint saved)" : ""));
    if (checkpoint_seconds >= 0) (*p.mutable_metrics())["checkpoint_s"] = checkpoint_seconds;  // the slowest rank
    (*p.mutable_metrics())["loss"] = first.loss();
    (*p.mutable_metrics())["grad_norm"] = first.grad_norm();
    (*p.mutable_metrics())["lr"] = first.lr();
    if (seconds > 0) {
      (*p.mutable_metrics())["tokens_per_s"] = static_cast<double>(first.tokens()) / seconds;
      (*p.mutable_metrics())["model_tflops_per_s"] = flops / seconds / 1e12;  // all ranks, slowest rank's time
      if (all_peaks) (*p.mutable_metrics())["mfu"] = flops / seconds / peak_flops;  // of the ranks' summed peaks
    }
    (*p.mutable_metrics())["memory_peak_gb"] = peak_memory / 1e9;  // the largest rank
    // DP (ZeRO-0/1) without a pipeline: the compute's wait for the overlapped gradient reduction after
    // the last backward (StepStats::dp_wait_s) — what more overlap would win back.
    if (layout.dp() * std::max(1, layout.cp()) > 1 && layout.pp() <= 1 && layout.zero() <= 1)
      (*p.mutable_metrics())["dp_wait_ms"] = 1e3 * dp_wait;
    if (pipeline_ranks > 0 && pipeline_busy > 0) {
      (*p.mutable_metrics())["pipeline_bubble"] = pipeline_max / (pipeline_busy / pipeline_ranks) - 1;
      (*p.mutable_metrics())["pipeline_bubble_ideal"] = ideal_bubble;
    }
    ctx.progress(p);
    TESSERA_RETURN_IF_ERROR(preemption.After(s, steps));
  }
  return json{{"first_step", start + 1}, {"losses", losses}, {"grad_norms", norms}, {"tokens", tokens}}.dump();
}

}  // namespace tessera::controller
