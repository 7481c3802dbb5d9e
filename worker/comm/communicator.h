// Communicator: one per parallel group (docs/design.md §4). Public methods are the single
// choke point every collective goes through: they validate arguments, number
// the call (sequence number per communicator), time it and count its bytes,
// then call the backend (Gloo for CPU tensors, NCCL for GPU tensors).
//
// Buffers live where the backend expects them (host memory for Gloo, device
// memory for NCCL). Counts are in elements. For NCCL, calls are enqueued on the
// communicator's stream; Synchronize() waits for them (and is where a stuck
// collective is detected by the watchdog).
//
// Threading: a communicator is used by one thread at a time.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace tessera::comm {

enum class ReduceOp { kSum, kMax, kMin };

struct CommStats {
  uint64_t calls = 0;
  uint64_t bytes = 0;
  double seconds = 0;  // host-observed time of enqueue (+ completion for blocking backends)
  // Of `seconds`: the host collectives (AllReduceHost, AllGatherHost), which return with the
  // values and so wait for whatever the group's stream holds before them.
  double host_op_seconds = 0;
};

class Communicator {
 public:
  Communicator(std::string name, int rank, int size) : name_(std::move(name)), rank_(rank), size_(size) {}
  virtual ~Communicator() = default;

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  uint64_t seq() const { return seq_; }
  // The most recently issued operation (what a stuck stream is most likely waiting on).
  const char* last_op() const { return last_op_; }
  const CommStats& stats() const { return stats_; }
  virtual const char* backend() const = 0;

  absl::Status AllReduce(const void* in, void* out, size_t count, DType t, ReduceOp op);
  // `in` holds size()*recv_count elements; `out` receives this rank's reduced chunk. In
  // place when `out` is this rank's chunk of `in` (in + rank*recv_count); the other
  // chunks of `in` are then left as they were.
  absl::Status ReduceScatter(const void* in, void* out, size_t recv_count, DType t, ReduceOp op);
  // `out` receives size()*send_count elements, rank r's at offset r*send_count. In place
  // when `in` is this rank's part of `out` (out + rank*send_count).
  absl::Status AllGather(const void* in, void* out, size_t send_count, DType t);
  absl::Status Broadcast(void* buf, size_t count, DType t, int root);
  // Small values in host memory (a token count, a loss, token ids): `in` and `out` are
  // host buffers and the call returns with the result in `out`. Not ordered with the
  // compute stream (OrderWith): the values need none of the device's work, so the host
  // does not wait for the compute enqueued so far — the trainer's step start would
  // otherwise wait for the last step's optimizer with the device idle behind it. NCCL
  // moves them through its own device buffer on its own stream (under the watchdog;
  // nothing there synchronizes the device); host backends (Gloo, self) run the
  // collective in place.
  absl::Status AllReduceHost(const void* in, void* out, size_t count, DType t, ReduceOp op);
  absl::Status AllGatherHost(const void* in, void* out, size_t send_count, DType t);
  absl::Status Send(const void* buf, size_t count, DType t, int peer);
  absl::Status Recv(void* buf, size_t count, DType t, int peer);
  // A send that does not wait for the receiver (pipeline schedules: with every send
  // asynchronous and every receive blocking, any schedule that respects the data
  // dependencies runs without deadlock). The buffer must stay valid until WaitSends,
  // which waits for all of them. NCCL enqueues it like Send.
  // `tag` (0-3) keeps kinds of messages between the same two ranks apart (a pipeline's
  // activations and gradients): messages of one tag match in order; a tagged send needs
  // a receive of the same tag (RecvTagged).
  absl::Status Isend(const void* buf, size_t count, DType t, int peer, int tag = 0);
  absl::Status RecvTagged(void* buf, size_t count, DType t, int peer, int tag);
  absl::Status WaitSends();
  absl::Status Barrier();
  // Sends and receives between GroupStart and GroupEnd proceed concurrently.
  void GroupStart();
  absl::Status GroupEnd();
  // Waits until every enqueued operation has completed.
  virtual absl::Status Synchronize() = 0;
  // Fails pending and future operations; safe to call from another thread.
  virtual void Abort() = 0;
  // Orders this communicator's operations with a compute stream (a cudaStream_t; the
  // training engine passes its backend's): each operation waits for the work enqueued
  // on it so far, and work enqueued on it afterwards waits for the operation (CUDA
  // events both ways, no host synchronization). Null: no ordering (comm-check, whose
  // buffers are written and read around Synchronize). Gloo, blocking, ignores it.
  virtual absl::Status OrderWith(void* /*compute_stream*/) { return absl::OkStatus(); }
  // Overlap with compute (with OrderWith): while on, each operation still waits for the
  // compute enqueued before it, but the compute stream does not wait for it — until
  // Join(), after which compute waits for every operation issued so far. The caller
  // keeps the buffers alive and untouched by compute until then (the trainer's gradient
  // reduction during the backward). Blocking backends (Gloo) complete every call anyway.
  virtual void SetOverlap(bool /*on*/) {}
  virtual absl::Status Join() { return absl::OkStatus(); }

 protected:
  virtual absl::Status DoAllReduce(const void* in, void* out, size_t count, DType t, ReduceOp op) = 0;
  virtual absl::Status DoReduceScatter(const void* in, void* out, size_t recv_count, DType t, ReduceOp op) = 0;
  virtual absl::Status DoAllGather(const void* in, void* out, size_t send_count, DType t) = 0;
  virtual absl::Status DoBroadcast(void* buf, size_t count, DType t, int root) = 0;
  virtual absl::Status DoSend(const void* buf, size_t count, DType t, int peer) = 0;
  virtual absl::Status DoRecv(void* buf, size_t count, DType t, int peer) = 0;
  virtual absl::Status DoBarrier() = 0;
  // Host-memory backends: the collectives themselves.
  virtual absl::Status DoAllReduceHost(const void* in, void* out, size_t count, DType t, ReduceOp op) {
    return DoAllReduce(in, out, count, t, op);
  }
  virtual absl::Status DoAllGatherHost(const void* in, void* out, size_t send_count, DType t) {
    return DoAllGather(in, out, send_count, t);
  }
  virtual absl::Status DoIsend(const void* buf, size_t count, DType t, int peer, int /*tag*/) {
    return DoSend(buf, count, t, peer);
  }
  virtual absl::Status DoRecvTagged(void* buf, size_t count, DType t, int peer, int /*tag*/) {
    return DoRecv(buf, count, t, peer);
  }
  virtual absl::Status DoWaitSends() { return absl::OkStatus(); }
  virtual void DoGroupStart() {}
  virtual absl::Status DoGroupEnd() { return absl::OkStatus(); }
  // Prefixes errors with the group, collective and sequence number.
  absl::Status Describe(const absl::Status& s, const char* op) const;

 private:
  template <typename F>
  absl::Status Run(const char* op, size_t bytes, F&& f, bool host_op = false);  // host_op: CommStats::host_op_seconds
  std::string name_;
  int rank_, size_;
  uint64_t seq_ = 0;
  const char* last_op_ = "none";
  int group_depth_ = 0;
  CommStats stats_;
};

// A communicator of one rank: every collective is a local copy.
std::unique_ptr<Communicator> MakeSelfCommunicator(std::string name);

}  // namespace tessera::comm
