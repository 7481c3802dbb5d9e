// The node agent (`tessera-worker`): registers this machine's devices with the
// controller (incarnation-fenced), keeps the Connect stream (heartbeats and
// executor events up, start/stop commands down), spawns one executor process per
// assigned device, supervises it (exit code, signal), forwards its output as log
// lines, and kills it on stop. When the controller is lost it retries with
// backoff and re-registers, reporting the executors it still runs.
//
// Threading: Run() owns the connection loop; one reader thread per executor;
// one heartbeat thread. mu_ guards the executor table, stream_mu_ the stream.
#pragma once

#include <grpcpp/grpcpp.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "tessera/v1/node_service.grpc.pb.h"

namespace tessera::agent {

// The agent's liveness on its health server (AgentOptions::health_listen; Kubernetes'
// livenessProbe asks for it by name).
inline constexpr char kAgentLivenessService[] = "liveness";

struct AgentOptions {
  std::string controller;       // host:port
  std::string ca_cert_path;     // controller CA (TLS)
  std::string join_token;
  std::string node_id;          // default: hostname
  int cpu_slots = 0;
  bool use_gpus = true;
  std::string work_dir = "/var/lib/tessera-worker";
  std::string executor_binary;  // default: tessera-worker next to this binary
  std::string listen_host = "127.0.0.1";  // address executors listen on and peers dial
  bool insecure = false;        // loopback plaintext
  // grpc.health.v1 only, plaintext (StartHealthServer): the server ("", readiness) SERVING
  // while registered with the controller; the service kAgentLivenessService SERVING while the
  // agent runs, whether or not the controller is up (liveness: a controller outage must
  // not get every agent, and its executors, restarted).
  std::string health_listen;
  std::string metrics_listen;   // Prometheus /metrics (host:port)
  // Added to this machine's wall clock wherever the agent reads it (incarnations,
  // heartbeat times): for tests of clock skew; 0 in production.
  int64_t clock_skew_ms = 0;
};

class Agent {
 public:
  static absl::StatusOr<std::unique_ptr<Agent>> Create(AgentOptions opts);
  ~Agent();
  absl::Status Start();
  // Stops the connection loop and kills every executor.
  void Shutdown();
  // A graceful exit (the daemon's first SIGTERM): tells the controller the node is leaving
  // (every heartbeat from now on says so, the first one at once), refuses new executors,
  // and waits up to `grace_ms` for the controller to move its jobs (they save a checkpoint
  // and their executors here are stopped); then Shutdown() kills what is left. Returns
  // the number of executors it had to kill.
  int Leave(int64_t grace_ms);
  const std::string& node_id() const { return opts_.node_id; }
  bool registered() const { return registered_; }

 private:
  explicit Agent(AgentOptions o) : opts_(std::move(o)) {}
  using Key = std::tuple<std::string, int, int>;  // job, attempt, executor
  struct Exec {
    pid_t pid = 0;
    bool requested_stop = false;  // asked to stop while it still ran
    bool sent_kill = false;       // we sent it SIGKILL (a stop's grace ran out, or shutdown)
    v1::DeviceType device_type = v1::DEVICE_TYPE_CPU;
    int device_index = 0;
    std::thread reader;
  };

  void Run();
  absl::Status RegisterOnce(v1::NodeService::Stub* stub, v1::RegisterNodeResponse* resp);
  void Serve(v1::NodeService::Stub* stub);
  void Handle(const v1::ControllerMessage& m);
  void StartExecutor(const v1::ExecutorConfig& cfg);
  void StopExecutors(const std::string& job, int attempt, int64_t grace_ms);
  void ReadAndReap(Key key, int fd, pid_t pid);
  void SendUp(const v1::AgentMessage& m, bool droppable);
  void HeartbeatLoop();
  std::atomic<bool> leaving_{false};
  std::atomic<bool> beat_now_{false};
  std::vector<v1::RunningExecutor> Running();
  void SetRegistered(bool r);

  // Metrics (prometheus-cpp objects are thread-safe).
  std::shared_ptr<prometheus::Registry> registry_ = std::make_shared<prometheus::Registry>();
  prometheus::Family<prometheus::Counter>* exits_ = nullptr;
  prometheus::Gauge* running_ = nullptr;
  prometheus::Gauge* registered_gauge_ = nullptr;
  prometheus::Counter* registrations_ = nullptr;
  prometheus::Histogram* heartbeat_rtt_ = nullptr;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<grpc::Server> health_;

  AgentOptions opts_;
  std::string ca_pem_;
  int64_t incarnation_ = 0;
  std::vector<v1::Device> devices_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> registered_{false};
  std::atomic<int64_t> heartbeat_ms_{2000};
  std::thread runner_, heartbeat_;

  std::mutex mu_;
  std::map<Key, Exec> execs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> done_readers_ ABSL_GUARDED_BY(mu_);

  std::mutex stream_mu_;
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(stream_mu_) = nullptr;
  grpc::ClientReaderWriter<v1::AgentMessage, v1::ControllerMessage>* stream_ ABSL_GUARDED_BY(stream_mu_) = nullptr;
  std::deque<v1::AgentMessage> pending_ ABSL_GUARDED_BY(stream_mu_);
  std::condition_variable stop_cv_;
};

}  // namespace tessera::agent
