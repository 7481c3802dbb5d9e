// tessera-controller: the control-plane daemon.
#include <csignal>
#include <cstdio>

#include <CLI/CLI.hpp>

#include "common/logging.h"
#include "controller/controller.h"

namespace {
std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessera-controller: schedules worker groups onto node agents and drives jobs"};
  tessera::controller::ControllerOptions o;
  std::string level = "info";
  double lease_s = 10;
  app.add_option("--state-dir", o.state_dir, "state directory (CA, tokens, SQLite, logs)")->capture_default_str();
  app.add_option("--listen", o.listen, "gRPC listen address")->capture_default_str();
  app.add_option("--advertise", o.advertise, "address agents and executors dial (default: hostname:port)");
  app.add_flag("--insecure-loopback", o.insecure_loopback, "serve plaintext; only allowed on a loopback address");
  app.add_option("--metrics-listen", o.metrics_listen, "serve Prometheus /metrics on host:port");
  app.add_option("--lease-ttl", lease_s, "seconds without a heartbeat before a node is lost")->capture_default_str();
  app.add_option("--tls-name", o.tls_names, "extra DNS name or IP for the server certificate (repeatable)");
  app.add_option("--path-root", o.path_roots,
                 "directory under which job specs may name paths, e.g. checkpoints (repeatable; none: no paths)");
  app.add_option("--secrets-dir", o.secrets_dir,
                 "read ca.crt, ca.key, join-token and tokens from here (e.g. a mounted Secret) instead of the state dir");
  app.add_option("--health-listen", o.health_listen,
                 "serve plaintext grpc.health.v1 (only; SERVING once the state is loaded) on host:port, for probes");
  app.add_option("--dashboard-listen", o.dashboard_listen,
                 "serve the web dashboard on this loopback host:port (reach it remotely through a tunnel)");
  app.add_option("--log-level", level, "trace|debug|info|warn|error")->capture_default_str();
  std::string secrets_out;
  auto* init = app.add_subcommand("init-secrets", "make a CA, a join token and an admin token in a new directory, then exit");
  init->add_option("--out", secrets_out, "directory to create")->required();
  CLI11_PARSE(app, argc, argv);
  if (*init) {
    tessera::InitLogging("controller", level);
    if (auto st = tessera::controller::InitSecrets(secrets_out); !st.ok()) {
      spdlog::error("{}", st.ToString());
      return 1;
    }
    std::printf("made ca.crt, ca.key, join-token and tokens in %s; for Kubernetes (deploy/k8s):\n"
                "  kubectl create namespace tessera\n"
                "  kubectl -n tessera create secret generic tessera-controller --from-file=%s\n"
                "  kubectl -n tessera create secret generic tessera-join --from-file=%s/ca.crt --from-file=%s/join-token\n",
                secrets_out.c_str(), secrets_out.c_str(), secrets_out.c_str(), secrets_out.c_str());
    return 0;
  }
  o.lease_ttl_ms = static_cast<int64_t>(lease_s * 1000);
  o.heartbeat_interval_ms = std::max<int64_t>(200, o.lease_ttl_ms / 5);
  tessera::InitLogging("controller", level);
  auto c = tessera::controller::Controller::Start(o);
  if (!c.ok()) {
    spdlog::error("{}", c.status().ToString());
    return 1;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  spdlog::info("shutting down");
  (*c)->Shutdown();
  return 0;
}
