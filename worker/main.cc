// tessera-worker: the node agent, and (as `tessera-worker executor`, spawned by
// the agent, never by hand) the per-device executor.
#include <csignal>
#include <cstdlib>
#include <thread>

#include <CLI/CLI.hpp>

#include "absl/strings/ascii.h"

#include "common/logging.h"
#include "common/util.h"
#include "worker/agent/agent.h"
#include "worker/executor/executor.h"

namespace {
std::atomic<int> g_signals{0};
void OnSignal(int) { g_signals.fetch_add(1); }
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessera-worker: node agent (and executor host) of a Tessera cluster"};
  tessera::agent::AgentOptions ao;
  std::string token_file, level = "info";
  app.add_option("--controller", ao.controller, "controller address host:port")->envname("TESSERA_ADDRESS");
  app.add_option("--ca-cert", ao.ca_cert_path, "controller CA certificate")->envname("TESSERA_CA_CERT");
  app.add_option("--join-token", ao.join_token, "join token (from the controller's state dir)")->envname("TESSERA_JOIN_TOKEN");
  app.add_option("--join-token-file", token_file, "file holding the join token");
  app.add_option("--node-id", ao.node_id, "node name (default: hostname)");
  app.add_option("--cpu-slots", ao.cpu_slots, "CPU devices to offer")->capture_default_str();
  app.add_flag("--no-gpus{false}", ao.use_gpus, "do not offer GPUs");
  app.add_option("--work-dir", ao.work_dir, "executor configs and certificates")->capture_default_str();
  app.add_option("--listen-host", ao.listen_host, "address executors listen on (reachable by peers)")->capture_default_str();
  app.add_flag("--insecure-loopback", ao.insecure, "plaintext to a loopback controller");
  app.add_option("--health-listen", ao.health_listen, "serve plaintext grpc.health.v1 (only; SERVING once registered) on host:port, for probes");
  app.add_option("--metrics-listen", ao.metrics_listen, "serve Prometheus /metrics on host:port");
  double leave_grace_s = 90;
  app.add_option("--leave-grace", leave_grace_s,
                 "on SIGTERM/SIGINT, seconds to wait for the controller to checkpoint and move this node's jobs "
                 "(a second signal stops at once)")->capture_default_str();
  app.add_option("--clock-skew-ms", ao.clock_skew_ms, "testing: add this to the wall clock the agent reads")->group("");
  app.add_option("--log-level", level)->capture_default_str();

  tessera::executor::ExecutorOptions eo;
  auto* ex = app.add_subcommand("executor", "run one executor (spawned by the agent)");
  ex->add_option("--config", eo.config_path)->required();
  ex->add_option("--ca-cert", eo.ca_cert_path);
  ex->add_option("--cert", eo.cert_path);
  ex->add_option("--key", eo.key_path);
  ex->add_option("--listen-host", eo.listen_host);
  ex->add_flag("--insecure", eo.insecure);
  CLI11_PARSE(app, argc, argv);

  if (*ex) {
    // Pipelines give every NCCL point-to-point link its own stream (worker/comm): with the
    // default 8 hardware queues those streams can alias and a waiting receive would hold
    // a send behind it. Set before CUDA starts; an operator's own value wins.
    setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", /*overwrite=*/0);
    // Every kernel loaded when CUDA starts, not at its first launch: a lazy load waits for
    // the device to drain, and a pipeline's NCCL receive spinning on the device may wait
    // for a peer that waits for this very launch — the pp 4 hang (docs/training.md).
    setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/0);
    tessera::InitLogging("executor", level);
    return tessera::executor::RunExecutor(eo);
  }
  tessera::InitLogging("agent", level);
  if (!token_file.empty()) {
    auto t = tessera::ReadFile(token_file);
    if (!t.ok()) {
      spdlog::error("{}", std::string(t.status().message()));
      return 2;
    }
    ao.join_token = std::string(absl::StripAsciiWhitespace(*t));
  }
  if (ao.controller.empty()) {
    spdlog::error("--controller is required");
    return 2;
  }
  auto agent = tessera::agent::Agent::Create(ao);
  if (!agent.ok()) {
    spdlog::error("{}", agent.status().ToString());
    return 2;
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  if (auto st = (*agent)->Start(); !st.ok()) {
    spdlog::error("{}", st.ToString());
    return 2;
  }
  while (g_signals == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  // First signal: leave gracefully (the controller checkpoints and moves this node's
  // jobs); a second one: stop now.
  std::atomic<bool> left{false};
  std::thread leaver([&] {
    (*agent)->Leave(static_cast<int64_t>(leave_grace_s * 1000));
    left = true;
  });
  while (!left && g_signals < 2) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (!left) (*agent)->Shutdown();
  leaver.join();
  return 0;
}
