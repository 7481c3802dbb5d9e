// The grpo / ppo driver (docs/design.md §7–8): the single-controller loop over the actor
// group and the rollout side, phase by phase. Where the rollout runs is placement:
//  - one group: the actor's own executors generate on the actor's model (its training
//    session holds a rollout engine); no weights move;
//  - a rollout group colocated with the actor (colocate_with, another layout): the
//    actor's executors also hold the rollout model; the weights are re-sliced in each
//    executor (SyncWeights on the actor's ranks);
//  - a rollout group on devices of its own (split pools): the weights go over a bridge
//    communicator spanning both groups (BridgeInit; the actor's first rank broadcasts
//    them in buckets, the rollout ranks re-slice them to their TP layout).
// Steps:
//  - start: the actor's TrainInit (warm start, reference, ppo's critic, resume) and the
//    rollout group's RolloutInit; the bridge; the actor's weights to the rollout model,
//    checked by digest on every rank of both groups.
//  - each step: the rollout side generates and scores the step's prompts
//    (RolloutGenerate; prompt g sampled with the seed the actor's DP rank training on it
//    gives it, so every placement samples the same); the driver gathers the samples (TP
//    rank 0 of each rollout DP rank, in DP order) — with dynamic sampling
//    (rl.filter_groups) it sets the groups whose rewards are all equal aside and asks for
//    refills (other prompts) until the batch is full or rl.max_gen_batches generations
//    ran (GroupFilter; gen_batches, filtered_groups, filled_groups) — and splits them over the actor's DP
//    ranks (RlUpdate: advantages, reference and old log-probs, the updates, ppo's critic,
//    the checkpoint); the ranks' gradient norms must agree; the new weights go to the
//    rollout model.
//    With a reward group (rl.reward_model) its scores replace the verifier's rewards
//    before anything uses them (RlForward on the reward group, TakeScores).
//  - metrics: reward (exact match of the sampled answers; on JSONL prompts, of the final
//    answer in \boxed{} or after "####"; with a reward group its mean score, and the verifier's as
//    rule_reward, with the reward phase's time and peak), held-out accuracy (the arithmetic
//    problems', or on JSONL prompts rl.eval_data's: greedy, RlEval, at the start, every
//    rl.eval_every steps and at the end), response length, KL, clip
//    fraction, entropy, gradient norm, the phase times as the driver saw them (generate,
//    update, sync) and the actor's breakdown (ref, old log-prob, update), the rollout
//    engine's own time, samples per second, the sync's bytes and GB/s; ppo adds the
//    critic's (value loss, value clip fraction, mean value, critic gradient norm —
//    checked across ranks like the actor's —, the KL in the reward, values and critic
//    update times); with groups that take turns on shared devices (groups[].offload),
//    what the step's turns cost (offload_s, offload_gib, offload_gb_per_s).
//  - the end: the rollout model's weights checked against the actor's again
//    (weights_verified).
// With train.checkpoint.dir the actor saves every save_every steps and after the last; a
// resumed job (TrainInit's start_step) continues from its checkpoint's step, and the
// result's first_step says where its rewards start (1-based, as pretrain's losses).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <future>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/spec/job_spec.h"
#include "common/status.h"
#include "controller/driver/driver.h"
#include "controller/driver/rl_advantages.h"

namespace tessera::controller {

using json = nlohmann::json;

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Runs a and b at once (b on a thread) — or, with `in_turn` (the rollout group on the
// actor's executors), a then b: an executor serves one operation at a time, in the order
// the calls reach it, and two calls that each run collectives over a different group of
// the same executors deadlock where executors take them in different orders (seen on 4
// GPUs: the actor's TP-4 digest gather against the rollout's TP-2 one). The first error
// wins.
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

// Runs each group's call: the calls of groups on the same devices one after another, in
// the order given (an executor serves one operation at a time, and two groups' collectives
// in different orders on the same executors deadlock, as Both says), those of groups on
// different devices at once. The first error in that order wins.
using GroupCall = std::pair<const WorkerGroup*, std::function<absl::Status()>>;
absl::Status ByDevices(const v1::JobSpec& spec, const std::vector<GroupCall>& calls) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<const GroupCall*>> by;
  for (const GroupCall& c : calls) {
    if (c.first == nullptr) continue;
    const std::string d = DevicesOf(spec, c.first->name());
    if (!by.count(d)) order.push_back(d);
    by[d].push_back(&c);
  }
  std::vector<absl::Status> got(order.size());
  auto run = [&](size_t i) {
    for (const GroupCall* c : by[order[i]])
      if (got[i].ok()) got[i] = c->second();
  };
  std::vector<std::thread> threads;
  for (size_t i = 1; i < order.size(); ++i) threads.emplace_back(run, i);
  if (!order.empty()) run(0);
  for (std::thread& t : threads) t.join();
  for (const absl::Status& st : got) TESSERA_RETURN_IF_ERROR(st);
  return absl::OkStatus();
}

// Groups taking turns on shared devices (groups[].offload): what a step's calls spent
// parking and restoring states — per phase the slowest rank's seconds and the largest
// rank's bytes, summed over the phases.
struct Swaps {
  double seconds = 0, bytes = 0;
  template <class Rank, class StatsOf>
  void Phase(const std::vector<Rank>& ranks, StatsOf stats_of) {
    double s = 0, b = 0;
    for (const Rank& r : ranks) {
      const auto& st = stats_of(r);
      s = std::max(s, st.swap_s()), b = std::max(b, static_cast<double>(st.swap_bytes()));
    }
    seconds += s, bytes += b;
  }
  template <class Stats>
  void Phase(const std::vector<Stats>& ranks) {
    Phase(ranks, [](const Stats& st) -> const Stats& { return st; });
  }
};

// The slowest rank's seconds and the largest peak of a forward over a group; its swaps.
void ForwardTimes(const WorkerGroup::Forward& f, double* seconds, double* peak, Swaps* swaps) {
  for (const v1::RlForwardStats& st : f.stats)
    *seconds = std::max(*seconds, st.seconds()), *peak = std::max(*peak, static_cast<double>(st.memory_peak_bytes()));
  swaps->Phase(f.stats);
}

// The actor's and ppo's critic's gradient norms agree across ranks (DP- and TP-reduced).
absl::Status CheckAgreed(int64_t step, const std::vector<v1::RlUpdateResponse>& upd) {
  for (size_t r = 1; r < upd.size(); ++r) {
    const double pairs[2][2] = {{upd[0].grad_norm(), upd[r].grad_norm()},
                                {upd[0].critic().grad_norm(), upd[r].critic().grad_norm()}};
    for (int k = 0; k < 2; ++k) {
      const double a = pairs[k][0], b = pairs[k][1];
      if (std::abs(b - a) > 1e-4 * std::abs(a) + 1e-9)
        return absl::DataLossError(absl::StrCat("step ", step, ": rank ", r, " reports ", k == 0 ? "grad_norm " : "critic grad_norm ",
                                                b, " but rank 0 reports ", a));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> RunRl(DriverContext& ctx) {
  const auto& spec = ctx.job.spec();
  WorkerGroup& actor = *ctx.groups.at(spec.groups(0).name());
  const v1::GroupSpec* rollout_spec = RolloutPool(spec);
  const bool own_model = rollout_spec != nullptr;  // the rollout runs on a model of its own
  WorkerGroup& rollout = own_model ? *ctx.groups.at(rollout_spec->name()) : actor;
  const bool own_devices = own_model && rollout_spec->colocate_with().empty();
  const bool in_turn = !own_devices;  // one set of executors serves both sides
  const int rollout_tp = std::max(1, (own_model ? *rollout_spec : spec.groups(0)).layout().tp());
  const bool ppo = spec.kind() == "ppo";
  bool offloads = false;  // groups take turns on shared devices
  for (const v1::GroupSpec& g : spec.groups()) offloads |= g.offload();
  // A reference group (the KL terms' log-probs) and a critic group (ppo's values and
  // value updates); without them the actor's executors hold those models.
  const v1::GroupSpec* reference_spec = GroupWithRole(spec, "reference");
  const v1::GroupSpec* critic_spec = GroupWithRole(spec, "critic");
  const v1::GroupSpec* reward_spec = GroupWithRole(spec, "reward");  // rl.reward_model's
  WorkerGroup* reference = reference_spec != nullptr ? ctx.groups.at(reference_spec->name()).get() : nullptr;
  WorkerGroup* critic = critic_spec != nullptr ? ctx.groups.at(critic_spec->name()).get() : nullptr;
  WorkerGroup* scorer = reward_spec != nullptr ? ctx.groups.at(reward_spec->name()).get() : nullptr;
  std::vector<v1::TrainInitResponse> started;
  TESSERA_RETURN_IF_ERROR(ByDevices(spec, {{&actor, [&] { return actor.InitAll().status(); }},
                                           {own_model ? &rollout : nullptr, [&] { return rollout.InitAll().status(); }},
                                           {reference, [&] { return reference->InitAll().status(); }},
                                           {critic, [&] { return critic->InitAll().status(); }},
                                           {scorer, [&] { return scorer->InitAll().status(); }}}));
  TESSERA_RETURN_IF_ERROR(ByDevices(spec,
      {{&actor,
        [&]() -> absl::Status {
          TESSERA_ASSIGN_OR_RETURN(started, actor.OneToAll(&ExecutorClient::TrainInit, v1::TrainInitRequest{}));
          return absl::OkStatus();
        }},
       {own_model ? &rollout : nullptr,
        [&] { return rollout.OneToAll(&ExecutorClient::RolloutInit, v1::RolloutInitRequest{}).status(); }},
       {reference, [&] { return reference->OneToAll(&ExecutorClient::TrainInit, v1::TrainInitRequest{}).status(); }},
       {scorer, [&] { return scorer->OneToAll(&ExecutorClient::TrainInit, v1::TrainInitRequest{}).status(); }}}));
  TESSERA_ASSIGN_OR_RETURN(const int64_t start, AgreedStartStep(started));
  if (critic != nullptr) {  // from the actor's step: both go on from the same one
    v1::TrainInitRequest init;
    init.set_resume_step(start);
    TESSERA_RETURN_IF_ERROR(critic->OneToAll(&ExecutorClient::TrainInit, init).status());
  }
  if (own_devices)
    TESSERA_RETURN_IF_ERROR(Both(false, [&] { return actor.OneToAll(&ExecutorClient::BridgeInit, v1::BridgeInitRequest{}).status(); },
                                 [&] { return rollout.OneToAll(&ExecutorClient::BridgeInit, v1::BridgeInitRequest{}).status(); }));
  // The actor's weights to the rollout model: bytes sent (the model in f32) and the wall
  // time; the swaps of the actor's calls into the step's `step_swaps`.
  Swaps step_swaps;
  auto sync = [&]() -> absl::StatusOr<std::pair<int64_t, double>> {
    const auto t = Clock::now();
    std::vector<v1::SyncWeightsResponse> sent;
    TESSERA_RETURN_IF_ERROR(Both(in_turn,
        [&]() -> absl::Status {
          TESSERA_ASSIGN_OR_RETURN(sent, actor.OneToAll(&ExecutorClient::SyncWeights, v1::SyncWeightsRequest{}));
          return absl::OkStatus();
        },
        [&] {
          return own_devices ? rollout.OneToAll(&ExecutorClient::SyncWeights, v1::SyncWeightsRequest{}).status() : absl::OkStatus();
        }));
    step_swaps.Phase(sent);
    return std::make_pair(sent[0].bytes(), Since(t));
  };
  // Every rank of both groups digests the global weights: all must agree.
  auto verify = [&]() -> absl::Status {
    std::vector<v1::WeightsDigestResponse> a, p;
    TESSERA_RETURN_IF_ERROR(Both(in_turn,
        [&]() -> absl::Status {
          TESSERA_ASSIGN_OR_RETURN(a, actor.OneToAll(&ExecutorClient::WeightsDigest, v1::WeightsDigestRequest{}));
          return absl::OkStatus();
        },
        [&]() -> absl::Status {
          TESSERA_ASSIGN_OR_RETURN(p, rollout.OneToAll(&ExecutorClient::WeightsDigest, v1::WeightsDigestRequest{}));
          return absl::OkStatus();
        }));
    const std::string& want = a[0].digest();
    for (size_t r = 0; r < a.size() + p.size(); ++r) {
      const bool in_rollout = r >= a.size();
      const std::string& got = in_rollout ? p[r - a.size()].digest() : a[r].digest();
      if (got != want)
        return absl::DataLossError(absl::StrCat("weight sync: ", in_rollout ? "rollout group" : "actor", " rank ",
                                                in_rollout ? r - a.size() : r, " holds other weights than actor rank 0 (digest ",
                                                got, " vs ", want, ")"));
    }
    return absl::OkStatus();
  };
  std::pair<int64_t, double> first_sync{0, 0};
  if (own_model) {
    TESSERA_ASSIGN_OR_RETURN(first_sync, sync());
    TESSERA_RETURN_IF_ERROR(verify());
  }
  const int steps = spec.train().steps();
  v1::Progress ready;
  ready.set_total_steps(steps);
  ready.set_step(static_cast<int32_t>(std::min<int64_t>(start, steps)));
  const std::string resumed = start > 0 ? absl::StrCat(", resumed from the checkpoint of step ", start) : "";
  if (own_model)
    ready.set_message(absl::StrCat("actor '", actor.name(), "' (", actor.size(), " ranks) and rollout ",
                                   own_devices ? "pool '" : "group '", rollout.name(), "' (", rollout.size(), " ranks",
                                   own_devices ? "" : ", on the actor's devices", ") ready for ", ppo ? "PPO" : "GRPO",
                                   "; weights synced (",
                                   absl::StrFormat("%.1f MB in %.3f s", first_sync.first / 1e6, first_sync.second), ")",
                                   resumed));
  else
    ready.set_message(absl::StrCat("group '", actor.name(), "': ", actor.size(), " ranks ready for ", ppo ? "PPO" : "GRPO",
                                   resumed));
  for (WorkerGroup* g : {reference, critic, scorer})
    if (g != nullptr)
      ready.set_message(absl::StrCat(ready.message(), "; ", g == reference ? "reference" : g == critic ? "critic" : "reward",
                                     " group '", g->name(), "' (",
                                     g->size(), " ranks", DevicesOf(spec, g->name()) == g->name() ? "" : absl::StrCat(
                                         ", on the devices of '", DevicesOf(spec, g->name()), "'"), ")"));
  ctx.progress(ready);
  HeldOutEvaluator held_out(spec, rollout, rollout_tp);  // the rollout side answers
  TESSERA_RETURN_IF_ERROR(held_out.Start(ctx, start, steps));
  json rewards = json::array(), grad_norms = json::array(), kls = json::array();
  int64_t sync_bytes = first_sync.first;
  double sync_seconds = 0;
  Preemption preemption(ctx, !spec.train().checkpoint().dir().empty());
  // A step's samples (RolloutGenerate on the rollout side, a reward group's scores,
  // dynamic sampling's refills) and what it took: on the driver's thread, or — one step
  // off (rl.max_staleness 1) — on another while the step before trains.
  struct Generated {
    v1::TensorBatch batch;
    Swaps swaps;
    double reward = 0, rule_reward = 0, length = 0, samples = 0, engine_s = 0, prefill_s = 0, decode_s = 0;
    double decode_steps = 0, graph_steps = 0, prompt_tokens = 0, response_tokens = 0, rollout_peak = 0, kv_cache = 0;
    double generate_s = 0, reward_wall_s = 0, reward_s = 0, reward_peak = 0, train_tokens = 0;
    double tool_calls = 0, environment_s = 0;  // multi-turn: calls per sample, the slowest rank's time in the environment
    int gen_batches = 0, filtered_groups = 0, filled_groups = 0;
  };
  const bool filtering = spec.rl().filter_groups();
  const bool one_step_off = spec.rl().max_staleness() > 0;
  auto produce = [&](int64_t s) -> absl::StatusOr<Generated> {
    // Generate: TP rank 0 of each rollout DP rank (ranks are tp fastest) gives its samples.
    // Reward: a reward group's scores replace the rule verifier's rewards. With dynamic
    // sampling (rl.filter_groups) the groups without a signal are set aside and refills
    // generate more, at most rl.max_gen_batches generations a step (GroupFilter).
    Generated out;
    GroupFilter filter(spec.rl().prompts_per_step(), spec.rl().group_size());
    v1::TensorBatch& batch = out.batch;
    v1::RlForwardHeader forward;
    forward.set_step(s);
    double &reward = out.reward, &rule_reward = out.rule_reward, &length = out.length, &samples = out.samples;
    double &engine_s = out.engine_s, &prefill_s = out.prefill_s, &decode_s = out.decode_s;
    double &decode_steps = out.decode_steps, &graph_steps = out.graph_steps, &prompt_tokens = out.prompt_tokens;
    double &response_tokens = out.response_tokens, &rollout_peak = out.rollout_peak, &kv_cache = out.kv_cache;
    double &generate_s = out.generate_s, &reward_wall_s = out.reward_wall_s, &reward_s = out.reward_s;
    double &reward_peak = out.reward_peak;
    int& gen_batches = out.gen_batches;
    for (int refill = 0;; ++refill) {
      auto t = Clock::now();
      TESSERA_ASSIGN_OR_RETURN(std::vector<RankSamples> gen, rollout.RolloutGenerate(s, refill));
      out.swaps.Phase(gen, [](const RankSamples& r) -> const v1::RolloutStats& { return r.stats; });
      ++gen_batches;
      std::vector<v1::TensorBatch> shards;
      double call_engine_s = 0, call_prefill_s = 0, call_decode_s = 0, call_reward = 0, call_samples = 0, call_environment_s = 0;
      for (size_t r = 0; r < gen.size(); r += rollout_tp) {
        const v1::RolloutStats& st = gen[r].stats;
        const double n = static_cast<double>(st.samples());
        // The rollout engine's own time (the slowest DP rank's) and its decode steps, of
        // which replayed CUDA graphs: where generate_s goes, the call's wall time.
        call_engine_s = std::max(call_engine_s, st.generate_s());
        call_prefill_s = std::max(call_prefill_s, st.prefill_s()), call_decode_s = std::max(call_decode_s, st.decode_s());
        decode_steps += static_cast<double>(st.decode_steps()), graph_steps += static_cast<double>(st.graph_steps());
        call_reward += st.reward() * n, length += st.response_length() * n, call_samples += n;
        prompt_tokens += static_cast<double>(st.prompt_tokens());
        out.tool_calls += st.tool_calls() * n, call_environment_s = std::max(call_environment_s, st.environment_s());
        rollout_peak = std::max(rollout_peak, static_cast<double>(st.memory_peak_bytes()));
        kv_cache = std::max(kv_cache, static_cast<double>(st.kv_cache_bytes()));
        shards.push_back(std::move(gen[r].samples));
      }
      engine_s += call_engine_s, prefill_s += call_prefill_s, decode_s += call_decode_s, out.environment_s += call_environment_s;
      rule_reward += call_reward, samples += call_samples;
      TESSERA_ASSIGN_OR_RETURN(v1::TensorBatch got, ConcatBatches(shards));
      generate_s += Since(t);
      if (scorer != nullptr) {
        t = Clock::now();
        double call_reward_s = 0;
        TESSERA_ASSIGN_OR_RETURN(WorkerGroup::Forward f, scorer->RlForwardDpSplit(forward, got));
        ForwardTimes(f, &call_reward_s, &reward_peak, &out.swaps);
        TESSERA_ASSIGN_OR_RETURN(const double mean, TakeScores(f.out, &got));
        call_reward = mean * call_samples;
        reward_s += call_reward_s, reward_wall_s += Since(t);
      }
      reward += call_reward;
      if (!filtering) {
        batch = std::move(got);
        break;
      }
      TESSERA_RETURN_IF_ERROR(filter.Add(std::move(got)));
      if (filter.full() || gen_batches >= spec.rl().max_gen_batches()) break;
    }
    response_tokens = length;
    if (samples > 0) reward /= samples, rule_reward /= samples, length /= samples, out.tool_calls /= samples;
    // The tokens the update's passes take: the batch's own (fewer than generated when
    // dynamic sampling set groups aside).
    out.train_tokens = prompt_tokens + response_tokens;
    if (filtering) {
      TESSERA_ASSIGN_OR_RETURN(batch, filter.Take());
      TESSERA_ASSIGN_OR_RETURN(out.train_tokens, BatchTokens(batch));
      out.filtered_groups = filter.dropped(), out.filled_groups = filter.filled();
    }
    return out;
  };
  std::future<absl::StatusOr<Generated>> prefetch;  // one step off: the next step's samples
  for (int64_t s = start; s < steps; ++s) {
    if (ctx.cancelled && *ctx.cancelled) return absl::CancelledError("cancelled");
    TESSERA_ASSIGN_OR_RETURN(const bool save, preemption.Before(s));
    const auto step_start = Clock::now();
    // The step's samples: made now, or made while the step before trained (one step off:
    // generated with the weights of two steps before).
    Generated g;
    const bool prefetched = prefetch.valid();
    if (prefetched) {
      TESSERA_ASSIGN_OR_RETURN(g, prefetch.get());
    } else {
      TESSERA_ASSIGN_OR_RETURN(g, produce(s));
    }
    if (one_step_off && s + 1 < steps) prefetch = std::async(std::launch::async, produce, s + 1);
    step_swaps = g.swaps;
    v1::TensorBatch& batch = g.batch;
    v1::RlForwardHeader forward;
    forward.set_step(s);
    const double reward = g.reward, rule_reward = g.rule_reward, length = g.length, samples = g.samples;
    const double engine_s = g.engine_s, prefill_s = g.prefill_s, decode_s = g.decode_s, decode_steps = g.decode_steps;
    const double graph_steps = g.graph_steps, prompt_tokens = g.prompt_tokens, response_tokens = g.response_tokens;
    const double rollout_peak = g.rollout_peak, kv_cache = g.kv_cache, generate_s = g.generate_s;
    const double reward_wall_s = g.reward_wall_s, reward_s = g.reward_s, reward_peak = g.reward_peak;
    const double train_tokens = g.train_tokens;
    // Update: the samples split over each group's DP ranks (whole groups each) — the
    // reference's log-probs, with a critic group the actor's old log-probs and the
    // critic's values, PPO's advantages (here), then the actor's and the critic's updates.
    auto t = Clock::now();
    double ref_s = 0, old_s = 0, actor_s = 0, values_s = 0, critic_s = 0, checkpoint_s = -1, reward_kl = 0;  // the slowest rank
    double actor_peak = 0, reference_peak = 0, critic_peak = 0;
    if (reference != nullptr) {
      TESSERA_ASSIGN_OR_RETURN(WorkerGroup::Forward f, reference->RlForwardDpSplit(forward, batch));
      ForwardTimes(f, &ref_s, &reference_peak, &step_swaps);
      for (v1::NamedTensor& x : *f.out.mutable_tensors()) *batch.add_tensors() = std::move(x);
    }
    v1::RlUpdateHeader update;
    update.set_step(s);
    update.set_save(save);
    std::vector<v1::RlUpdateResponse> upd, critic_upd;
    if (critic != nullptr) {
      WorkerGroup::Forward old, values;
      // On shared devices one after another: the actor's old log-probs (its turn goes on
      // from generating), the critic's values, then the critic's update and the actor's,
      // whose turn goes on into the next generation — two turns of each per step.
      TESSERA_RETURN_IF_ERROR(ByDevices(spec, {{&actor, [&]() -> absl::Status {
                                                  TESSERA_ASSIGN_OR_RETURN(old, actor.RlForwardDpSplit(forward, batch));
                                                  return absl::OkStatus();
                                                }},
                                               {critic, [&]() -> absl::Status {
                                                  TESSERA_ASSIGN_OR_RETURN(values, critic->RlForwardDpSplit(forward, batch));
                                                  return absl::OkStatus();
                                                }}}));
      ForwardTimes(old, &old_s, &actor_peak, &step_swaps);
      ForwardTimes(values, &values_s, &critic_peak, &step_swaps);
      for (WorkerGroup::Forward* f : {&old, &values})
        for (v1::NamedTensor& x : *f->out.mutable_tensors()) *batch.add_tensors() = std::move(x);
      TESSERA_RETURN_IF_ERROR(AddPpoAdvantages(spec.rl(), actor.layout().dp, &batch, &reward_kl));
      auto update_actor = [&]() -> absl::Status {
        TESSERA_ASSIGN_OR_RETURN(upd, actor.RlUpdateDpSplit(update, batch));
        return absl::OkStatus();
      };
      auto update_critic = [&]() -> absl::Status {
        TESSERA_ASSIGN_OR_RETURN(critic_upd, critic->RlUpdateDpSplit(update, batch));
        return absl::OkStatus();
      };
      // A step that saves: the critic's checkpoint first (it keeps one more), so that the
      // actor's latest always has the critic's of the same step beside it.
      const auto& ck = spec.train().checkpoint();
      const bool saves = !ck.dir().empty() && (save || s + 1 == steps || (ck.save_every() > 0 && (s + 1) % ck.save_every() == 0));
      if (saves) {
        TESSERA_RETURN_IF_ERROR(update_critic());
        TESSERA_RETURN_IF_ERROR(update_actor());
      } else {
        TESSERA_RETURN_IF_ERROR(ByDevices(spec, {{critic, update_critic}, {&actor, update_actor}}));
      }
      TESSERA_RETURN_IF_ERROR(CheckAgreed(s, critic_upd));
    } else {
      TESSERA_ASSIGN_OR_RETURN(upd, actor.RlUpdateDpSplit(update, batch));
    }
    const double update_wall_s = Since(t);
    TESSERA_RETURN_IF_ERROR(CheckAgreed(s, upd));
    step_swaps.Phase(upd), step_swaps.Phase(critic_upd);
    for (const v1::RlUpdateResponse& out : upd) {
      actor_peak = std::max(actor_peak, static_cast<double>(out.memory_peak_bytes()));
      if (reference == nullptr) ref_s = std::max(ref_s, out.ref_s());
      if (critic == nullptr) {
        old_s = std::max(old_s, out.old_s());
        values_s = std::max(values_s, out.critic().values_s()), critic_s = std::max(critic_s, out.critic().update_s());
        // The mean over the DP ranks' response tokens (grpo's penalty reports beside the critic's).
        reward_kl += (ppo ? out.critic().reward_kl() : out.reward_kl()) / upd.size();
      }
      actor_s = std::max(actor_s, out.update_s());
      if (out.has_checkpoint_seconds()) checkpoint_s = std::max(checkpoint_s, out.checkpoint_seconds());
    }
    for (const v1::RlUpdateResponse& out : critic_upd) {
      critic_peak = std::max(critic_peak, static_cast<double>(out.memory_peak_bytes()));
      critic_s = std::max(critic_s, out.critic().update_s());
      if (out.has_checkpoint_seconds()) checkpoint_s = std::max(checkpoint_s, out.checkpoint_seconds());
    }
    // ppo's critic statistics: the critic group's, or the actor's own critic's.
    const v1::CriticStats& critic_stats = critic_upd.empty() ? upd[0].critic() : critic_upd[0].critic();
    // One step off: the next step's generation finishes before the weights move (what the
    // update did not hide is wait_s).
    double wait_s = 0;
    if (prefetch.valid()) {
      const auto w = Clock::now();
      prefetch.wait();
      wait_s = Since(w);
    }
    // Sync: the new weights to the rollout model.
    std::pair<int64_t, double> synced{0, 0};
    if (own_model) {
      TESSERA_ASSIGN_OR_RETURN(synced, sync());
    }
    sync_bytes = synced.first, sync_seconds += synced.second;
    const v1::RlUpdateResponse& first = upd[0];
    rewards.push_back(reward);
    grad_norms.push_back(first.grad_norm());
    kls.push_back(first.kl());
    v1::Progress p;
    p.set_step(static_cast<int32_t>(s + 1));
    p.set_total_steps(steps);
    p.set_message(absl::StrFormat("step %d/%d reward %.3f kl %.4f", s + 1, steps, reward, first.kl()));
    auto& m = *p.mutable_metrics();
    m["reward"] = reward;  // the exact match of the sampled answers (the training accuracy), or the reward model's mean score
    if (scorer != nullptr) {
      m["rule_reward"] = rule_reward;  // the verifier's, beside the reward model's
      m["reward_s"] = reward_wall_s, m["reward_model_s"] = reward_s, m["reward_peak_gib"] = reward_peak / (1 << 30);
      if (reward_s > 0) m["reward_tokens_per_s"] = (prompt_tokens + response_tokens) / reward_s;  // the slowest rank's forward
    }
    m["response_length"] = length;
    if (!spec.rl().environment().empty()) m["tool_calls"] = g.tool_calls, m["environment_s"] = g.environment_s;
    if (filtering) {  // dynamic sampling: generations, groups without a signal, and those that filled the batch
      m["gen_batches"] = g.gen_batches, m["filtered_groups"] = g.filtered_groups, m["filled_groups"] = g.filled_groups;
    }
    m["kl"] = first.kl(), m["clip_fraction"] = first.clip_fraction();
    m["entropy"] = first.entropy();  // predictive entropy of the response tokens
    m["grad_norm"] = first.grad_norm(), m["loss"] = first.loss();
    if (spec.rl().tis_cap() > 0) m["tis_weight"] = first.tis_weight();  // the mean truncated importance weight
    m["generate_s"] = generate_s, m["update_s"] = update_wall_s;
    m["rollout_engine_s"] = engine_s, m["decode_steps"] = decode_steps, m["graph_steps"] = graph_steps;
    m["prefill_s"] = prefill_s, m["decode_s"] = decode_s;
    m["ref_s"] = ref_s, m["old_logprob_s"] = old_s, m["actor_update_s"] = actor_s;
    // Tokens per second of each phase's wall time: generated tokens; and every sample's
    // prompt + response tokens through the update's passes (log-probs, updates).
    if (generate_s > 0) m["generate_tokens_per_s"] = response_tokens / generate_s;
    if (update_wall_s > 0) m["train_tokens_per_s"] = train_tokens / update_wall_s;
    constexpr double kGiB = 1 << 30;
    m["rollout_peak_gib"] = rollout_peak / kGiB, m["kv_cache_gib"] = kv_cache / kGiB;
    m["actor_peak_gib"] = actor_peak / kGiB;
    if (reference != nullptr) m["reference_peak_gib"] = reference_peak / kGiB;
    if (critic != nullptr) m["critic_peak_gib"] = critic_peak / kGiB;
    if (own_model) {
      m["sync_s"] = synced.second;
      if (synced.second > 0) m["sync_gb_per_s"] = synced.first / synced.second / 1e9;
    }
    if (spec.rl().kl_reward_coef() > 0) m["reward_kl"] = reward_kl;
    if (offloads) {  // within the phases' times above
      m["offload_s"] = step_swaps.seconds, m["offload_gib"] = step_swaps.bytes / kGiB;
      if (step_swaps.seconds > 0) m["offload_gb_per_s"] = step_swaps.bytes / step_swaps.seconds / 1e9;
    }
    if (ppo) {
      m["value_loss"] = critic_stats.value_loss(), m["value_clip_fraction"] = critic_stats.value_clip_fraction();
      m["value"] = critic_stats.value(), m["critic_grad_norm"] = critic_stats.grad_norm();
      m["values_s"] = values_s, m["critic_update_s"] = critic_s;
    }
    // The step's time: its phases one after another; one step off, its wall time (the
    // generation it used ran during the step before; the next one's during this).
    const double seconds = one_step_off ? Since(step_start) : generate_s + reward_wall_s + update_wall_s + synced.second;
    if (seconds > 0) m["samples_per_s"] = samples / seconds;
    if (one_step_off) m["step_s"] = seconds, m["wait_s"] = wait_s, m["staleness"] = prefetched ? 1 : 0;
    if (checkpoint_s >= 0) {
      m["checkpoint_s"] = checkpoint_s;  // the slowest rank
      p.set_message(absl::StrCat(p.message(), " (checkpoint saved)"));
    }
    TESSERA_RETURN_IF_ERROR(held_out.AfterStep(s, steps, &p));
    ctx.progress(p);
    TESSERA_RETURN_IF_ERROR(preemption.After(s, steps));
  }
  json result{{"first_step", start + 1}, {"rewards", rewards}, {"grad_norms", grad_norms}, {"kl", kls},
              {"accuracy", held_out.curve()}};
  if (own_model) {
    TESSERA_RETURN_IF_ERROR(verify());
    const int64_t done = std::max<int64_t>(0, steps - start);
    result["weights_verified"] = true;
    result["sync_bytes"] = sync_bytes;
    result["sync_seconds_mean"] = done > 0 ? sync_seconds / done : 0.0;
  }
  return result.dump();
}

HeldOutEvaluator::HeldOutEvaluator(const v1::JobSpec& spec, WorkerGroup& group, int tp)
    : spec_(spec), group_(group), tp_(std::max(1, tp)),
      on_(spec.train().data().kind() != "jsonl" || !spec.rl().eval_data().empty()),
      multi_turn_(!spec.rl().environment().empty()) {}

absl::StatusOr<double> HeldOutEvaluator::Evaluate() {
  v1::RlEvalRequest req;
  req.set_problems(spec_.rl().eval_problems());
  TESSERA_ASSIGN_OR_RETURN(auto res, group_.OneToAll(&ExecutorClient::RlEval, req));
  int64_t correct = 0, problems = 0, calls = 0;
  for (size_t r = 0; r < res.size(); r += tp_) correct += res[r].correct(), problems += res[r].problems(), calls += res[r].tool_calls();
  // rl.eval_data may hold fewer problems than eval_problems: the ranks answer them all.
  const bool file = !spec_.rl().eval_data().empty();
  if (file ? problems < 1 || problems > spec_.rl().eval_problems() : problems != spec_.rl().eval_problems())
    return absl::InternalError(absl::StrCat("RlEval: the ranks answered ", problems, " of ", spec_.rl().eval_problems(), " problems"));
  problems_ = problems;
  tool_calls_ = double(calls) / problems;
  return double(correct) / problems;
}

absl::Status HeldOutEvaluator::Start(DriverContext& ctx, int64_t start, int steps) {
  if (!on_) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(double a, Evaluate());
  curve_.push_back(json{{"step", start}, {"accuracy", a}});
  v1::Progress p;
  p.set_total_steps(steps);
  p.set_message(absl::StrFormat("held-out accuracy at the start: %.3f (%d problems)", a, problems_));
  (*p.mutable_metrics())["accuracy"] = a;
  if (multi_turn_) {
    curve_.back()["tool_calls"] = tool_calls_;
    (*p.mutable_metrics())["eval_tool_calls"] = tool_calls_;
    p.set_message(absl::StrCat(p.message(), absl::StrFormat(", %.2f tool calls per problem", tool_calls_)));
  }
  ctx.progress(p);
  return absl::OkStatus();
}

absl::Status HeldOutEvaluator::AfterStep(int64_t s, int steps, v1::Progress* p) {
  if (!on_ || ((s + 1) % spec_.rl().eval_every() != 0 && s + 1 != steps)) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(double a, Evaluate());
  curve_.push_back(json{{"step", s + 1}, {"accuracy", a}});
  (*p->mutable_metrics())["accuracy"] = a;
  p->set_message(absl::StrCat(p->message(), absl::StrFormat(" held-out accuracy %.3f", a)));
  if (multi_turn_) {
    curve_.back()["tool_calls"] = tool_calls_;
    (*p->mutable_metrics())["eval_tool_calls"] = tool_calls_;
    p->set_message(absl::StrCat(p->message(), absl::StrFormat(" (%.2f tool calls per problem)", tool_calls_)));
  }
  return absl::OkStatus();
}

}  // namespace tessera::controller
