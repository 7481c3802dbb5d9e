// TLS material: a self-made CA in the controller's state dir (as k3s does), and
// certificates it signs for the controller and for each node's executors.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera {

struct KeyPair {
  std::string cert_pem;
  std::string key_pem;
};

// Creates a CA (EC P-256, 10 years).
absl::StatusOr<KeyPair> MakeCa(const std::string& common_name);

// Issues a leaf certificate signed by `ca`, valid for both server and client auth,
// with the given DNS names and IP addresses as subject alternative names.
absl::StatusOr<KeyPair> IssueCert(const KeyPair& ca, const std::string& common_name,
                                  const std::vector<std::string>& dns_names,
                                  const std::vector<std::string>& ip_addresses, int days);

// The name every executor certificate carries; the driver verifies executors
// against it (executors listen on whatever address their node has).
inline constexpr char kExecutorTlsName[] = "tessera-executor";
// Metadata key on the driver's calls to an executor: the executor index it is meant for.
inline constexpr char kExecutorMetadata[] = "x-tessera-executor";

}  // namespace tessera
