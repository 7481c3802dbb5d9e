// The `tessera` client: connection settings and the commands of the CLI, as a
// library so that tests and `tessera local` use the same code.
#pragma once

#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/v1/cluster_service.grpc.pb.h"
#include "tessera/v1/job_service.grpc.pb.h"

namespace tessera::client {

struct ClientConfig {
  std::string address;
  std::string token;
  std::string ca_pem;
  bool insecure = false;
};

// Precedence: explicit flags, then TESSERA_ADDRESS / TESSERA_TOKEN / TESSERA_CA_CERT,
// then the JSON config file (--config, TESSERA_CONFIG, or /var/lib/tessera/admin.conf)
// that the controller writes for its local admin.
absl::StatusOr<ClientConfig> ResolveConfig(std::string address, std::string token, std::string ca_path,
                                           std::string config_path, bool insecure);

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientConfig& cfg);
  absl::StatusOr<v1::SubmitJobResponse> Submit(const v1::JobSpec& spec, const std::string& submission_id);
  absl::StatusOr<v1::Job> Get(const std::string& id);
  // Newest first, up to `limit` jobs (<= 0: all), as summaries (ListJobsRequest); only
  // those in `states` where it is not empty.
  absl::StatusOr<std::vector<v1::Job>> List(int limit, const std::vector<v1::JobState>& states = {});
  // `reason`: the job's reason once STOPPED (empty: "stopped by user").
  absl::StatusOr<v1::Job> Stop(const std::string& id, const std::string& reason = "");
  absl::StatusOr<v1::GetClusterStatusResponse> Status();
  // DrainNode (admin): cordon the node, with move_jobs also move its jobs; undo: uncordon.
  absl::StatusOr<v1::NodeStatus> Drain(const std::string& node_id, bool move_jobs, bool undo);
  // Streams the job's events to `out` until it ends; returns the final job. A lost
  // controller (a restart) is waited for, reconnecting with backoff, up to reconnect_ms.
  absl::StatusOr<v1::Job> Watch(const std::string& id, std::ostream& out, int64_t reconnect_ms = 600000);
  absl::Status Logs(const std::string& id, int rank, int attempt, bool follow, std::ostream& out);
  // Polls the job until it reaches a terminal state and returns it; DEADLINE_EXCEEDED
  // (naming the job and its state) after timeout_ms (<= 0: no limit).
  absl::StatusOr<v1::Job> WaitDone(const std::string& id, int64_t timeout_ms);

 private:
  ClientConfig cfg_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::ClusterService::Stub> cluster_;
};

// Output helpers (-o table|json). The job table's AGE is since submission, DURATION the
// time it has run (start to end, or to now while it runs); `now_ms` the clock they read.
void PrintJobs(const std::vector<v1::Job>& jobs, bool json, std::ostream& out, int64_t now_ms);
// A span as kubectl prints one: 45s, 3m12s, 2h5m, 4d3h ("-" for a negative one).
std::string ShortDuration(int64_t ms);
// A job state by its name as JobStateName prints it (case-insensitive, with or without
// the JOB_STATE_ prefix).
absl::StatusOr<v1::JobState> ParseJobState(const std::string& name);
void PrintJob(const v1::Job& job, bool json, std::ostream& out);
void PrintCluster(const v1::GetClusterStatusResponse& s, bool json, std::ostream& out);
void PrintCommCheckTable(const std::string& result_json, std::ostream& out);

}  // namespace tessera::client
