#include "common/rpc/grpc_util.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tessera {

std::string JoinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

std::string WithPort(const std::string& hp, int port) { return JoinHostPort(HostOf(hp), port); }

std::string HostOf(const std::string& hp) {
  if (!hp.empty() && hp[0] == '[') {
    auto e = hp.find(']');
    return e == std::string::npos ? hp : hp.substr(1, e - 1);
  }
  auto c = hp.rfind(':');
  return c == std::string::npos ? hp : hp.substr(0, c);
}

bool IsLoopbackAddress(const std::string& hp) {
  std::string h = HostOf(hp);
  return h == "localhost" || h == "::1" || absl::StartsWith(h, "127.");
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const ChannelOptions& o) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(o.max_message_bytes);
  args.SetMaxSendMessageSize(o.max_message_bytes);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Reconnect quickly (a restarted controller is found within ~2 s), but give each
  // connection attempt its time: gRPC's GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is also the
  // shortest connect timeout, and at 200 ms a TLS handshake with a loaded host failed
  // (executors that could not register: "exited with code 3" under ordinary load).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 10000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (o.insecure) {
    if (!IsLoopbackAddress(o.address))
      return absl::InvalidArgumentError(absl::StrCat(
          "plaintext connections are only allowed to loopback addresses; ", o.address,
          " is not loopback (give a CA certificate to use TLS)"));
    creds = grpc::InsecureChannelCredentials();
  } else {
    if (o.ca_pem.empty())
      return absl::InvalidArgumentError(absl::StrCat("no CA certificate to verify ", o.address,
                                                     " with (--ca-cert or TESSERA_CA_CERT)"));
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = o.ca_pem;
    creds = grpc::SslCredentials(ssl);
    if (!o.tls_name_override.empty()) args.SetSslTargetNameOverride(o.tls_name_override);
  }
  return grpc::CreateCustomChannel(o.address, creds, args);
}

void PrepareContext(grpc::ClientContext& ctx, const std::string& token, int64_t timeout_ms) {
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  if (timeout_ms > 0)
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(timeout_ms));
}

grpc::Status CallWithRetry(const std::string& token, int64_t timeout_ms,
                           const std::function<grpc::Status(grpc::ClientContext*, int64_t left_ms)>& call) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  int64_t backoff_ms = 100;
  while (true) {
    const int64_t left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    grpc::ClientContext ctx;
    PrepareContext(ctx, token, std::max<int64_t>(left, 1));
    ctx.set_wait_for_ready(true);
    grpc::Status st = call(&ctx, std::max<int64_t>(left, 0));
    if (st.ok() || st.error_code() != grpc::UNAVAILABLE) return st;
    const int64_t after =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (after <= backoff_ms) return st;
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms = std::min<int64_t>(backoff_ms * 2, 2000);
  }
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(const ServerTls& t,
                                                                              const std::string& listen) {
  if (t.insecure) {
    if (!IsLoopbackAddress(listen))
      return absl::InvalidArgumentError(absl::StrCat(
          "plaintext serving is only allowed on a loopback address; ", listen, " is not loopback"));
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({t.identity.key_pem, t.identity.cert_pem});
  return grpc::SslServerCredentials(ssl);
}

std::string BearerToken(const grpc::ServerContext* ctx) {
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return "";
  std::string v(it->second.data(), it->second.size());
  if (absl::StartsWithIgnoreCase(v, "bearer ")) return v.substr(7);
  return "";
}

void ExclusivePort(grpc::ServerBuilder& b) { b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0); }

void EnableHealthAndReflection() {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
}

absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealthServer(const std::string& listen, int* port) {
  EnableHealthAndReflection();
  grpc::ServerBuilder b;
  ExclusivePort(b);
  *port = 0;
  b.AddListeningPort(listen, grpc::InsecureServerCredentials(), port);
  b.SetMaxReceiveMessageSize(4096);
  std::unique_ptr<grpc::Server> s = b.BuildAndStart();
  if (!s || *port == 0)
    return absl::UnavailableError(absl::StrCat("cannot serve health on ", listen, " (is the port in use?)"));
  s->GetHealthCheckService()->SetServingStatus(false);
  return s;
}

}  // namespace tessera
