// gRPC plumbing shared by every daemon and client: TLS or loopback-only plaintext
// channels and servers, bearer-token metadata, and explicit message-size limits
// (nothing relies on gRPC's 4 MiB default).
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/rpc/tls.h"

namespace tessera {

// absl::Status <-> grpc::Status, the code and the message kept.
inline grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

inline absl::Status FromGrpc(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// Every RPC's message limit, the driver <-> executor calls' too: their sample batches
// stream in chunks of a few MiB (common/rpc/tensor_stream.h).
inline constexpr int kControlMaxMessageBytes = 16 << 20;

struct ChannelOptions {
  std::string address;           // host:port
  std::string ca_pem;            // CA to verify the server with (TLS)
  bool insecure = false;         // plaintext; only allowed for loopback addresses
  std::string tls_name_override; // verify the server certificate against this name
  int max_message_bytes = kControlMaxMessageBytes;
};

// Refuses plaintext to a non-loopback address.
absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const ChannelOptions& o);

// Sets the bearer token and deadline on a client context.
void PrepareContext(grpc::ClientContext& ctx, const std::string& token, int64_t timeout_ms);

// An idempotent unary call between daemons of the cluster, tried until it succeeds, fails
// with a code other than UNAVAILABLE, or `timeout_ms` runs out. Each try waits for the
// connection to come up (wait_for_ready) instead of failing on the first refused or slow
// connection — a loaded host, a controller restarting — and the tries back off (100 ms
// doubling to 2 s). `call` gets a fresh context (token set, deadline the time left) and
// the milliseconds left, for calls that pass a wait of their own to the server.
grpc::Status CallWithRetry(const std::string& token, int64_t timeout_ms,
                           const std::function<grpc::Status(grpc::ClientContext*, int64_t left_ms)>& call);

struct ServerTls {
  bool insecure = false;  // plaintext; the listen address must be loopback
  KeyPair identity;       // certificate and key the server presents
};
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const ServerTls& t,
                                                                              const std::string& listen);

// "127.0.0.1:5", "[::1]:5", "localhost:5" -> true.
bool IsLoopbackAddress(const std::string& host_port);
std::string HostOf(const std::string& host_port);
// "host:port", an IPv6 host in brackets: ("::1", 9) -> "[::1]:9".
std::string JoinHostPort(const std::string& host, int port);
// The same listen address with `port` in place of its port: "[::1]:0", 9 -> "[::1]:9".
std::string WithPort(const std::string& host_port, int port);

// Reads "authorization: Bearer X" from server metadata ("" if absent).
std::string BearerToken(const grpc::ServerContext* ctx);

// Every server calls this before BuildAndStart: gRPC sets SO_REUSEPORT on Linux by
// default, so a second process of the same user could bind a port already served and
// the kernel would split connections between the two (two controllers on one port both
// "listening", or an RPC meant for one daemon answered by another). Without it, a port
// in use fails to bind.
void ExclusivePort(grpc::ServerBuilder& b);

// Registers health checking and reflection; call before building any server.
void EnableHealthAndReflection();

// A plaintext server with nothing but grpc.health.v1 (and reflection), for probes that
// cannot speak TLS, such as Kubernetes' gRPC probes: it carries no data and takes no
// token, so unlike every other server it may listen on any address. It answers
// NOT_SERVING until SetServingStatus(true). Port 0 asks the kernel for one; *port gets
// the port bound.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealthServer(const std::string& listen, int* port);

}  // namespace tessera
