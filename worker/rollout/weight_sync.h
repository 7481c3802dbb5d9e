// Weight sync, actor -> rollout, after every update (docs/design.md §7):
//  - colocated with the same TP: nothing to copy — the rollout engine drives the actor's
//    own model object (worker/rollout/rollout.h), so there is no call to make;
//  - colocated with another TP (e.g. actor TP 2 -> rollout TP 1, or 4 -> 2; verl's
//    3D-HybridEngine): SyncColocated — every tensor gathered over the actor's TP group and
//    re-sliced by the rollout model (each rank keeps its rollout shard), one tensor at a
//    time, so no full-model copy ever exists;
//  - split pools (rollout on its own devices): SyncSplit — over a `bridge` communicator
//    that spans both groups (built at job start), the actor's source rank broadcasts the
//    gathered tensors in buckets of about bucket_bytes; rollout ranks re-slice them.
// Everything stays on the backend (Llama::GatherGlobalInto / SetGlobalFrom, Backend::Copy
// for column blocks): no host round trip, so on GPUs the sync runs at NCCL and HBM speed.
// The two models must have the same architecture (parameter names and global shapes).
// SyncColocated's two models may live on two backends (two streams) of one device: it
// orders the streams itself (each tensor's gather completes before the rollout reads it).
// Every rank of the groups involved must call, in the same order.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "worker/comm/communicator.h"
#include "worker/model/llama.h"
#include "worker/runtime/backend.h"

namespace tessera::engine {

absl::Status SyncColocated(model::Llama& actor, model::Llama& rollout);

// On actor ranks `actor` is set and `rollout` null, on rollout ranks the other way round;
// `source` is the bridge rank whose gathered tensors are sent (an actor rank); `b` is this
// rank's backend (the bucket lives there: host memory for Gloo, device memory for NCCL).
// Returns the bytes broadcast (the model in f32).
absl::StatusOr<int64_t> SyncSplit(model::Llama* actor, model::Llama* rollout, comm::Communicator& bridge, int source,
                                  runtime::Backend& b, int64_t bucket_bytes = 64 << 20);

}  // namespace tessera::engine
