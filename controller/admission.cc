#include "controller/admission.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/plan/plan_spec.h"

namespace tessera::controller {
namespace {
std::string GiB(int64_t b) { return absl::StrFormat("%.2f GiB", b / 1073741824.0); }
}  // namespace

absl::Status CheckPlanFits(const v1::JobSpec& spec, int64_t device_memory_bytes) {
  const std::string& kind = spec.kind();
  const bool rl = kind == "grpo" || kind == "ppo";
  if (device_memory_bytes <= 0 || spec.groups_size() == 0 || !spec.model().hf_dir().empty() ||
      (kind != "pretrain" && kind != "sft" && !rl))
    return absl::OkStatus();
  auto plan = plan::PlanTraining(plan::PlanInputOf(spec));
  if (!plan.ok()) return absl::OkStatus();  // the executors refuse what cannot be planned, by name
  const auto& m = plan->memory;
  if (m.total() <= device_memory_bytes) return absl::OkStatus();
  const auto& g = spec.groups(0);
  return absl::ResourceExhaustedError(absl::StrCat(
      "groups[0] ('", g.name(), "'): `tessera plan` puts ", rl ? "at least " : "", GiB(m.total()),
      " on each rank (parameters ", GiB(m.params), ", gradients ", GiB(m.grads), ", optimizer ", GiB(m.optimizer),
      ", activations ", GiB(m.activations), rl ? "; the reference and rollout come on top" : "",
      ") but its ", g.device_type() == v1::DEVICE_TYPE_GPU ? "GPUs have" : "CPU slots have", " ", GiB(device_memory_bytes),
      ": use more devices, a higher ZeRO stage, recomputation or smaller micro-batches (`tessera plan --devices N "
      "--memory SIZE` lists layouts that fit)"));
}

}  // namespace tessera::controller
