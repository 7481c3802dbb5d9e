#include "client/plan_cmd.h"

#include <algorithm>
#include <iostream>

#include <nlohmann/json.hpp>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/spec/job_spec.h"
#include "common/util.h"
#include "common/model/hf_config.h"
#include "common/plan/plan.h"
#include "common/plan/plan_spec.h"
#include "common/plan/rl_plan.h"

namespace tessera::client {
namespace {

std::string Mb(int64_t bytes) { return absl::StrFormat("%.1f MiB", bytes / 1048576.0); }
std::string LayoutName(const parallel::Layout& l) {
  return absl::StrFormat("tp%d cp%d pp%d%s dp%d zero%d%s", l.tp, l.cp, l.pp, l.vpp > 1 ? absl::StrCat(" vpp", l.vpp) : "",
                         l.dp, l.zero, l.sp ? " sp" : "");
}
nlohmann::json ToJson(const plan::Plan& p) {
  const auto& m = p.memory;
  return {{"layout", LayoutName(p.input.layout)},
          {"recompute", p.input.recompute},
          {"recompute_swiglu", p.input.recompute_swiglu},
          {"params_per_rank", p.params_per_rank},
          {"memory_bytes",
           {{"params", m.params}, {"grads", m.grads}, {"optimizer", m.optimizer}, {"activations", m.activations},
            {"total", m.total()}}},
          {"stage", p.stage},
          {"comm_bytes_per_step",
           {{"tp", p.comm.tp}, {"cp", p.comm.cp}, {"pp", p.comm.pp}, {"dp", p.comm.dp}, {"total", p.comm.total()}}}};
}

// A Hugging Face config.json's shape into `into` (a message naming `field` on failure).
bool ReadConfig(const std::string& field, const std::string& dir, model::LlamaConfig* into) {
  auto c = model::ReadHfConfig(dir);
  if (!c.ok()) {
    std::cerr << "error: " << field << ": " << c.status().message() << "\n";
    return false;
  }
  *into = *c;
  return true;
}

// grpo / ppo: each device set's models (common/plan/rl_plan.h), what they need, the KV
// cache the generating group wants, and whether it fits `memory_bytes`.
int RunRlPlan(const v1::JobSpec& spec, int64_t memory_bytes, bool json, std::ostream& out) {
  model::LlamaConfig actor, reward;
  const bool has_actor = !spec.model().hf_dir().empty(), has_reward = !spec.rl().reward_model().empty();
  if (has_actor && !ReadConfig("model.hf_dir", spec.model().hf_dir(), &actor)) return 1;
  if (has_reward && !ReadConfig("rl.reward_model", spec.rl().reward_model(), &reward)) return 1;
  auto plan = plan::PlanRl(spec, has_actor ? &actor : nullptr, has_reward ? &reward : nullptr);
  if (!plan.ok()) {
    std::cerr << "error: " << plan.status().message() << "\n";
    return 1;
  }
  bool fits = true;
  for (const plan::RlDeviceSet& d : plan->devices) fits &= memory_bytes <= 0 || d.need() <= memory_bytes;
  if (json) {
    nlohmann::json j = {{"job", spec.name()}, {"fits", fits}, {"models", nlohmann::json::array()}, {"devices", nlohmann::json::array()}};
    for (const plan::RlGroupMemory& m : plan->models)
      j["models"].push_back({{"group", m.group}, {"model", m.model}, {"devices_of", m.device_set}, {"states_bytes", m.states},
                             {"pass_bytes", m.pass}, {"offload", m.offload}});
    for (const plan::RlDeviceSet& d : plan->devices)
      j["devices"].push_back({{"devices_of", d.name}, {"states_bytes", d.states}, {"offloaded_bytes", d.offloaded},
                              {"pass_bytes", d.pass}, {"need_bytes", d.need()}, {"kv_cache_wanted_bytes", d.kv_cache},
                              {"kv_sequence_bytes", d.kv_sequence}, {"kv_beside_bytes", d.kv_beside}});
    out << j.dump(2) << "\n";
    return fits ? 0 : 2;
  }
  out << absl::StrFormat("%s (%s): %zu model%s on %zu device set%s, micro-batches of %lld tokens\n", spec.name(), spec.kind(),
                         plan->models.size(), plan->models.size() == 1 ? "" : "s", plan->devices.size(),
                         plan->devices.size() == 1 ? "" : "s", spec.rl().max_tokens_per_micro_batch());
  for (const plan::RlDeviceSet& d : plan->devices) {
    const std::string verdict =
        memory_bytes > 0 ? (d.need() <= memory_bytes ? " (fits)" : absl::StrCat(" (over ", Mb(memory_bytes), ")")) : "";
    if (d.offloaded == 0)
      out << absl::StrFormat("  devices of '%s': %s kept + %s in the largest pass = %s%s\n", d.name, Mb(d.states), Mb(d.pass),
                             Mb(d.need()), verdict);
    else
      out << absl::StrFormat("  devices of '%s': %s kept + %s in the largest turn (a group's states back from host memory, "
                             "and its pass) = %s%s; %s offloaded to page-locked host memory per device\n",
                             d.name, Mb(d.states), Mb(d.need() - d.states), Mb(d.need()), verdict, Mb(d.offloaded));
    out << "    " << plan::DeviceSetModels(*plan, d) << "\n";
    if (d.kv_cache > 0)
      out << absl::StrFormat("    KV cache: %s for every running sample at its longest (%s each); it takes what fits in "
                             "rl.gpu_memory_utilization %.2f beside the rest\n",
                             Mb(d.kv_cache), Mb(d.kv_sequence), spec.rl().gpu_memory_utilization());
  }
  if (has_reward == false && GroupWithRole(spec, "reward") != nullptr) out << "  (the reward model is not counted)\n";
  return fits ? 0 : 2;
}

}  // namespace

int RunPlan(const v1::JobSpec& spec, int devices, int64_t memory_bytes, bool json, std::ostream& out) {
  if (spec.kind() == "grpo" || spec.kind() == "ppo") return RunRlPlan(spec, memory_bytes, json, out);
  if (spec.kind() != "pretrain" && spec.kind() != "sft") {
    std::cerr << "error: plan covers pretrain, sft, grpo and ppo jobs, not '" << spec.kind() << "'\n";
    return 1;
  }
  const auto& m = spec.model();
  model::LlamaConfig hf;
  if (!m.hf_dir().empty()) {
    auto c = model::ReadHfConfig(m.hf_dir());
    if (!c.ok()) {
      std::cerr << "error: model.hf_dir: " << c.status().message() << "\n";
      return 1;
    }
    hf = *c;
  }
  const plan::PlanInput in = plan::PlanInputOf(spec, m.hf_dir().empty() ? nullptr : &hf);
  auto plan = plan::PlanTraining(in);
  if (!plan.ok()) {
    std::cerr << "error: groups[0].layout: " << plan.status().message() << "\n";
    return 1;
  }
  std::vector<plan::Plan> proposals;
  if (devices > 0 && memory_bytes > 0) proposals = plan::ProposeLayouts(in, devices, memory_bytes);
  const bool fits = memory_bytes <= 0 || plan->memory.total() <= memory_bytes;
  if (json) {
    nlohmann::json j = {{"job", spec.name()}, {"plan", ToJson(*plan)}, {"fits", fits}};
    if (in.layout.pp > 1)
      if (auto b = plan::BalanceStages(in); b.ok())
        j["stage_balance"] = {{"stage_layers", b->layers},
                              {"rank_flops", b->rank_flops},
                              {"balanced_stage_layers", b->balanced},
                              {"balanced_rank_flops", b->balanced_flops}};
    j["proposals"] = nlohmann::json::array();
    for (const auto& p : proposals) j["proposals"].push_back(ToJson(p));
    out << j.dump(2) << "\n";
    return fits ? 0 : 2;
  }
  const auto& mem = plan->memory;
  out << absl::StrFormat("%s (%s): %s%s, %d ranks, %lld x %lld tokens per micro-batch, %lld parameters per rank\n",
                         spec.name(), spec.kind(), LayoutName(in.layout),
                         absl::StrCat(in.recompute ? " recompute" : "", in.recompute_swiglu ? " recompute_swiglu" : ""),
                         in.layout.world(), in.micro_batch, in.seq_len, plan->params_per_rank);
  if (in.layout.pp > 1) out << absl::StrFormat("  (pipeline stage %d needs the most memory)\n", plan->stage);
  out << absl::StrFormat("  memory per rank: params %s, grads %s, optimizer %s, activations %s = %s%s\n", Mb(mem.params),
                         Mb(mem.grads), Mb(mem.optimizer), Mb(mem.activations), Mb(mem.total()),
                         memory_bytes > 0 ? (fits ? " (fits)" : absl::StrCat(" (over ", Mb(memory_bytes), ")")) : "");
  out << absl::StrFormat("  sent per rank and step (bus bytes): tp %s, cp %s, pp %s, dp %s\n", Mb(int64_t(plan->comm.tp)),
                         Mb(int64_t(plan->comm.cp)), Mb(int64_t(plan->comm.pp)), Mb(int64_t(plan->comm.dp)));
  if (in.layout.pp > 1) {
    if (auto b = plan::BalanceStages(in); b.ok()) {
      auto tflops = [](const std::vector<double>& v) {
        std::string s;
        for (double x : v) absl::StrAppend(&s, s.empty() ? "" : " / ", absl::StrFormat("%.2f", x / 1e12));
        return s;
      };
      auto most = [](const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); };
      out << absl::StrFormat("  compute per pipeline rank and micro-batch (model TFLOP): %s (layers per virtual stage %s)\n",
                             tflops(b->rank_flops), absl::StrJoin(b->layers, ","));
      if (b->balanced != b->layers)
        out << absl::StrFormat("  balanced: layout.stage_layers [%s] (or stage_layers: auto) gives %s (busiest rank %.0f%% of now)\n",
                               absl::StrJoin(b->balanced, ", "), tflops(b->balanced_flops),
                               100.0 * most(b->balanced_flops) / most(b->rank_flops));
    }
  }
  if (devices > 0 && memory_bytes > 0) {
    out << absl::StrFormat("layouts of %d devices within %s per device (%zu; best first):\n", devices, Mb(memory_bytes),
                           proposals.size());
    for (size_t i = 0; i < proposals.size() && i < 12; ++i) {
      const auto& p = proposals[i];
      out << absl::StrFormat("  %-30s %-10s memory %-12s sent %s\n", LayoutName(p.input.layout),
                             p.input.recompute ? "recompute" : "", Mb(p.memory.total()), Mb(int64_t(p.comm.total())));
    }
  }
  return fits ? 0 : 2;
}

}  // namespace tessera::client
