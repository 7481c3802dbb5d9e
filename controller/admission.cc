#include "controller/admission.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/plan/plan_spec.h"
#include "common/plan/rl_plan.h"

namespace tessera::controller {
namespace {
std::string GiB(int64_t b) { return absl::StrFormat("%.2f GiB", b / 1073741824.0); }
}  // namespace

// grpo / ppo: every device set's groups (plan::PlanRl) — what stays, and the largest turn
// of one group (its states if it offloads, its pass) — and, on GPUs, room for one
// sample's KV cache within rl.gpu_memory_utilization beside what its group keeps there.
absl::Status CheckRlPlanFits(const v1::JobSpec& spec, int64_t device_memory_bytes) {
  auto plan = plan::PlanRl(spec);
  if (!plan.ok()) return absl::OkStatus();  // the executors refuse what cannot be planned, by name
  const bool gpu = spec.groups(0).device_type() == v1::DEVICE_TYPE_GPU;
  const double budget = gpu ? spec.rl().gpu_memory_utilization() * double(device_memory_bytes) : double(device_memory_bytes);
  for (const plan::RlDeviceSet& d : plan->devices) {
    const bool fits = d.need() <= device_memory_bytes;
    const bool kv_fits = !gpu || d.kv_sequence == 0 || double(d.kv_beside + d.kv_sequence) <= budget;
    if (fits && kv_fits) continue;
    std::string why = absl::StrCat("the devices of group '", d.name, "': `tessera plan` puts ", GiB(d.need()),
                                   " on each (", plan::DeviceSetModels(*plan, d), ")");
    if (!fits) {
      absl::StrAppend(&why, " but its ", gpu ? "GPUs have" : "CPU slots have", " ", GiB(device_memory_bytes));
    } else {
      absl::StrAppend(&why, absl::StrFormat(", which leaves no room within rl.gpu_memory_utilization %.2f of its %s for the "
                                            "KV cache of one sample at its longest (%s)",
                                            spec.rl().gpu_memory_utilization(), GiB(device_memory_bytes), GiB(d.kv_sequence)));
    }
    return absl::ResourceExhaustedError(absl::StrCat(
        why, ": give the groups devices of their own, let the groups that share devices take turns (groups[].offload), "
             "more devices (tp, dp, ZeRO), recomputation or a smaller "
             "rl.max_tokens_per_micro_batch (`tessera plan JOB.yaml` shows each group's share)"));
  }
  return absl::OkStatus();
}

absl::Status CheckPlanFits(const v1::JobSpec& spec, int64_t device_memory_bytes) {
  const std::string& kind = spec.kind();
  const bool rl = kind == "grpo" || kind == "ppo";
  if (device_memory_bytes <= 0 || spec.groups_size() == 0 || !spec.model().hf_dir().empty() ||
      (kind != "pretrain" && kind != "sft" && !rl))
    return absl::OkStatus();
  if (rl) return CheckRlPlanFits(spec, device_memory_bytes);
  auto plan = plan::PlanTraining(plan::PlanInputOf(spec));
  if (!plan.ok()) return absl::OkStatus();  // the executors refuse what cannot be planned, by name
  const auto& m = plan->memory;
  if (m.total() <= device_memory_bytes) return absl::OkStatus();
  const auto& g = spec.groups(0);
  return absl::ResourceExhaustedError(absl::StrCat(
      "groups[0] ('", g.name(), "'): `tessera plan` puts ", GiB(m.total()),
      " on each rank (parameters ", GiB(m.params), ", gradients ", GiB(m.grads), ", optimizer ", GiB(m.optimizer),
      ", activations ", GiB(m.activations),
      ") but its ", g.device_type() == v1::DEVICE_TYPE_GPU ? "GPUs have" : "CPU slots have", " ", GiB(device_memory_bytes),
      ": use more devices, a higher ZeRO stage, recomputation or smaller micro-batches (`tessera plan --devices N "
      "--memory SIZE` lists layouts that fit)"));
}

}  // namespace tessera::controller
