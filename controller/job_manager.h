// JobManager: the controller's state — nodes, jobs, their attempts and executors —
// and the state machine that moves jobs through
//   PENDING -> PLACING -> STARTING -> RUNNING -> (RESTARTING -> PLACING ...)* ->
//   SUCCEEDED | FAILED | STOPPED.
// Every transition is persisted (Store) before it is acted on. Any executor
// failure tears the whole attempt down (all its executors are stopped and their
// exits awaited), then the job restarts with attempt+1 (after backoff) or fails.
//
// gRPC handlers call it; it calls agents through AgentLink and executors through
// the driver. It is unit-testable without gRPC (fake links, fake drivers).
//
// Threading: one mutex (mu_) guards all state. A reconciler thread schedules,
// checks leases and deadlines. Each running job has one driver thread. Messages to
// agents are sent outside the lock.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/base/thread_annotations.h"
#include "controller/driver/driver.h"
#include "controller/log_store.h"
#include "controller/metrics.h"
#include "controller/rendezvous.h"
#include "controller/scheduler.h"
#include "controller/store.h"
#include "tessera/v1/cluster_service.pb.h"
#include "tessera/v1/job_service.pb.h"
#include "tessera/v1/node_service.pb.h"

namespace tessera::controller {

struct JobManagerConfig {
  int64_t lease_ttl_ms = 10000;
  int64_t heartbeat_interval_ms = 2000;
  int64_t stop_grace_ms = 5000;
  std::string controller_address;  // what executors dial
  std::string version;
  int64_t max_backoff_ms = 60000;
  // Recover() marks every unfinished job STOPPED instead of resuming it (`tessera local`,
  // whose state directory outlives a run that was killed).
  bool stop_unfinished_on_recover = false;
  std::vector<std::string> path_roots;  // --path-root: passed to executors (ExecutorConfig.path_roots)
};

// The controller's side of one agent's Connect stream.
class AgentLink {
 public:
  virtual ~AgentLink() = default;
  virtual bool Send(const v1::ControllerMessage& msg) = 0;
};

// A job as lists show it: the spec's name, kind, groups and max_restarts; no result or
// assignments (GetJob has those).
v1::Job JobSummary(const v1::Job& j);

class JobManager {
 public:
  JobManager(JobManagerConfig cfg, Store* store, Rendezvous* rdv, LogStore* logs, Metrics* metrics,
             DriverFactory drivers, ExecutorConnector connect);
  ~JobManager();

  // Loads jobs from the store. Jobs that were active are recovered: their old
  // attempt's executors are stopped when their agents re-register (or their
  // nodes are declared lost), then the job restarts with a new attempt.
  absl::Status Recover();
  void Start();
  void Shutdown();

  // --- JobService ---
  // `spec` must be normalized and validated. Returns the job and whether it was created.
  absl::StatusOr<std::pair<v1::Job, bool>> Submit(const v1::JobSpec& spec, const std::string& submission_id);
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id);
  // Newest first, summaries (JobSummary), `limit` a page (0: 100, at most 1000) from
  // after the job `page_token` names; next_page_token is empty on the last page.
  struct JobPage {
    std::vector<v1::Job> jobs;
    std::string next_page_token;
  };
  absl::StatusOr<JobPage> ListJobs(const std::set<v1::JobState>& states, int limit, const std::string& page_token = "");
  absl::StatusOr<v1::Job> Stop(const std::string& job_id, const std::string& reason);
  // Events with seq > from_seq, in order, at most kEventsPerPage of them (the caller asks
  // again from the last one for more); waits up to timeout_ms for one. `done` is set when
  // the job is terminal and its last event was returned. Every event of a job is kept (in
  // the store; the newest kEventsInMemory also in memory), across controller restarts.
  static constexpr int64_t kEventsPerPage = 5000, kEventsInMemory = 10000;
  absl::StatusOr<std::vector<v1::JobEvent>> WaitEvents(const std::string& job_id, int64_t from_seq,
                                                       int64_t timeout_ms, bool* done);
  bool IsTerminal(const std::string& job_id);
  // The id of the numbering of events (WatchJob): the state database's, so a job's seqs
  // go on across controller restarts; another state directory numbers anew.
  const std::string& epoch() const { return epoch_; }

  // --- ClusterService ---
  v1::GetClusterStatusResponse ClusterStatus();
  // DrainNodeRequest: cordon (and with move_jobs evacuate) a node, or undo it.
  absl::StatusOr<v1::NodeStatus> Drain(const std::string& node_id, bool move_jobs = false, bool undo = false);

  // --- NodeService ---
  absl::Status RegisterNode(const v1::RegisterNodeRequest& req);
  absl::Status AttachAgent(const std::string& node_id, int64_t incarnation, std::shared_ptr<AgentLink> link);
  void DetachAgent(const std::string& node_id, const AgentLink* link);
  // FAILED_PRECONDITION when `incarnation` is no longer the node's (a newer agent
  // registered the same node id): the caller ends that agent's stream with it.
  absl::Status OnHeartbeat(const std::string& node_id, int64_t incarnation, const v1::Heartbeat& hb);
  void OnExecutorEvent(const std::string& node_id, const v1::ExecutorEvent& ev);
  void OnLogs(const std::string& node_id, const v1::LogBatch& logs);

  // --- RendezvousService ---
  // OK only for the current, live attempt with the right secret.
  absl::Status CheckScope(const std::string& job_id, int attempt, const std::string& secret);
  absl::Status RegisterExecutor(const std::string& job_id, int attempt, int executor, const std::string& address);

  // The address executors dial (known once the server listens).
  void SetControllerAddress(const std::string& a) {
    std::lock_guard<std::mutex> l(mu_);
    cfg_.controller_address = a;
  }

  // Wakes the reconciler (tests).
  void Poke();

 private:
  enum class ExecState { kLaunching, kReady, kExited };
  struct ExecRt {
    std::string node_id;
    ExecState state = ExecState::kLaunching;
    std::string address;
  };
  struct JobRt {
    v1::Job job;
    std::string secret;
    std::map<int, ExecRt> execs;
    bool tearing_down = false;
    bool teardown_root_cause_known = false;  // reason came from an executor exit
    v1::JobState after_teardown = v1::JOB_STATE_UNSPECIFIED;
    std::string after_reason;
    int64_t restart_at_ms = 0;   // monotonic
    int64_t start_deadline_ms = 0;
    bool count_restart = true;
    std::shared_ptr<DriverRun> driver;
    std::vector<v1::JobEvent> events;
    int64_t next_seq = 1;
  };
  struct NodeRt {
    v1::NodeStatus status;
    std::shared_ptr<AgentLink> link;
    int64_t last_seen_mono = 0;
    std::vector<v1::ControllerMessage> pending;  // waiting for the agent's stream
    std::set<std::pair<int, int>> stale_devices; // (type, index) held by executors of no live attempt
    bool leaving = false;     // its agent said it is shutting down (Heartbeat.leaving)
    bool cordoned = false;    // drained by an admin (DrainNode): DRAINING until undone
    bool evacuating = false;  // its jobs are being moved (leaving, or DrainNode move_jobs)
  };
  using Outbox = std::vector<std::pair<std::string, v1::ControllerMessage>>;  // node id, command

  absl::Status ApplyHeartbeat(const std::string& node_id, int64_t incarnation, const v1::Heartbeat& hb, Outbox& out);
  void ReconcileLoop();
  void ReconcileOnce();
  void CheckLeases(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleJobs(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CheckStarting(Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishTeardowns() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartDriver(JobRt& rt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnDriverDone(const std::string& job_id, int attempt, absl::StatusOr<std::string> result);

  absl::Status Transition(JobRt& rt, v1::JobState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Tears the current attempt down; `target` is SUCCEEDED, FAILED, STOPPED, or
  // RESTARTING (which becomes FAILED when no restarts are left).
  void BeginTeardown(JobRt& rt, v1::JobState target, const std::string& reason, Outbox& out,
                     bool root_cause = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkExited(JobRt& rt, int executor) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Nothing more is placed on the node; jobs with executors there save and restart
  // elsewhere (drivers that can checkpoint are asked to; others are torn down), their
  // restarts not counted. `why`: "is leaving", "was drained".
  void Evacuate(const std::string& node_id, const std::string& why, Outbox& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool OnEvacuatedNode(const JobRt& rt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddEvent(JobRt& rt, const v1::JobEvent& ev) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // include_used: used devices too (can this ever fit?); registered: every known node, in
  // any state, as schedulable (the cluster's capacity, not what can take work now).
  std::vector<NodeView> NodeViews(bool include_used, bool registered = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the registered nodes are the cluster: every node this controller's store
  // knows has registered since the start, or two leases have passed (time for any live
  // agent to come back).
  bool Settled() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The least memory of a registered device of the type the spec's first group runs on (0: none known).
  int64_t SmallestDeviceMemory(const v1::JobSpec& spec) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SetDevicesUsed(const JobRt& rt, bool used) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Send(Outbox& out);
  void UpdateGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Devices the agent reports busy with executors that no live attempt owns (e.g.
  // the old attempt after a controller restart): not schedulable until they exit.
  void UpdateStaleDevices(NodeRt& n, const google::protobuf::RepeatedPtrField<v1::RunningExecutor>& running)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  JobManagerConfig cfg_;
  Store* store_;
  Rendezvous* rdv_;
  LogStore* logs_;
  Metrics* metrics_;
  DriverFactory drivers_;
  ExecutorConnector connect_;
  const std::string epoch_;
  const int64_t started_mono_;
  int64_t last_lease_check_mono_ ABSL_GUARDED_BY(mu_) = 0;  // MonoMs() at construction: admission waits a lease for agents to register

  std::mutex mu_;
  std::condition_variable cv_;  // job events and reconciler wake-ups
  std::map<std::string, JobRt> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> job_order_ ABSL_GUARDED_BY(mu_);  // submission order
  std::map<std::string, std::string> by_submission_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, NodeRt> nodes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> incarnations_ ABSL_GUARDED_BY(mu_);
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t job_counter_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread reconciler_;
  std::vector<std::shared_ptr<DriverRun>> runs_ ABSL_GUARDED_BY(mu_);  // driver threads to join
};

}  // namespace tessera::controller
