// Pipeline schedules (docs/design.md §6): which micro-batch each rank runs through which of its
// model chunks, forward or backward, in what order — GPipe (every forward, then every
// backward), 1F1B (a warm-up of pp - rank - 1 forwards, then one forward and one
// backward alternately, then the remaining backwards) and, with vpp > 1 chunks per rank,
// Megatron's interleaved 1F1B (virtual micro-batch k runs chunk (k / pp) % vpp of
// micro-batch (k / (pp·vpp))·pp + k % pp; warm-up (pp - rank - 1)·2 + (vpp - 1)·pp).
// The trainer runs the list with asynchronous sends and blocking receives, so any list
// that respects the data dependencies runs without deadlock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::parallel {

enum class Schedule { kOneFOneB, kGPipe };

struct PipeOp {
  bool forward;
  int chunk;
  int64_t micro_batch;
  bool operator==(const PipeOp& o) const {
    return forward == o.forward && chunk == o.chunk && micro_batch == o.micro_batch;
  }
};

// INVALID_ARGUMENT when the numbers do not fit (interleaving needs micro_batches % pp == 0).
absl::StatusOr<std::vector<PipeOp>> PipelineSchedule(Schedule s, int pp, int vpp, int rank, int64_t micro_batches);

// "1f1b" / "gpipe".
absl::StatusOr<Schedule> ParseSchedule(const std::string& name);

}  // namespace tessera::parallel
