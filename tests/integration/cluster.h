// Multi-process test harness: a real tessera-controller and real tessera-worker
// agents (which spawn real executors) on loopback, with TLS and tokens as in
// production. Processes are killed at teardown.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "client/cli.h"

namespace tessera::testing {

class Proc {
 public:
  Proc() = default;
  Proc(const Proc&) = delete;
  ~Proc() { Kill(SIGKILL); Wait(5000); }
  bool Start(const std::vector<std::string>& argv, const std::string& log_path);
  void Kill(int sig);
  // Returns the wait status, or -1 if still running after timeout.
  int Wait(int timeout_ms);
  bool alive() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

struct ClusterOptions {
  int agents = 2;
  int cpu_slots = 4;
  double lease_s = 10;
  // Non-empty: the controller reads its CA, join token and tokens from this directory
  // (--secrets-dir; the test makes it with `tessera-controller init-secrets`), and the
  // agents their CA certificate and join token.
  std::string secrets_dir = "";
};

class Cluster {
 public:
  explicit Cluster(ClusterOptions o);
  ~Cluster();
  // Starts (or restarts, on the same port and state dir) the controller.
  absl::Status StartController();
  // `controller`: the address the agent dials (default the controller's; a test's proxy).
  absl::Status StartAgent(int i, const std::string& controller = "", const std::vector<std::string>& extra = {});
  absl::Status WaitNodes(int ready, int timeout_ms);
  client::Client& client() { return *client_; }
  absl::StatusOr<std::unique_ptr<client::Client>> ClientWithToken(const std::string& token);
  std::vector<std::unique_ptr<Proc>>& agents() { return agents_; }
  Proc& controller() { return *controller_; }
  const std::string& dir() const { return dir_; }
  std::string address() const;
  const std::string& read_token() const { return read_token_; }
  const std::string& admin_token() const { return admin_token_; }
  std::string ca_pem() const;
  std::string secrets_dir() const;  // where the CA and the join token are
  std::string agent_work_dir(int i) const;
  // The daemons listen on port 0 and publish the ports they bound (admin.conf's
  // metrics_address; agent 0's endpoints.json); these read them (-1 if not published
  // within 10 s).
  int controller_metrics_port() const;
  int agent_metrics_port() const;
  int agent_health_port() const;
  int controller_health_port() const;
  int controller_dashboard_port() const;

  absl::StatusOr<v1::Job> WaitState(const std::string& job, v1::JobState s, int timeout_ms);
  // Pids of the executors of job `job`, attempt `attempt`, found in /proc.
  static std::vector<pid_t> ExecutorPids(const std::string& job, int attempt);

 private:
  ClusterOptions o_;
  std::string dir_;
  int port_ = 0;
  std::string admin_token_, read_token_;
  std::unique_ptr<Proc> controller_;
  std::vector<std::unique_ptr<Proc>> agents_;
  std::unique_ptr<client::Client> client_;
};

// The response (status line, headers, body) to GET http://127.0.0.1:port/path, with a
// bearer token when one is given ("" on failure).
std::string HttpGet(int port, const std::string& path, const std::string& token = "");

// A comm-check job spec on `devices` CPU executors.
v1::JobSpec CommCheckSpec(int devices, int tp, int pp, int max_restarts, int iters = 2);
// A cluster with its controller and o.agents agents started and registered.
std::unique_ptr<Cluster> Up(ClusterOptions o);
// Submits and returns the job id ("" and a test failure when refused).
std::string Submit(Cluster& c, const v1::JobSpec& spec);
// Waits until the job's attempt runs with n executors and returns their pids.
std::vector<pid_t> RunningExecutors(Cluster& c, const std::string& id, int attempt, size_t n);
// A pretrain job of a tiny Llama on the built-in arithmetic data (CPU slots).
v1::JobSpec PretrainSpec(int devices, int tp, int zero, int steps, bool sp = false, int cp = 1, int pp = 1);
// An RL job of that model: 3 steps of 4 one-digit problems on an actor of dp 2, with a
// KL term — grpo: group 4, k3 KL loss and an entropy bonus (an untrained model earns no
// reward, so zero advantages; the bonus still gives every step a gradient that depends
// on each sampled token, and the KL follows); ppo: 2 samples per prompt, the KL as a
// reward penalty (the critic's values make the advantages).
v1::JobSpec SmallRlSpec(const std::string& kind);
// A service of the test's own (a generated Service subclass, e.g. a RewardService) on a
// free loopback port, plaintext, serving until destroyed.
template <class S>
struct LoopbackService {
  S service;
  std::string address;
  std::unique_ptr<grpc::Server> server;
  LoopbackService() {
    grpc::ServerBuilder b;
    int port = 0;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(&service);
    server = b.BuildAndStart();
    address = "127.0.0.1:" + std::to_string(port);
  }
};
// The controller and one agent (the options' CPU slots), its node registered.
bool StartOneNode(Cluster& c);
// Submits the job, watches it to its end and returns it (the progress stream's text in
// *progress where given); a refused submission or a failed watch is a test failure.
v1::Job RunJob(Cluster& c, const v1::JobSpec& spec, std::string* progress = nullptr);
// The metrics of every progress line of a watched job that has `key` among them
// (" key=value" pairs), in order: one map per such line (e.g. per RL step).
std::vector<std::map<std::string, double>> LinesWith(const std::string& progress, const std::string& key);

}  // namespace tessera::testing
