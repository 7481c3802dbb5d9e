// Controller: owns the state dir (CA, certificates, tokens, SQLite store, logs),
// the JobManager and the gRPC server. Used by `tessera-controller` and by
// `tessera local`.
//
// State dir layout:
//   ca.crt ca.key                          the cluster CA (made on first start)
//   join-token                             agents present it to register
//   tokens                                 "ROLE NAME TOKEN" lines; an admin token is made on first start
//   admin.conf                             JSON {address, token, ca_cert} for the local admin's CLI
//   state.db                               SQLite (WAL): jobs, node incarnations
//   logs/<job>/attempt-N/executor-R.log    executor logs
// With --secrets-dir D (Kubernetes: a mounted Secret), ca.crt, ca.key, join-token and
// tokens are read from D instead, never generated or written; `tessera-controller
// init-secrets --out D` makes them once (InitSecrets). The server certificate is issued
// from the CA at every start, for the names the controller answers to.
#pragma once

#include <grpcpp/grpcpp.h>
#include <prometheus/exposer.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rpc/auth.h"
#include "common/rpc/tls.h"
#include "controller/dashboard.h"
#include "controller/job_manager.h"

namespace tessera::controller {

struct ControllerOptions {
  std::string state_dir = "/var/lib/tessera";
  std::string listen = "0.0.0.0:7070";
  std::string advertise;           // address agents/executors dial; default: listen (0.0.0.0 -> hostname)
  bool insecure_loopback = false;  // plaintext; only with a loopback listen address
  std::string metrics_listen;      // host:port for /metrics; empty = off
  int64_t lease_ttl_ms = 10000;
  int64_t heartbeat_interval_ms = 2000;
  int64_t stop_grace_ms = 5000;
  std::vector<std::string> tls_names;  // extra DNS names / IPs for the server certificate
  std::vector<std::string> path_roots;  // directories job specs may name (checkpoints); none: no paths
  std::string secrets_dir;     // CA, join token and tokens from here (read-only); empty: the state dir
  std::string health_listen;   // plaintext grpc.health.v1 only (StartHealthServer), SERVING once the
                               // state is loaded and the server listens; empty = off
  std::string dashboard_listen;  // the web dashboard (controller/dashboard.h), loopback only; empty = off
  bool stop_unfinished_jobs = false;  // JobManagerConfig::stop_unfinished_on_recover (`tessera local`)
};

// Makes a CA, a join token and a tokens file with an admin token in `dir` (created 0700);
// ALREADY_EXISTS, touching nothing, when any of them is there.
absl::Status InitSecrets(const std::string& dir);

class Controller {
 public:
  static absl::StatusOr<std::unique_ptr<Controller>> Start(const ControllerOptions& opts);
  ~Controller();
  void Shutdown();
  void Wait();
  int port() const { return port_; }
  std::string address() const;  // what clients dial
  const std::string& admin_token() const { return admin_token_; }
  const std::string& join_token() const { return join_token_; }
  const std::string& ca_pem() const { return ca_.cert_pem; }
  JobManager* jobs() { return jobs_.get(); }

 private:
  Controller() = default;
  // gRPC health of `server`: overall ("") and per service (tessera.v1.JobService, ...).
  static void SetServing(grpc::Server* server, bool serving);
  ControllerOptions opts_;
  KeyPair ca_, server_;
  std::string admin_token_, join_token_;
  TokenAuthority tokens_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<Rendezvous> rdv_;
  std::unique_ptr<LogStore> logs_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<JobManager> jobs_;
  std::vector<std::unique_ptr<grpc::Service>> services_;
  std::unique_ptr<grpc::Server> server_impl_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<grpc::Server> health_;
  std::unique_ptr<Dashboard> dashboard_;
  int port_ = 0;
  bool shut_ = false;
};

// ExecutorConnector over gRPC with TLS (verified against the controller CA and the
// executor certificate name) or loopback plaintext.
// The first connection to an executor must come up within connect_timeout_ms (an error
// naming the executor, node and address otherwise); later calls wait for reconnections.
ExecutorConnector GrpcExecutorConnector(std::string ca_pem, bool insecure, int64_t connect_timeout_ms = 30000);

}  // namespace tessera::controller
