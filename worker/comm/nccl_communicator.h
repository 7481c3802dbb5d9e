// NCCL backend of Communicator for GPU tensors (DESIGN §4): the unique id goes
// through the rendezvous; the communicator is non-blocking
// (ncclCommInitRankConfig, blocking=0); every operation is enqueued on the
// communicator's stream, and Synchronize() waits for it under a watchdog that
// aborts the communicator (ncclCommAbort) when a collective is stuck past the
// timeout, failing with a message naming group, collective and sequence number.
// OrderWith(compute stream) orders every operation with the training engine's stream
// by events both ways (see Communicator::OrderWith).
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
};

absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(const std::string& name, const std::string& key,
                                                                   int rank, int size, KvStore* rdv,
                                                                   const NcclOptions& opts);

// Number of CUDA devices (0 without CUDA or without a driver).
int CudaDeviceCount();
struct CudaDeviceInfo {
  std::string name;
  int64_t memory_bytes = 0;
};
CudaDeviceInfo CudaDevice(int index);

}  // namespace tessera::comm
