// HostOffload: device memory parked in page-locked host memory while its owner is idle —
// an RL job's groups that share devices take turns (groups[].offload, docs/design.md §8):
// the idle ones' weights, gradients and optimizer states wait on the host while another
// group runs.
//
// Offload(tensors) copies each distinct storage of the tensors (views and aliases of one
// storage count once; tensors of another device are skipped) into one page-locked buffer
// of the backend (kept, grown when the states grow) and gives the device memory back to
// the allocator (Storage::Detach). Until Restore the tensors have no memory: nothing may
// read or write them. Restore allocates each storage again (at another address: a CUDA
// graph that captured the old one must be dropped before Offload), copies the bytes back
// and waits for the copies. Both are idempotent; a Restore that fails (the device full)
// keeps what it did not restore on the host, for a later Restore.
//
// Threading: one call at a time, on the backend's stream.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "worker/runtime/backend.h"

namespace tessera::runtime {

class HostOffload {
 public:
  explicit HostOffload(Backend* backend) : backend_(backend), host_(nullptr, [](char*) {}) {}
  absl::Status Offload(const std::vector<Tensor>& tensors);
  absl::Status Restore();
  bool offloaded() const { return !parked_.empty(); }
  int64_t bytes() const { return bytes_; }            // what the last Offload moved
  int64_t host_bytes() const { return host_size_; }   // the page-locked buffer kept

 private:
  struct Parked {
    std::shared_ptr<Storage> storage;
    int64_t at = 0;  // its bytes' offset in host_
  };
  Backend* backend_;
  Backend::HostBuffer host_;
  int64_t host_size_ = 0, bytes_ = 0;
  std::vector<Parked> parked_;  // detached, or waiting to be restored
};

}  // namespace tessera::runtime
