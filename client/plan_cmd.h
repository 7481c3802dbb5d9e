// `tessera plan JOB.yaml`: the per-rank memory and communication of a training job's
// layout (common/plan/plan.h), and with --devices / --memory the layouts that fit; for
// grpo and ppo, each device set's models, what they need and the KV cache the generating
// group wants (common/plan/rl_plan.h), against --memory.
#pragma once

#include <cstdint>
#include <ostream>

#include "tessera/v1/common.pb.h"

namespace tessera::client {

// Returns the process exit code (0: planned; 1: the spec cannot be planned, message on
// stderr; 2: the job's own layout does not fit --memory).
int RunPlan(const v1::JobSpec& spec, int devices, int64_t memory_bytes, bool json, std::ostream& out);

}  // namespace tessera::client
