// The plan input of a job spec's first worker group (`tessera plan`, and the controller's
// check at submit that a training job's plan fits its devices): the model's shape from
// the spec (or from model.hf_dir's config.json, given as `hf_config`), the group's
// layout, the batch, recomputation, the schedule, and the precision the executors will
// use (auto: bf16 on GPUs, f32 on CPU slots).
#pragma once

#include "common/plan/plan.h"
#include "tessera/v1/common.pb.h"

namespace tessera::plan {

PlanInput PlanInputOf(const v1::JobSpec& spec, const model::LlamaConfig* hf_config = nullptr);
// The same for another of its groups (its layout, and its device type's precision).
PlanInput PlanInputOf(const v1::JobSpec& spec, const v1::GroupSpec& group, const model::LlamaConfig* hf_config = nullptr);

}  // namespace tessera::plan
