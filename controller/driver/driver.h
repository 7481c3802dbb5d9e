// The driver framework: a job kind's single-controller loop, written against
// WorkerGroup objects (docs/design.md §2). The JobManager runs one DriverRun per running
// attempt on its own thread.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "controller/driver/worker_group.h"
#include "tessera/v1/job_service.pb.h"

namespace tessera::controller {

struct DriverContext {
  v1::Job job;  // a snapshot at start (spec, attempt, assignments)
  std::map<std::string, std::unique_ptr<WorkerGroup>> groups;
  std::function<void(const v1::Progress&)> progress;
  std::atomic<bool>* cancelled = nullptr;
  // Set when a node of the job is leaving (its agent got SIGTERM) or was drained with
  // move_jobs (DrainNode): a driver that can
  // should save a checkpoint at the next step boundary and return an error saying so;
  // the attempt then restarts elsewhere without counting against max_restarts.
  std::atomic<bool>* preempt = nullptr;
};

// Step loops' handling of DriverContext::preempt: Before(s) is the "save" flag for step
// s's call (and an UNAVAILABLE error when the job has no checkpoint directory to save
// to); After(s) ends the attempt once step s saved, unless it was the last step.
class Preemption {
 public:
  Preemption(const DriverContext& ctx, bool checkpoints) : ctx_(ctx), checkpoints_(checkpoints) {}
  absl::StatusOr<bool> Before(int64_t step);
  absl::Status After(int64_t step, int64_t steps) const;

 private:
  const DriverContext& ctx_;
  bool checkpoints_;
  bool saving_ = false;
};

// Runs the job; returns its result (JSON) or why it failed.
using DriverFn = std::function<absl::StatusOr<std::string>(DriverContext&)>;
// kind -> driver (NOT_FOUND for kinds without one).
using DriverFactory = std::function<absl::StatusOr<DriverFn>(const std::string& kind)>;
// Where one executor of an attempt serves, and how to reach it.
struct ExecutorTarget {
  std::string address;  // host:port it registered
  std::string secret;   // the attempt's secret
  int executor = 0;     // its index in the job
  std::string node_id;  // the node it runs on (named in errors)
};
// Connects to an executor. Every call names the executor it is meant for, and an executor
// refuses calls meant for another (a port answered by the wrong process).
using ExecutorConnector = std::function<absl::StatusOr<std::shared_ptr<ExecutorClient>>(const ExecutorTarget&)>;

// State shared between the JobManager and a driver thread.
struct DriverRun {
  std::atomic<bool> cancelled{false};
  std::atomic<bool> finished{false};  // the thread is about to exit
  std::atomic<bool> preempt{false};   // DriverContext::preempt
  std::vector<std::shared_ptr<ExecutorClient>> clients;  // to cancel in-flight calls
  std::mutex mu;
  std::thread thread;
  void Cancel() {
    cancelled = true;
    std::lock_guard<std::mutex> l(mu);
    for (auto& c : clients) c->Cancel();
  }
};

// The step every rank's TrainInit reported (start_step: the checkpoint it resumed from, 0
// for none); DATA_LOSS when ranks disagree.
absl::StatusOr<int64_t> AgreedStartStep(const std::vector<v1::TrainInitResponse>& train_init);

// An RL job's held-out accuracy (greedy, the arithmetic problems no job trains on; none
// on JSONL prompts): RlEval on every rank of `group` — each answers its DP rank's share —
// with one rank per TP group counted (TP rank 0: ranks are ordered tp fastest), before
// the first step and after every rl.eval_every steps and the last.
class HeldOutEvaluator {
 public:
  HeldOutEvaluator(const v1::JobSpec& spec, WorkerGroup& group, int tp);
  // Before the first step (`start`: a resumed job's): evaluates and reports progress.
  absl::Status Start(DriverContext& ctx, int64_t start, int steps);
  // After step `s` (0-based) when due: evaluates and adds the accuracy to `p`.
  absl::Status AfterStep(int64_t s, int steps, v1::Progress* p);
  // [{"step", "accuracy"}...] for the job's result.
  const nlohmann::json& curve() const { return curve_; }

 private:
  absl::StatusOr<double> Evaluate();
  const v1::JobSpec& spec_;
  WorkerGroup& group_;
  int tp_;
  bool on_;
  bool multi_turn_;  // rl.environment: tool calls reported beside the accuracy
  int64_t problems_ = 0;  // answered by the last evaluation
  double tool_calls_ = 0;  // multi-turn: the last evaluation's environment calls per problem
  nlohmann::json curve_ = nlohmann::json::array();
};

// The built-in drivers of this build.
absl::StatusOr<DriverFn> BuiltinDriver(const std::string& kind);

}  // namespace tessera::controller
