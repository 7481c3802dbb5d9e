// The grpo / ppo driver with a rollout pool on devices of its own (split pools;
// docs/design.md §7–8; ppo's critic stays with the actor):
// the single-controller loop calling the two worker groups phase by phase.
//  - start: the actor's train_init (warm start, reference, resume) and the pool's
//    rollout_init at once; the bridge communicator over both groups (bridge_init, every
//    rank at once); the actor's weights to the pool (sync_weights), checked by digest.
//  - each step: the pool generates and scores the step's prompts (rollout_generate;
//    every prompt sampled with the seed the actor's DP rank training on it would use
//    colocated, so a split job samples what a colocated one does); the driver gathers the
//    samples (TP rank 0 of each pool DP rank, in DP order) and splits them over the
//    actor's DP ranks (rl_update: advantages, reference and old log-probs, the updates,
//    the checkpoint); the ranks' gradient norms must agree; the new weights go to the
//    pool (sync_weights: the actor's first rank broadcasts them in buckets over the
//    bridge, the pool ranks re-slice them to their TP layout).
//  - metrics: grpo's, the phase times as the driver saw them (generate, update, sync) and
//    the actor's breakdown (ref, old log-prob, update), the sync's bytes and GB/s.
//  - the end: the pool's weights checked against the actor's again (weights_verified).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"
#include "controller/driver/driver.h"

namespace tessera::controller {

using json = nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Runs a and b at once (b on a thread) — or, with `in_turn` (the rollout group colocated
// on the actor's executors), a then b: an executor serves one call at a time, in the
// order the calls reach it, and two calls that each run collectives over a different
// group of the same executors deadlock where executors take them in different orders
// (seen on 4 GPUs: the actor's TP-4 digest gather against the rollout's TP-2 one). The
// first error wins.
template <class A, class B>
absl::Status Both(bool in_turn, A a, B b) {
  if (in_turn) {
    TESSERA_RETURN_IF_ERROR(a());
    return b();
  }
  absl::Status sb;
  std::thread t([&] { sb = b(); });
  absl::Status sa = a();
  t.join();
  return !sa.ok() ? sa : sb;
}

absl::StatusOr<json> Parse(const v1::CallResponse& r, const char* method, size_t rank) {
  json j = json::parse(r.result_json(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return absl::InternalError(absl::StrCat("rank ", rank, " returned a malformed ", method, " result"));
  return j;
}

}  // namespace

absl::StatusOr<std::string> RunGrpoSplit(DriverContext& ctx) {
  const auto& spec = ctx.job.spec();
  WorkerGroup& actor = *ctx.groups.at(spec.groups(0).name());
  WorkerGroup& pool = *ctx.groups.at(spec.groups(1).name());
  const int pool_tp = std::max(1, spec.groups(1).layout().tp());
  const bool ppo = spec.kind() == "ppo";  // the critic rides with the actor
  // A rollout group on the actor's devices (another layout): its weights are re-sliced in
  // each executor (sync_weights on the actor's ranks); no bridge.
  const bool colocated = !spec.groups(1).colocate_with().empty();
  std::vector<v1::CallResponse> started;
  TESSERA_RETURN_IF_ERROR(Both(colocated, [&] { return actor.InitAll().status(); }, [&] { return pool.InitAll().status(); }));
  TESSERA_RETURN_IF_ERROR(Both(colocated,
      [&]() -> absl::Status {
        TESSERA_ASSIGN_OR_RETURN(started, actor.CallOneToAll("train_init", "{}"));
        return absl::OkStatus();
      },
      [&] { return pool.CallOneToAll("rollout_init", "{}").status(); }));
  TESSERA_ASSIGN_OR_RETURN(const int64_t start, AgreedStartStep(started));
  if (!colocated)
    TESSERA_RETURN_IF_ERROR(Both(false, [&] { return actor.CallOneToAll("bridge_init", "{}").status(); },
                                 [&] { return pool.CallOneToAll("bridge_init", "{}").status(); }));
  // The actor's weights to the pool: bytes sent (the model in f32) and the wall time.
  auto sync = [&]() -> absl::StatusOr<std::pair<int64_t, double>> {
    const auto t = Clock::now();
    std::vector<v1::CallResponse> sent;
    TESSERA_RETURN_IF_ERROR(Both(colocated,
        [&]() -> absl::Status {
          TESSERA_ASSIGN_OR_RETURN(sent, actor.CallOneToAll("sync_weights", "{}"));
          return absl::OkStatus();
        },
        [&] { return colocated ? absl::OkStatus() : pool.CallOneToAll("sync_weights", "{}").status(); }));
    TESSERA_ASSIGN_OR_RETURN(json first, Parse(sent[0], "sync_weights", 0));
    return std::make_pair(first.value("bytes", int64_t{0}), Since(t));
  };
  // Every rank of both groups digests the global weights: all must agree.
  auto verify = [&]() -> absl::Status {
    std::vector<v1::CallResponse> a, p;
    TESSERA_RETURN_IF_ERROR(Both(colocated,
        [&]() -> absl::Status {
          TESSERA_ASSIGN_OR_RETURN(a, actor.CallOneToAll("weights_digest", "{}"));
          return absl::OkStatus();
        },
        [&]() -> absl::Status {
          TESSERA_ASSIGN_OR_RETURN(p, pool.CallOneToAll("weights_digest", "{}"));
          return absl::OkStatus();
        }));
    TESSERA_ASSIGN_OR_RETURN(json want, Parse(a[0], "weights_digest", 0));
    for (size_t r = 0; r < a.size() + p.size(); ++r) {
      const bool in_pool = r >= a.size();
      TESSERA_ASSIGN_OR_RETURN(json got, Parse(in_pool ? p[r - a.size()] : a[r], "weights_digest", r));
      if (got["digest"] != want["digest"])
        return absl::DataLossError(absl::StrCat("weight sync: ", in_pool ? "rollout pool" : "actor", " rank ",
                                                in_pool ? r - a.size() : r, " holds other weights than actor rank 0 (digest ",
                                                got["digest"].dump(), " vs ", want["digest"].dump(), ")"));
    }
    return absl::OkStatus();
  };
  TESSERA_ASSIGN_OR_RETURN(auto first_sync, sync());
  TESSERA_RETURN_IF_ERROR(verify());
  const int steps = spec.train().steps();
  v1::Progress ready;
  ready.set_total_steps(steps);
  ready.set_step(static_cast<int32_t>(std::min<int64_t>(start, steps)));
  ready.set_message(absl::StrCat("actor '", actor.name(), "' (", actor.size(), " ranks) and rollout ",
                                 colocated ? "group '" : "pool '", pool.name(), "' (", pool.size(), " ranks",
                                 colocated ? ", on the actor's devices" : "", ") ready for ", ppo ? "PPO" : "GRPO",
                                 "; weights synced (",
                                 absl::StrFormat("%.1f MB in %.3f s", first_sync.first / 1e6, first_sync.second), ")",
                                 start > 0 ? absl::StrCat(", resumed from the checkpoint of step ", start) : ""));
  ctx.progress(ready);
  HeldOutEvaluator held_out(spec, pool, pool_tp);  // the pool answers
  TESSERA_RETURN_IF_ERROR(held_out.Start(ctx, start, steps));
  json rewards = json::array(), grad_norms = json::array(), kls = json::array();
  int64_t sync_bytes = first_sync.first;
  double sync_seconds = 0;
  Preemption preemption(ctx, !spec.train().checkpoint().dir().empty());
  for (int64_t s = start; s < steps; ++s) {
    if (ctx.cancelled && *ctx.cancelled) return absl::CancelledError("cancelled");
    TESSERA_ASSIGN_OR_RETURN(const bool save, preemption.Before(s));
    // Generate: TP rank 0 of each pool DP rank (ranks are tp fastest) gives its samples.
    auto t = Clock::now();
    TESSERA_ASSIGN_OR_RETURN(auto gen, pool.CallOneToAll("rollout_generate", json{{"step", s}}.dump()));
    std::vector<v1::TensorBatch> shards;
    double reward = 0, length = 0, samples = 0, engine_s = 0, prefill_s = 0, decode_s = 0, decode_steps = 0, graph_steps = 0;
    for (size_t r = 0; r < gen.size(); r += pool_tp) {
      TESSERA_ASSIGN_OR_RETURN(json out, Parse(gen[r], "rollout_generate", r));
      const double n = out.value("samples", 0.0);
      // The rollout engine's own time (the slowest DP rank's) and its decode steps, of
      // which replayed CUDA graphs: where generate_s goes, the call's wall time.
      engine_s = std::max(engine_s, out.value("generate_s", 0.0));
      prefill_s = std::max(prefill_s, out.value("prefill_s", 0.0)), decode_s = std::max(decode_s, out.value("decode_s", 0.0));
      decode_steps += out.value("decode_steps", 0.0), graph_steps += out.value("graph_steps", 0.0);
      reward += out.value("reward", 0.0) * n, length += out.value("response_length", 0.0) * n, samples += n;
      shards.push_back(gen[r].batch());
    }
    if (samples > 0) reward /= samples, length /= samples;
    TESSERA_ASSIGN_OR_RETURN(v1::TensorBatch batch, ConcatBatches(shards));
    const double generate_s = Since(t);
    // Update: the samples split over the actor's DP ranks (whole groups each).
    t = Clock::now();
    TESSERA_ASSIGN_OR_RETURN(auto upd, actor.CallDpSplitEach("rl_update", json{{"step", s}, {"save", save}}.dump(), batch));
    const double update_wall_s = Since(t);
    double phase[5] = {0, 0, 0, 0, 0}, checkpoint_s = -1;  // ref, old, update (ppo: values, critic): the slowest rank
    double reward_kl = 0;
    json first;
    for (size_t r = 0; r < upd.size(); ++r) {
      TESSERA_ASSIGN_OR_RETURN(json out, Parse(upd[r], "rl_update", r));
      if (!out.contains("grad_norm")) return absl::InternalError(absl::StrCat("rank ", r, " returned a malformed rl_update result"));
      int i = 0;
      for (const char* k : {"ref_s", "old_s", "update_s", "values_s", "critic_s"}) phase[i] = std::max(phase[i], out.value(k, 0.0)), ++i;
      checkpoint_s = std::max(checkpoint_s, out.value("checkpoint_seconds", -1.0));
      reward_kl += out.value("reward_kl", 0.0) / upd.size();
      if (r == 0) {
        first = out;
        continue;
      }
      for (const char* k : {"grad_norm", "critic_grad_norm"}) {  // (the critic's: ppo)
        const double a = first.value(k, 0.0), b = out.value(k, 0.0);
        if (std::abs(b - a) > 1e-4 * std::abs(a) + 1e-9)
          return absl::DataLossError(absl::StrCat("step ", s, ": rank ", r, " reports ", k, " ", b, " but rank 0 reports ", a));
      }
    }
    // Sync: the new weights to the pool.
    TESSERA_ASSIGN_OR_RETURN(auto synced, sync());
    sync_bytes = synced.first, sync_seconds += synced.second;
    rewards.push_back(reward);
    grad_norms.push_back(first["grad_norm"]);
    kls.push_back(first["kl"]);
    v1::Progress p;
    p.set_step(static_cast<int32_t>(s + 1));
    p.set_total_steps(steps);
    p.set_message(absl::StrFormat("step %d/%d reward %.3f kl %.4f", s + 1, steps, reward, first["kl"].get<double>()));
    auto& m = *p.mutable_metrics();
    m["reward"] = reward;
    m["response_length"] = length;
    for (const char* k : {"kl", "clip_fraction", "entropy", "grad_norm", "loss"}) m[k] = first.value(k, 0.0);
    m["generate_s"] = generate_s, m["update_s"] = update_wall_s, m["sync_s"] = synced.second;
    m["rollout_engine_s"] = engine_s, m["decode_steps"] = decode_steps, m["graph_steps"] = graph_steps;
    m["prefill_s"] = prefill_s, m["decode_s"] = decode_s;
    m["ref_s"] = phase[0], m["old_logprob_s"] = phase[1], m["actor_update_s"] = phase[2];
    if (ppo) {
      for (const char* k : {"value_loss", "value_clip_fraction", "value", "critic_grad_norm"}) m[k] = first.value(k, 0.0);
      if (spec.rl().kl_reward_coef() > 0) m["reward_kl"] = reward_kl;
      m["values_s"] = phase[3], m["critic_update_s"] = phase[4];
    }
    if (synced.second > 0) m["sync_gb_per_s"] = synced.first / synced.second / 1e9;
    const double seconds = generate_s + update_wall_s + synced.second;
    if (seconds > 0) m["samples_per_s"] = samples / seconds;
    if (checkpoint_s >= 0) {
      m["checkpoint_s"] = checkpoint_s;
      p.set_message(absl::StrCat(p.message(), " (checkpoint saved)"));
    }
    TESSERA_RETURN_IF_ERROR(held_out.AfterStep(s, steps, &p));
    ctx.progress(p);
    TESSERA_RETURN_IF_ERROR(preemption.After(s, steps));
  }
  TESSERA_RETURN_IF_ERROR(verify());
  const int64_t done = std::max<int64_t>(0, steps - start);
  return json{{"first_step", start + 1}, {"rewards", rewards}, {"grad_norms", grad_norms}, {"kl", kls},
              {"accuracy", held_out.curve()},
              {"weights_verified", true}, {"sync_bytes", sync_bytes},
              {"sync_seconds_mean", done > 0 ? sync_seconds / done : 0.0}}
      .dump();
}

}  // namespace tessera::controller
