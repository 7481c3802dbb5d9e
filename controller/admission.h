// What the controller checks of a job at submit beyond its spec (common/spec/job_spec.h):
// that its training plan fits the memory of the devices it would run on.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "tessera/v1/common.pb.h"

namespace tessera::controller {

// RESOURCE_EXHAUSTED with `tessera plan`'s numbers (parameters, gradients, optimizer
// state, activations per rank) when a training job's first group needs more memory per
// rank than `device_memory_bytes`, the smallest memory of the registered devices of its
// type. pretrain and sft: the plan itself; grpo and ppo: every device set's groups
// (common/plan/rl_plan.h: each model's states and its largest pass; on GPUs, room within
// rl.gpu_memory_utilization for one sample's KV cache beside the states; a reward group's
// model, whose shape is in rl.reward_model's config.json, is not counted). Jobs whose
// model shape comes from model.hf_dir (read by the executors), other kinds, and
// device_memory_bytes <= 0 pass.
absl::Status CheckPlanFits(const v1::JobSpec& spec, int64_t device_memory_bytes);

}  // namespace tessera::controller
