// Gloo backend of Communicator: CPU tensors over TCP, bootstrapped through the
// controller's rendezvous (docs/design.md §4). Every operation has a timeout; a peer that
// hangs makes the call fail with DEADLINE_EXCEEDED naming the group, collective
// and sequence number, never a hang.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/comm/rendezvous_client.h"

namespace tessera::comm {

struct GlooOptions {
  std::string listen_host = "127.0.0.1";  // interface address peers connect to
  int64_t timeout_ms = 120000;             // per collective and for bootstrap
};

// Builds a full-mesh Gloo context among `size` ranks under rendezvous prefix `key`.
absl::StatusOr<std::unique_ptr<Communicator>> MakeGlooCommunicator(const std::string& name, const std::string& key,
                                                                   int rank, int size, KvStore* rdv,
                                                                   const GlooOptions& opts);

}  // namespace tessera::comm
