// The executor process: one per device per job attempt, spawned by the node
// agent. It serves ExecutorService for the job's driver, builds the
// communicators of every parallel group of each worker group it hosts, and runs
// the driver's calls (today: comm_check).
//
// Threading: gRPC handler threads call in; group state is guarded by mu_. The
// driver calls one method at a time per executor.
#pragma once

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "tessera/v1/executor_service.grpc.pb.h"
#include "tessera/v1/node_service.pb.h"
#include "worker/comm/communicator.h"
#include "worker/comm/rendezvous_client.h"
#include "common/parallel/layout.h"

namespace tessera::executor {

struct ExecutorOptions {
  std::string config_path;   // serialized v1::ExecutorConfig
  std::string ca_cert_path;  // controller CA
  std::string cert_path;     // node certificate the executor serves with
  std::string key_path;
  bool insecure = false;     // loopback plaintext (tests / local mode without TLS)
  std::string listen_host = "127.0.0.1";
};

// Runs the executor until Shutdown is called or the process is signalled.
// Returns the process exit code.
int RunExecutor(const ExecutorOptions& opts);

// Communicators of one worker group on this executor, by parallel-group kind.
struct GroupComms {
  parallel::Layout layout;
  int rank = 0;
  std::map<parallel::GroupKind, std::unique_ptr<comm::Communicator>> comms;
  std::map<parallel::GroupKind, int> group_index;
};

// The group's communicator of kind `k` (null if the layout has none).
comm::Communicator* CommOf(GroupComms& gc, parallel::GroupKind k);
// On GPUs, orders every communicator of the group after the backend's compute stream
// (OrderWith); nothing on CPU slots.
absl::Status OrderCommsWith(GroupComms& gc, v1::DeviceType device, void* stream);

// Builds every communicator kind of `layout` for `rank`, through the rendezvous.
// Backend: Gloo for CPU devices, NCCL for GPU devices.
absl::StatusOr<GroupComms> BuildGroupComms(const std::string& group, const parallel::Layout& layout, int rank,
                                           v1::DeviceType device, int device_index, comm::KvStore* rdv,
                                           const std::string& listen_host, int64_t timeout_ms);

}  // namespace tessera::executor
