// Collectives issued as one NCCL group.
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "worker/comm/communicator.h"

namespace tessera::engine {

// `issue` enqueues collectives on `c`, as one NCCL group when `group` (more than one
// collective: one launch for a block's collectives instead of one each, the small norm
// vectors' latency folded into the large ones): the group is ended whatever `issue`
// returned, and the first error is returned.
inline absl::Status Grouped(comm::Communicator& c, bool group, const std::function<absl::Status()>& issue) {
  if (group) c.GroupStart();
  absl::Status st = issue();
  if (group) {
    absl::Status end = c.GroupEnd();
    if (st.ok()) st = end;
  }
  return st;
}

}  // namespace tessera::engine
