#include "common/plan/rl_plan.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/plan/plan_spec.h"
#include "common/spec/job_spec.h"
#include "common/status.h"

namespace tessera::plan {
namespace {

// The spec's model (or model.hf_dir's) as the executors of `g` build it: its precision.
model::LlamaConfig ConfigOf(const v1::JobSpec& spec, const model::LlamaConfig* hf, const v1::GroupSpec& g) {
  return PlanInputOf(spec, g, hf).config;
}

// A group's training plan for RL micro-batches of rl.max_tokens_per_micro_batch tokens.
absl::StatusOr<Plan> TrainingPlan(const v1::JobSpec& spec, const model::LlamaConfig& config, const v1::GroupSpec& g,
                                  const std::string& what) {
  PlanInput in = PlanInputOf(spec, g);
  in.config = config;
  in.micro_batch = 1;
  in.seq_len = std::max<int64_t>(1, spec.rl().max_tokens_per_micro_batch());
  in.global_batch = in.layout.dp;
  auto p = PlanTraining(in);
  if (!p.ok()) return absl::InvalidArgumentError(absl::StrCat(what, ": ", p.status().message()));
  return p;
}

// Elements of a rank's TP shard of the model (the planner's count).
absl::StatusOr<int64_t> ShardElements(const v1::JobSpec& spec, const model::LlamaConfig& config, const v1::GroupSpec& g,
                                      const std::string& what) {
  v1::GroupSpec frozen = g;
  frozen.mutable_layout()->set_zero(0);
  TESSERA_ASSIGN_OR_RETURN(Plan p, TrainingPlan(spec, config, frozen, what));
  return p.params_per_rank;
}

}  // namespace

absl::StatusOr<RlPlan> PlanRl(const v1::JobSpec& spec, const model::LlamaConfig* actor_hf,
                              const model::LlamaConfig* reward_hf) {
  if (spec.kind() != "grpo" && spec.kind() != "ppo")
    return absl::InvalidArgumentError(absl::StrCat("plan: an RL plan is for grpo and ppo jobs, not '", spec.kind(), "'"));
  const v1::RlSpec& rl = spec.rl();
  const v1::GroupSpec& actor = spec.groups(0);
  const int64_t tokens = std::max<int64_t>(1, rl.max_tokens_per_micro_batch());
  const bool kl = rl.kl_coef() > 0 || rl.kl_reward_coef() > 0, ppo = spec.kind() == "ppo";
  RlPlan out;
  auto add = [&](const v1::GroupSpec& g, const std::string& model, int64_t states, int64_t pass) {
    out.models.push_back({g.name(), g.offload(), model, DevicesOf(spec, g.name()), states, pass});
  };
  // A frozen model: its compute copy (bf16; f32 where it computes in f32) and one forward.
  auto frozen = [&](const v1::GroupSpec& g, const model::LlamaConfig& c, const std::string& model) -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(const int64_t n, ShardElements(spec, c, g, absl::StrCat("group '", g.name(), "'")));
    add(g, model, tessera::DTypeSize(c.dtype) * n, ForwardPassBytes(c, LayoutOf(g.layout()), tokens));
    return absl::OkStatus();
  };
  auto trained = [&](const v1::GroupSpec& g, const model::LlamaConfig& c, const std::string& model) -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(Plan p, TrainingPlan(spec, c, g, absl::StrCat("group '", g.name(), "'")));
    add(g, model, p.memory.states(), p.memory.activations);
    return absl::OkStatus();
  };
  TESSERA_RETURN_IF_ERROR(trained(actor, ConfigOf(spec, actor_hf, actor), "actor"));
  const v1::GroupSpec* reference = GroupWithRole(spec, "reference");
  const v1::GroupSpec* critic = GroupWithRole(spec, "critic");
  const v1::GroupSpec* rollout = GroupWithRole(spec, "rollout");
  const v1::GroupSpec* reward = GroupWithRole(spec, "reward");
  // The reference and the critic: in groups of their own, or beside the actor.
  if (kl) {
    const v1::GroupSpec& g = reference != nullptr ? *reference : actor;
    TESSERA_RETURN_IF_ERROR(frozen(g, ConfigOf(spec, actor_hf, g), "reference"));
  }
  if (ppo) {
    const v1::GroupSpec& g = critic != nullptr ? *critic : actor;
    model::LlamaConfig value = ConfigOf(spec, actor_hf, g);
    value.value_head = true, value.tie_embeddings = false;
    TESSERA_RETURN_IF_ERROR(trained(g, value, "critic"));
  }
  if (rollout != nullptr) {
    const model::LlamaConfig c = ConfigOf(spec, actor_hf, *rollout);
    TESSERA_ASSIGN_OR_RETURN(const int64_t n, ShardElements(spec, c, *rollout, absl::StrCat("group '", rollout->name(), "'")));
    const int64_t copy = c.dtype == tessera::DType::kF32 ? 0 : tessera::DTypeSize(c.dtype);
    add(*rollout, "rollout", (4 + copy) * n, 0);
  }
  if (reward != nullptr && reward_hf != nullptr) {
    model::LlamaConfig c = *reward_hf;
    c.dtype = ConfigOf(spec, nullptr, *reward).dtype;
    TESSERA_RETURN_IF_ERROR(frozen(*reward, c, "reward"));
  }
  // The device sets, in the order their groups come; each group's states and largest pass.
  std::map<std::string, size_t> at;
  struct Turn {
    int64_t states = 0, pass = 0;
    bool offload = false;
  };
  std::map<std::string, Turn> turns;  // by group
  for (const RlGroupMemory& m : out.models) {
    if (!at.count(m.device_set)) at[m.device_set] = out.devices.size(), out.devices.push_back({m.device_set});
    RlDeviceSet& d = out.devices[at[m.device_set]];
    (m.offload ? d.offloaded : d.states) += m.states;
    d.pass = std::max(d.pass, m.pass);
    Turn& t = turns[m.group];
    t.states += m.states, t.pass = std::max(t.pass, m.pass), t.offload = m.offload;
  }
  // What is on a device while `groups` run: what stays, and those of them that offload —
  // or, when none of them does, the largest offloading group's (whose turn it last was).
  auto resident = [&](const std::string& set, std::initializer_list<const v1::GroupSpec*> groups) {
    int64_t n = out.devices[at[set]].states, largest = 0;
    bool any = false;
    for (const v1::GroupSpec* g : groups)
      if (g != nullptr && turns[g->name()].offload) n += turns[g->name()].states, any = true;
    for (const auto& [name, t] : turns)
      if (t.offload && DevicesOf(spec, name) == set) largest = std::max(largest, t.states);
    return any ? n : n + largest;
  };
  for (const v1::GroupSpec& g : spec.groups()) {
    if (!turns.count(g.name())) continue;
    const std::string set = DevicesOf(spec, g.name());
    RlDeviceSet& d = out.devices[at[set]];
    d.peak = std::max(d.peak, resident(set, {&g}) + turns[g.name()].pass);
  }
  if (rollout != nullptr && DevicesOf(spec, rollout->name()) == DevicesOf(spec, actor.name())) {  // the weight sync
    RlDeviceSet& d = out.devices[at[DevicesOf(spec, actor.name())]];
    d.peak = std::max(d.peak, resident(d.name, {&actor, rollout}));
  }
  // The KV cache of the generating group: every sample of its DP rank that runs at once at
  // the longest prompt + max_new_tokens (arithmetic prompts: "a+b=", 2 x digits + 2 bytes;
  // JSONL prompts: model.seq_len bounds prompt and answer where it is set).
  const v1::GroupSpec& gen = rollout != nullptr ? *rollout : actor;
  const model::LlamaConfig c = ConfigOf(spec, actor_hf, gen);
  const parallel::Layout l = LayoutOf(gen.layout());
  const bool arithmetic = spec.train().data().kind() == "arithmetic" || spec.train().data().kind().empty();
  const int64_t longest = arithmetic ? 2 * std::max(1, spec.train().data().digits()) + 2 + rl.max_new_tokens()
                                     : std::max<int64_t>(spec.model().seq_len(), rl.max_new_tokens() + 1);
  const int64_t running = std::min<int64_t>(1024, int64_t(rl.prompts_per_step() / std::max(1, l.dp)) * rl.group_size());
  const int64_t per_token = 2 * c.layers * c.LocalKvHeads(l.tp) * c.HeadDim() * tessera::DTypeSize(c.dtype);
  RlDeviceSet& d = out.devices[at[DevicesOf(spec, gen.name())]];
  d.kv_beside = resident(d.name, {&gen});
  d.kv_sequence = per_token * longest;
  d.kv_cache = d.kv_sequence * running;
  return out;
}

std::string DeviceSetModels(const RlPlan& plan, const RlDeviceSet& d) {
  std::string out;
  for (const RlGroupMemory& m : plan.models) {
    if (m.device_set != d.name) continue;
    absl::StrAppend(&out, out.empty() ? "" : ", ", m.model, m.group != m.model ? absl::StrCat(" ('", m.group, "')") : "", " ",
                    absl::StrFormat("%.2f GiB", m.states / 1073741824.0), m.offload ? " offloaded" : "");
    if (m.pass > 0) absl::StrAppend(&out, absl::StrFormat(" (+%.2f GiB in its passes)", m.pass / 1073741824.0));
  }
  return out;
}

}  // namespace tessera::plan
