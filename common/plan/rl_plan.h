// The memory plan of a grpo / ppo job (`tessera plan`, and the controller's check at
// submit): what each of its groups keeps on each of its devices and what its passes need
// on top, device set by device set (the groups sharing devices: common/spec/job_spec.h's
// DevicesOf), as the executors allocate it (docs/design.md §6–8):
//  - the actor: its training plan (plan.h) for micro-batches of
//    rl.max_tokens_per_micro_batch tokens; without a reference group, the frozen
//    reference beside it (its compute copy) where a KL term needs it; ppo without a
//    critic group, the critic's training plan beside it;
//  - a rollout group: its model (values and compute copy) of its own TP layout;
//  - a reference or reward group: a frozen model (compute copy only) and one layer's
//    forward at a time; the reward model's shape is rl.reward_model's config.json;
//  - a critic group: a value model's training plan of its layout and ZeRO stage;
//  - the KV cache of the group that generates (the rollout group, else the actor): every
//    sample of its DP rank that runs at once (at most 1024) at the longest prompt +
//    rl.max_new_tokens — the engine then takes what fits in rl.gpu_memory_utilization of
//    the device beside the kept states, never more.
// A step's phases run one at a time and the KV cache is released before the updates.
// Groups sharing devices keep their states there at once, except those that offload
// (groups[].offload): theirs wait in page-locked host memory while another offloading
// group runs and come back for their own calls (the actor's and a colocated rollout
// group's both for the weight sync); a group that stays runs beside whichever of them had
// the last turn (counted as the largest). So a device needs what stays, plus for the
// largest phase the offloading states present and the running group's pass; the cache
// takes what is left while its group generates.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model/config.h"
#include "tessera/v1/common.pb.h"

namespace tessera::plan {

struct RlGroupMemory {
  std::string group;   // the job's group that holds it
  bool offload = false;  // its group's groups[].offload
  std::string model;   // "actor", "reference", "critic", "rollout", "reward"
  std::string device_set;  // DevicesOf(group)
  int64_t states = 0;      // kept between phases (weights, gradients, optimizer state)
  int64_t pass = 0;        // the peak of one of its passes on top (activations, logits)
};

struct RlDeviceSet {
  std::string name;       // the group whose devices these are
  int64_t states = 0;     // kept on each device throughout: the models of the groups that do not offload
  int64_t offloaded = 0;  // each device's share parked in host memory between its groups' turns
  int64_t pass = 0;       // the largest pass
  int64_t peak = 0;       // the most on a device at once, over the phases (without the cache)
  int64_t kv_cache = 0;   // the KV cache that every running sample at its longest wants (0: no generation here)
  int64_t kv_sequence = 0;  // one sample's KV at its longest: the least the cache must hold
  int64_t kv_beside = 0;    // on the device beside the cache while its group generates
  int64_t need() const { return peak; }  // without the cache, which fits itself to what is left
};

struct RlPlan {
  std::vector<RlGroupMemory> models;
  std::vector<RlDeviceSet> devices;
};

// `actor_hf`: model.hf_dir's config.json where the spec gives one (else the spec's dims);
// `reward_hf`: rl.reward_model's (null: the reward model is not counted). INVALID_ARGUMENT
// naming the group when a layout cannot run its model.
absl::StatusOr<RlPlan> PlanRl(const v1::JobSpec& spec, const model::LlamaConfig* actor_hf = nullptr,
                              const model::LlamaConfig* reward_hf = nullptr);

// One line of a device set's models: "actor 3.20 GiB (+1.10 GiB in its passes), ...".
std::string DeviceSetModels(const RlPlan& plan, const RlDeviceSet& d);

}  // namespace tessera::plan
