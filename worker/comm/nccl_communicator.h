// NCCL backend of Communicator for GPU tensors (docs/design.md §4): the unique id goes
// through the rendezvous; the communicator is non-blocking
// (ncclCommInitRankConfig, blocking=0); every operation is enqueued on the
// communicator's stream, and Synchronize() waits for it under a watchdog that
// aborts the communicator (ncclCommAbort) when a collective is stuck past the
// timeout, failing with a message naming group, collective and sequence number.
// OrderWith(compute stream) orders every operation with the training engine's stream
// by events both ways (see Communicator::OrderWith).
//
// Tagged point-to-point (Isend / RecvTagged: pipelines) goes over "links": one two-rank
// communicator and stream per (source, destination, tag) between ring neighbours, split
// from this one by every rank at the first tagged call and connected then in one order
// that all ranks share. NCCL matches a communicator's messages in issue order and runs
// its operations one after another, so on a shared communicator a pipeline's receive
// could wait behind a send that waits for the peer's receive — a deadlock. A link only
// sends or only receives; a send waits for the compute before it (nothing waits for the
// send until WaitSends), a receive waits for the compute before it (its buffer) and the
// compute after it waits for the receive. The process needs CUDA_DEVICE_MAX_CONNECTIONS
// of at least its streams (the executor sets 32), or streams share hardware queues.
// A watchdog timeout names the streams still busy (the group's, links) and their last
// operations.
//
// In a build without CUDA, MakeNcclCommunicator returns UNIMPLEMENTED.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/comm/rendezvous_client.h"

namespace tessera::comm {

struct NcclOptions {
  int device = 0;
  int64_t timeout_ms = 120000;
  bool trace = false;  // print every operation as it is enqueued (group, rank, op, seq, peer) to stderr
};

absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(const std::string& name, const std::string& key,
                                                                   int rank, int size, KvStore* rdv,
                                                                   const NcclOptions& opts);

}  // namespace tessera::comm
