#include "controller/job_manager.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec.h"
#include "controller/controller.h"
#include "common/util.h"

namespace tessera::controller {
namespace {

using ::testing::HasSubstr;

class FakeLink : public AgentLink {
 public:
  bool Send(const v1::ControllerMessage& m) override {
    std::lock_guard<std::mutex> l(mu);
    msgs.push_back(m);
    return true;
  }
  std::vector<v1::ControllerMessage> Take() {
    std::lock_guard<std::mutex> l(mu);
    auto out = std::move(msgs);
    msgs.clear();
    return out;
  }
  std::mutex mu;
  std::vector<v1::ControllerMessage> msgs;
};

class FakeExecutor : public ExecutorClient {
 public:
  absl::StatusOr<v1::InitGroupResponse> InitGroup(const v1::InitGroupRequest&, int64_t) override { return v1::InitGroupResponse{}; }
  absl::Status Shutdown(int64_t) override { return absl::OkStatus(); }
  void Cancel() override {}
};

template <typename F>
bool WaitFor(F pred, int ms = 5000) {
  for (int i = 0; i < ms / 5; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = "/tmp/tessera-jm-test-" + RandomHex(4);
    ASSERT_TRUE(MakeDirs(dir_).ok());
    Open();
  }
  void Open() {
    store_ = *Store::Open(dir_ + "/state.db");
    logs_ = std::make_unique<LogStore>(dir_ + "/logs");
    JobManagerConfig cfg;
    cfg.lease_ttl_ms = lease_ms_;
    cfg.controller_address = "127.0.0.1:1";
    cfg.stop_unfinished_on_recover = stop_unfinished_;
    auto drivers = [this](const std::string&) -> absl::StatusOr<DriverFn> {
      return DriverFn([this](DriverContext& ctx) -> absl::StatusOr<std::string> {
        driver_runs_++;
        for (int i = 1; i <= progress_steps_; ++i) {
          v1::Progress p;
          p.set_step(i);
          p.set_total_steps(progress_steps_);
          (*p.mutable_metrics())["loss"] = 1.0 / i;
          ctx.progress(p);
        }
        while (block_driver_ && !*ctx.cancelled) std::this_thread::sleep_for(std::chrono::milliseconds(2));
        if (*ctx.cancelled) return absl::CancelledError("cancelled");
        if (!driver_error_.empty()) return absl::InternalError(driver_error_);
        return std::string("{\"ok\":true}");
      });
    };
    auto connect = [](const ExecutorTarget&) -> absl::StatusOr<std::shared_ptr<ExecutorClient>> {
      return std::shared_ptr<ExecutorClient>(std::make_shared<FakeExecutor>());
    };
    jm_ = std::make_unique<JobManager>(cfg, store_.get(), &rdv_, logs_.get(), nullptr, drivers, connect);
    ASSERT_TRUE(jm_->Recover().ok());
    jm_->Start();
  }
  void TearDown() override {
    jm_.reset();
    system(("rm -rf " + dir_).c_str());
  }
  void AddNode(const std::string& id, int cpus, std::shared_ptr<FakeLink> link, int64_t inc = 1, int64_t memory = 0) {
    v1::RegisterNodeRequest r;
    r.set_node_id(id);
    r.set_address("127.0.0.1");
    r.set_incarnation(inc);
    for (int i = 0; i < cpus; ++i) {
      auto* d = r.add_devices();
      d->set_index(i);
      d->set_type(v1::DEVICE_TYPE_CPU);
      d->set_memory_bytes(memory);
    }
    ASSERT_TRUE(jm_->RegisterNode(r).ok());
    ASSERT_TRUE(jm_->AttachAgent(id, inc, link).ok());
  }
  v1::JobSpec Spec(int devices, int max_restarts) {
    auto s = ParseJobSpecYaml("name: t\nkind: comm-check\nrestart_backoff_s: 0.01\ngroups:\n  - {name: w, devices: " +
                              std::to_string(devices) + "}\n");
    EXPECT_TRUE(s.ok());
    s->set_max_restarts(max_restarts);
    EXPECT_TRUE(NormalizeAndValidateJobSpec(*s).ok());
    return *s;
  }
  v1::JobState State(const std::string& id) { return jm_->GetJob(id)->state(); }
  // Waits for `n` start commands and registers those executors; returns their configs.
  std::vector<v1::ExecutorConfig> StartAll(FakeLink& link, size_t n) {
    std::vector<v1::ExecutorConfig> cfgs;
    EXPECT_TRUE(WaitFor([&] {
      std::lock_guard<std::mutex> l(link.mu);
      for (auto it = link.msgs.begin(); it != link.msgs.end();) {
        if (it->has_start()) { cfgs.push_back(it->start().config()); it = link.msgs.erase(it); } else ++it;
      }
      return cfgs.size() >= n;
    }));
    for (auto& c : cfgs) EXPECT_TRUE(jm_->RegisterExecutor(c.job_id(), c.attempt(), c.executor(), "127.0.0.1:2").ok());
    return cfgs;
  }
  // A manager with a 600 ms lease, one node "n1" of 2 slots (no heartbeats sent) and a
  // 2-executor job started on it with `max_restarts`; returns the job id.
  std::string StartOnAShortLease(int max_restarts, std::shared_ptr<FakeLink> link) {
    jm_.reset();
    lease_ms_ = 600;
    Open();
    AddNode("n1", 2, link);
    block_driver_ = true;
    std::string id = jm_->Submit(Spec(2, max_restarts), "")->first.job_id();
    StartAll(*link, 2);
    return id;
  }
  // Waits until the manager asks the agent to stop the attempt (the driver finished).
  void WaitStop(FakeLink& link) {
    EXPECT_TRUE(WaitFor([&] {
      std::lock_guard<std::mutex> l(link.mu);
      for (auto& m : link.msgs) if (m.has_stop()) return true;
      return false;
    }));
  }
  void ExitAll(const std::vector<v1::ExecutorConfig>& cfgs, const std::string& node, bool requested) {
    for (auto& c : cfgs) {
      v1::ExecutorEvent ev;
      ev.set_job_id(c.job_id());
      ev.set_attempt(c.attempt());
      ev.set_executor(c.executor());
      ev.set_phase(v1::EXECUTOR_PHASE_EXITED);
      ev.set_requested_stop(requested);
      ev.set_signal(requested ? 15 : 0);
      jm_->OnExecutorEvent(node, ev);
    }
  }

  // Executor `executor` of the job's attempt exited on its own: killed by `signal`, or
  // with `exit_code` (signal 0).
  void ExecutorDied(const std::string& id, int attempt, int executor, int signal, int exit_code = 0) {
    v1::ExecutorEvent ev;
    ev.set_job_id(id);
    ev.set_attempt(attempt);
    ev.set_executor(executor);
    ev.set_phase(v1::EXECUTOR_PHASE_EXITED);
    if (signal != 0) ev.set_signal(signal);
    else ev.set_exit_code(exit_code);
    jm_->OnExecutorEvent("n1", ev);
  }

  std::string dir_;
  std::unique_ptr<Store> store_;
  Rendezvous rdv_;
  std::unique_ptr<LogStore> logs_;
  std::unique_ptr<JobManager> jm_;
  int64_t lease_ms_ = 60000;
  bool stop_unfinished_ = false;
  std::atomic<int> driver_runs_{0};
  std::atomic<bool> block_driver_{false};
  int progress_steps_ = 0;  // progress events the driver reports before it ends
  std::string driver_error_;
};

TEST_F(JobManagerTest, RunsToSuccessThroughEveryState) {
  auto link = std::make_shared<FakeLink>();
  AddNode("n1", 4, link);
  auto r = jm_->Submit(Spec(4, 0), "sub-1");
  ASSERT_TRUE(r.ok()) << r.status();
  std::string id = r->first.job_id();
  auto cfgs = StartAll(*link, 4);
  ASSERT_TRUE(WaitFor([&] { return State(id) != v1::JOB_STATE_STARTING && State(id) != v1::JOB_STATE_PLACING; }));
  // Driver finished: the attempt is torn down (stop sent), then SUCCEEDED once executors exit.
  ASSERT_TRUE(WaitFor([&] {
    std::lock_guard<std::mutex> l(link->mu);
    for (auto& m : link->msgs) if (m.has_stop()) return true;
    return false;
  }));
  EXPECT_NE(State(id), v1::JOB_STATE_SUCCEEDED);
  ExitAll(cfgs, "n1", true);
  ASSERT_TRUE(WaitFor([&] { return State(id) == v1::JOB_STATE_SUCCEEDED; }));
  bool done = false;
  auto evs = jm_->WaitEvents(id, 0, 0, &done);
  std::vector<v1::JobState> states;
  for (auto& e : *evs) if (!e.has_progress()) states.push_back(e.state());
  EXPECT_EQ(states, (std::vector<v1::JobState>{v1::JOB_STATE_PENDING, v1::JOB_STATE_PLACING, v1::JOB_STATE_STARTING, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED}));
  EXPECT_TRUE(done);
  EXPECT_EQ(jm_->GetJob(id)->result_json(), "{\"ok\":true}");
  // Idempotent submission.
  auto again = jm_->Submit(Spec(4, 0), "sub-1");
  EXPECT_FALSE(again->second);
  EXPECT_EQ(again->first.job_id(), id);
  // Devices are free again.
  auto cs = jm_->ClusterStatus();
  for (auto& d : cs.nodes(0).devices()) EXPECT_TRUE(d.used_by_job().empty());
}

TEST_F(JobManagerTest, ExecutorCrashRestartsWholeAttempt) {
  auto link = std::make_shared<FakeLink>();
  AddNode("n1", 4, link);
  block_driver_ = true;
  std::string id = jm_->Submit(Spec(4, 1), "")->first.job_id();
  auto cfgs = StartAll(*link, 4);
  ASSERT_TRUE(WaitFor([&] { return State(id) == v1::JOB_STATE_RUNNING; }));
  std::string secret = cfgs[0].secret();
  EXPECT_TRUE(jm_->CheckScope(id, 1, secret).ok());
  EXPECT_EQ(jm_->CheckScope(id, 1, "wrong").code(), absl::StatusCode::kPermissionDenied);
  ExecutorDied(id, 1, 2, /*signal=*/9);  // kill -9 of executor 2
  ASSERT_TRUE(WaitFor([&] { return State(id) == v1::JOB_STATE_RESTARTING; }));
  EXPECT_THAT(jm_->GetJob(id)->reason(), HasSubstr("executor 2 (w rank 2) on node n1 was killed by signal 9"));
  // The stale attempt is refused from now on.
  EXPECT_EQ(jm_->CheckScope(id, 1, secret).code(), absl::StatusCode::kFailedPrecondition);
  // Nothing new starts before the old executors are gone.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (auto& m : link->Take()) EXPECT_FALSE(m.has_start());
  cfgs.erase(cfgs.begin() + 2);
  ExitAll(cfgs, "n1", true);
  block_driver_ = false;
  auto cfgs2 = StartAll(*link, 4);
  EXPECT_EQ(cfgs2[0].attempt(), 2);
  WaitStop(*link);
  ExitAll(cfgs2, "n1", true);
  ASSERT_TRUE(WaitFor([&] { return State(id) == v1::JOB_STATE_SUCCEEDED; }));
  EXPECT_EQ(jm_->GetJob(id)->restarts(), 1);
}

// A stop that comes while an attempt tears down for a restart (an executor was killed,
// the others are still exiting) is not lost: the job ends STOPPED once they are gone, and
// no next attempt starts.
TEST_F(JobManagerTest, AStopDuringARestartsTeardownStopsTheJob) {
  auto link = std::make_shared<FakeLink>();
  AddNode("n1", 2, link);
  block_driver_ = true;
  std::string id = jm_->Submit(Spec(2, 3), "")->first.job_id();
  auto cfgs = StartAll(*link, 2);
  ASSERT_TRUE(WaitFor([&] { return State(id) == v1::JOB_STATE_RUNNING; }));
  ExecutorDied(id, 1, 1, /*signal=*/9);
  ASSERT_TRUE(WaitFor([&] { return State(id) == v1::JOB_STATE_RESTARTING; }));
  auto stopped = jm_->Stop(id, "");
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  cfgs.erase(cfgs.begin() + 1);
  ExitAll(cfgs, "n1", true);
  ASSERT_TRUE(WaitFor([&] { return State(id) == v1::JOB_STATE_STOPPED; }));
  EXPECT_EQ(jm_->GetJob(id)->reason(), "stopped by user");
  EXPECT_EQ(jm_->GetJob(id)->attempt(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (auto& m : link->Take()) EXPECT_FALSE(m.has_start());
}

TEST_F(JobManagerTest, NoRestartsLeftFailsWithRankAndNode) {
  auto link = std::make_shared<FakeLink>();
  AddNode("n1", 2, link);
  block_driver_ = true;
  std::string id = jm_->Submit(Spec(2, 0), "")->first.job_id();
  auto cfgs = StartAll(*link, 2);
  ASSERT_TRUE(WaitFor([&] { return State(id) == v1::JOB_STATE_RUNNING; }));
  ExecutorDied(id, 1, 1, /*signal=*/0, /*exit_code=*/3);
  ExitAll({cfgs[0]}, "n1", true);
  ASSERT_TRUE(WaitFor([&] { return State(id) == v1::JOB_STATE_FAILED; }));
  EXPECT_THAT(jm_->GetJob(id)->reason(), HasSubstr("executor 1 (w rank 1) on node n1 exited with code 3"));
}

TEST_F(JobManagerTest, NeverFitsIsRejectedAndNotPersisted) {
  auto link = std::make_shared<FakeLink>();
  AddNode("n1", 2, link);
  auto r = jm_->Submit(Spec(4, 0), "");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("can never fit"));
  EXPECT_TRUE(jm_->ListJobs({}, 0)->jobs.empty());
  EXPECT_TRUE(store_->LoadJobs()->empty());
}

TEST_F(JobManagerTest, CannotFitNowWaitsPending) {
  auto link = std::make_shared<FakeLink>();
  AddNode("n1", 2, link);
  block_driver_ = true;
  std::string a = jm_->Submit(Spec(2, 0), "")->first.job_id();
  auto cfgs = StartAll(*link, 2);
  std::string b = jm_->Submit(Spec(2, 0), "")->first.job_id();
  ASSERT_TRUE(WaitFor([&] { return jm_->GetJob(b)->reason().find("Unschedulable") != std::string::npos; }));
  EXPECT_EQ(State(b), v1::JOB_STATE_PENDING);
  ASSERT_TRUE(jm_->Stop(a, "").ok());
  ExitAll(cfgs, "n1", true);
  ASSERT_TRUE(WaitFor([&] { return State(a) == v1::JOB_STATE_STOPPED; }));
  ASSERT_TRUE(WaitFor([&] { return State(b) == v1::JOB_STATE_STARTING; }));
}

TEST_F(JobManagerTest, LostNodeRestartsItsJobs) {
  const std::string id = StartOnAShortLease(0, std::make_shared<FakeLink>());
  ASSERT_TRUE(WaitFor([&] { return State(id) == v1::JOB_STATE_RUNNING; }));
  // No heartbeats: after the 600 ms lease the node is lost and the job fails (no restarts left).
  ASSERT_TRUE(WaitFor([&] { return State(id) == v1::JOB_STATE_FAILED; }, 5000));
  EXPECT_THAT(jm_->GetJob(id)->reason(), HasSubstr("node n1 was lost"));
  EXPECT_EQ(jm_->ClusterStatus().nodes(0).state(), v1::NODE_STATE_LOST);
}

TEST_F(JobManagerTest, DrainedNodeTakesNoNewWork) {
  auto l1 = std::make_shared<FakeLink>(), l2 = std::make_shared<FakeLink>();
  AddNode("n1", 2, l1);
  AddNode("n2", 2, l2);
  auto d = jm_->Drain("n1");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->state(), v1::NODE_STATE_DRAINING);
  EXPECT_EQ(jm_->Drain("nope").status().code(), absl::StatusCode::kNotFound);
  block_driver_ = true;
  std::string id = jm_->Submit(Spec(2, 0), "")->first.job_id();
  auto cfgs = StartAll(*l2, 2);
  for (auto& c : cfgs) EXPECT_EQ(c.node_id(), "n2");
  EXPECT_TRUE(l1->Take().empty());
  // A second job does not fit: n1 is draining, n2 is busy.
  std::string b = jm_->Submit(Spec(2, 0), "")->first.job_id();
  ASSERT_TRUE(WaitFor([&] { return jm_->GetJob(b)->reason().find("Unschedulable") != std::string::npos; }));
}

TEST_F(JobManagerTest, StaleIncarnationIsRefused) {
  auto link = std::make_shared<FakeLink>();
  AddNode("n1", 2, link, 5);
  v1::RegisterNodeRequest r;
  r.set_node_id("n1");
  r.set_address("x");
  r.set_incarnation(4);
  EXPECT_EQ(jm_->RegisterNode(r).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobManagerTest, RecoversJobsAfterRestartWithoutLaunchingTwice) {
  auto link = std::make_shared<FakeLink>();
  AddNode("n1", 2, link);
  block_driver_ = true;
  std::string id = jm_->Submit(Spec(2, 1), "")->first.job_id();
  auto cfgs = StartAll(*link, 2);
  ASSERT_TRUE(WaitFor([&] { return State(id) == v1::JOB_STATE_RUNNING; }));
  std::string done_id;
  jm_.reset();  // the controller dies
  block_driver_ = false;
  Open();
  EXPECT_EQ(State(id), v1::JOB_STATE_RESTARTING);
  // The agent re-registers (same incarnation) still running both old executors:
  // they are stopped, and only after they exit does attempt 2 start.
  auto link2 = std::make_shared<FakeLink>();
  v1::RegisterNodeRequest r;
  r.set_node_id("n1");
  r.set_address("127.0.0.1");
  r.set_incarnation(1);
  for (int i = 0; i < 2; ++i) {
    auto* d = r.add_devices();
    d->set_index(i);
    d->set_type(v1::DEVICE_TYPE_CPU);
    auto* run = r.add_running();
    run->set_job_id(id);
    run->set_attempt(1);
    run->set_executor(i);
  }
  ASSERT_TRUE(jm_->RegisterNode(r).ok());
  ASSERT_TRUE(jm_->AttachAgent("n1", 1, link2).ok());
  bool stop_seen = false;
  for (auto& m : link2->Take()) { EXPECT_FALSE(m.has_start()); stop_seen |= m.has_stop(); }
  EXPECT_TRUE(stop_seen);
  ExitAll(cfgs, "n1", true);
  auto cfgs2 = StartAll(*link2, 2);
  EXPECT_EQ(cfgs2[0].attempt(), 2);
  WaitStop(*link2);
  ExitAll(cfgs2, "n1", true);
  ASSERT_TRUE(WaitFor([&] { return State(id) == v1::JOB_STATE_SUCCEEDED; }));
  EXPECT_EQ(jm_->GetJob(id)->restarts(), 0);  // a controller restart is not the job's fault
}

// Every event of a long run is kept, past what memory holds, and across a controller
// restart: WaitEvents pages through them from the first, in order, their numbering and
// epoch the same after the restart, and recovering a finished job adds no event to it.
TEST_F(JobManagerTest, EveryEventOfALongRunSurvivesARestart) {
  progress_steps_ = static_cast<int>(JobManager::kEventsInMemory + 2000);
  auto link = std::make_shared<FakeLink>();
  AddNode("n1", 1, link);
  std::string id = jm_->Submit(Spec(1, 0), "")->first.job_id();
  auto cfgs = StartAll(*link, 1);
  WaitStop(*link);
  ExitAll(cfgs, "n1", true);
  ASSERT_TRUE(WaitFor([&] { return State(id) == v1::JOB_STATE_SUCCEEDED; }));
  auto all = [&] {
    std::vector<v1::JobEvent> out;
    bool done = false;
    for (int64_t from = 0; !done;) {
      auto page = jm_->WaitEvents(id, from, 0, &done);
      EXPECT_TRUE(page.ok()) << page.status();
      if (!page.ok() || page->empty()) break;
      EXPECT_LE(static_cast<int64_t>(page->size()), JobManager::kEventsPerPage);
      out.insert(out.end(), page->begin(), page->end());
      from = page->back().seq();
    }
    EXPECT_TRUE(done);
    return out;
  };
  auto check = [&](const std::vector<v1::JobEvent>& evs) {
    int steps = 0;
    for (size_t i = 0; i < evs.size(); ++i) {
      EXPECT_EQ(evs[i].seq(), static_cast<int64_t>(i) + 1);
      if (evs[i].has_progress()) EXPECT_EQ(evs[i].progress().step(), ++steps);
    }
    EXPECT_EQ(steps, progress_steps_);
    ASSERT_FALSE(evs.empty());
    EXPECT_EQ(evs.front().state(), v1::JOB_STATE_PENDING);
    EXPECT_EQ(evs.back().state(), v1::JOB_STATE_SUCCEEDED);
  };
  const std::vector<v1::JobEvent> before = all();
  check(before);
  const std::string epoch = jm_->epoch();
  jm_.reset();  // the controller stops; another starts on the same state directory
  Open();
  EXPECT_EQ(jm_->epoch(), epoch);
  const std::vector<v1::JobEvent> after = all();
  check(after);
  ASSERT_EQ(after.size(), before.size());
  EXPECT_EQ(after.back().SerializeAsString(), before.back().SerializeAsString());
  // A watcher that had seen everything is done at once; one from the middle gets the rest.
  bool done = false;
  auto rest = jm_->WaitEvents(id, after.back().seq(), 0, &done);
  EXPECT_TRUE(rest.ok() && rest->empty() && done);
  rest = jm_->WaitEvents(id, after.size() - 3, 0, &done);
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(rest->size(), 3u);
  EXPECT_TRUE(done);
}

// A submission id names one request: retried with the same spec it returns the job; with
// another spec it is an error, not a silent return of a job the caller did not ask for.
TEST_F(JobManagerTest, ASubmissionIdWithAnotherSpecIsRefused) {
  auto link = std::make_shared<FakeLink>();
  AddNode("n1", 4, link);
  block_driver_ = true;
  auto first = jm_->Submit(Spec(2, 0), "sub-x");
  ASSERT_TRUE(first.ok()) << first.status();
  auto same = jm_->Submit(Spec(2, 0), "sub-x");
  ASSERT_TRUE(same.ok());
  EXPECT_FALSE(same->second);
  auto other = jm_->Submit(Spec(4, 0), "sub-x");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(other.status().message()),
              HasSubstr("submission_id 'sub-x' was used for job " + first->first.job_id() + " with a different spec"));
}

// Lists are pages of summaries: a stored spec of any size cannot make a page too large.
TEST_F(JobManagerTest, ListJobsPagesSummaries) {
  auto link = std::make_shared<FakeLink>();
  AddNode("n1", 1, link);
  block_driver_ = true;
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    v1::JobSpec s = Spec(1, 0);
    (*s.mutable_env())["NCCL_DEBUG"] = std::string(4000, 'x');  // weight in the stored spec
    s.mutable_comm_check()->add_collectives("all_reduce");
    ids.push_back(jm_->Submit(s, "")->first.job_id());
  }
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    auto page = jm_->ListJobs({}, 2, token);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->jobs.size(), 2u);
    for (const auto& j : page->jobs) {
      seen.push_back(j.job_id());
      EXPECT_EQ(j.spec().kind(), "comm-check");
      EXPECT_EQ(j.spec().groups_size(), 1);
      EXPECT_TRUE(j.spec().env().empty()) << "a list carries no whole spec";
      EXPECT_TRUE(j.assignments().empty());
    }
    token = page->next_page_token;
    ++pages;
  } while (!token.empty());
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(seen, std::vector<std::string>(ids.rbegin(), ids.rend()));  // newest first, each once
  EXPECT_EQ(jm_->ListJobs({}, 2, "no-such-job").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(jm_->GetJob(ids[0])->spec().env().at("NCCL_DEBUG").size(), 4000u);  // GetJob has it all
}

// Defence in depth: a stored job whose spec no longer validates (an older version stored
// it, or a rule was added) ends FAILED with the reason when the controller starts,
// instead of being set up — the controller never trips over its own state.
TEST_F(JobManagerTest, AStoredJobThatNoLongerValidatesFailsOnRecovery) {
  v1::Job bad;
  bad.set_job_id("bad-000001");
  bad.set_state(v1::JOB_STATE_RUNNING);
  bad.set_attempt(1);
  *bad.mutable_spec() = Spec(2, 0);
  auto* l = bad.mutable_spec()->mutable_groups(0)->mutable_layout();
  l->set_tp(1 << 20), l->set_dp(1 << 20);  // tp*dp overflows an int: once a segfault at setup
  auto* a = bad.add_assignments();
  a->set_executor(0), a->set_node_id("n1");
  ASSERT_TRUE(store_->PutJob(bad).ok());
  jm_.reset();
  Open();
  auto j = jm_->GetJob("bad-000001");
  ASSERT_TRUE(j.ok());
  EXPECT_EQ(j->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(j->reason(), HasSubstr("the stored job spec is not valid: groups[0].layout.tp: must be in [1, 1024]"));
  EXPECT_EQ(store_->LoadJobs()->at(0).state(), v1::JOB_STATE_FAILED);  // persisted: the next start does not see it again
}

// `tessera local`'s controller: what an earlier run left unfinished is marked STOPPED,
// never resumed beside the new job.
TEST_F(JobManagerTest, UnfinishedJobsAreStoppedNotResumedWhenAsked) {
  auto link = std::make_shared<FakeLink>();
  AddNode("n1", 2, link);
  block_driver_ = true;
  std::string id = jm_->Submit(Spec(2, 0), "")->first.job_id();
  StartAll(*link, 2);
  ASSERT_TRUE(WaitFor([&] { return State(id) == v1::JOB_STATE_RUNNING; }));
  jm_.reset();
  stop_unfinished_ = true;
  Open();
  EXPECT_EQ(State(id), v1::JOB_STATE_STOPPED);
  EXPECT_THAT(jm_->GetJob(id)->reason(), HasSubstr("left unfinished by an earlier run"));
}

// "Can never fit" counts the registered cluster (a drained node, one lost a moment ago),
// not only the nodes that can take work now: such a job waits, saying why.
TEST_F(JobManagerTest, NeverFitsCountsTheRegisteredCapacity) {
  auto l1 = std::make_shared<FakeLink>(), l2 = std::make_shared<FakeLink>();
  AddNode("n1", 2, l1);
  AddNode("n2", 2, l2);
  ASSERT_TRUE(jm_->Drain("n2").ok());
  auto r = jm_->Submit(Spec(4, 0), "");
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string id = r->first.job_id();
  ASSERT_TRUE(WaitFor([&] { return jm_->GetJob(id)->reason().find("Unschedulable") != std::string::npos; }));
  EXPECT_EQ(State(id), v1::JOB_STATE_PENDING);
  ASSERT_TRUE(jm_->Drain("n2", false, /*undo=*/true).ok());
  auto cfgs = StartAll(*l1, 2);
  EXPECT_EQ(cfgs.size(), 2u);
  EXPECT_EQ(jm_->Submit(Spec(8, 0), "").status().code(), absl::StatusCode::kResourceExhausted);  // more than registered
}

// Just after a restart the nodes have not registered again: a job is not refused for
// capacity nobody has reported yet; it waits and runs once they are back.
TEST_F(JobManagerTest, AfterARestartCapacityIsWaitedForNotRefused) {
  auto link = std::make_shared<FakeLink>();
  AddNode("n1", 2, link);
  jm_.reset();
  Open();
  auto r = jm_->Submit(Spec(2, 0), "");
  ASSERT_TRUE(r.ok()) << r.status();
  const std::string id = r->first.job_id();
  ASSERT_TRUE(WaitFor([&] { return jm_->GetJob(id)->reason().find("waits for nodes to join") != std::string::npos; }));
  auto link2 = std::make_shared<FakeLink>();
  AddNode("n1", 2, link2);
  EXPECT_EQ(StartAll(*link2, 2).size(), 2u);
}

// A training job whose plan needs more memory per rank than its devices have is refused at
// submit with the plan's numbers.
TEST_F(JobManagerTest, APlanOverTheDevicesMemoryIsRefusedWithItsNumbers) {
  auto link = std::make_shared<FakeLink>();
  AddNode("n1", 2, link, 1, /*memory=*/64 << 20);
  auto spec = ParseJobSpecYaml(R"(
name: big
kind: pretrain
groups: [{name: actor, devices: 2}]
model: {vocab_size: 32000, hidden: 1024, num_layers: 8, num_heads: 8, num_kv_heads: 8, ffn: 4096, seq_len: 512,
        global_batch: 2, micro_batch: 1}
train: {steps: 1, lr: 1.0e-4}
)");
  ASSERT_TRUE(spec.ok());
  ASSERT_TRUE(NormalizeAndValidateJobSpec(*spec).ok());
  auto r = jm_->Submit(*spec, "");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("groups[0] ('actor'): `tessera plan` puts"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("but its CPU slots have 0.06 GiB"));
  spec->mutable_model()->set_hidden(64), spec->mutable_model()->set_ffn(128), spec->mutable_model()->set_vocab_size(256);
  spec->mutable_model()->set_seq_len(32);
  EXPECT_TRUE(jm_->Submit(*spec, "").ok());
}

// A grpo job is planned device set by device set: the actor's and its reference's states
// and the largest pass over the devices' memory is refused naming each model's share.
TEST_F(JobManagerTest, AnRlPlanOverTheDevicesMemoryNamesEachModel) {
  auto link = std::make_shared<FakeLink>();
  AddNode("n1", 2, link, 1, /*memory=*/64 << 20);
  auto spec = ParseJobSpecYaml(R"(
name: big-rl
kind: grpo
groups: [{name: actor, devices: 2}]
model: {vocab_size: 32000, hidden: 1024, num_layers: 8, num_heads: 8, num_kv_heads: 8, ffn: 4096, seq_len: 512,
        global_batch: 2, micro_batch: 1}
train: {steps: 1, lr: 1.0e-4}
rl: {kl_coef: 0.01, prompts_per_step: 2, group_size: 2}
)");
  ASSERT_TRUE(spec.ok());
  ASSERT_TRUE(NormalizeAndValidateJobSpec(*spec).ok());
  auto r = jm_->Submit(*spec, "");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("the devices of group 'actor': `tessera plan` puts"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("reference ('actor')"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("but its CPU slots have 0.06 GiB"));
  spec->mutable_model()->set_hidden(64), spec->mutable_model()->set_ffn(128), spec->mutable_model()->set_vocab_size(256);
  spec->mutable_rl()->set_max_tokens_per_micro_batch(256);
  EXPECT_TRUE(jm_->Submit(*spec, "").ok());
}

// A node declared lost whose agent speaks again (it was stalled past its lease) is asked
// to register anew; registering, it reports the executors it still runs, and those of the
// attempt that was written off are stopped.
TEST_F(JobManagerTest, ALostNodeThatSpeaksAgainRegistersAnewAndItsFencedExecutorsStop) {
  const std::string id = StartOnAShortLease(3, std::make_shared<FakeLink>());
  ASSERT_TRUE(WaitFor([&] { return jm_->ClusterStatus().nodes(0).state() == v1::NODE_STATE_LOST; }, 5000));
  v1::Heartbeat hb;
  const auto st = jm_->OnHeartbeat("n1", 1, hb);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(st.message()), HasSubstr("was declared lost"));
  v1::RegisterNodeRequest r;
  r.set_node_id("n1"), r.set_address("127.0.0.1"), r.set_incarnation(1);
  for (int i = 0; i < 2; ++i) {
    auto* d = r.add_devices();
    d->set_index(i), d->set_type(v1::DEVICE_TYPE_CPU);
    auto* run = r.add_running();
    run->set_job_id(id), run->set_attempt(1), run->set_executor(i), run->set_device_index(i);
  }
  ASSERT_TRUE(jm_->RegisterNode(r).ok());
  auto link2 = std::make_shared<FakeLink>();
  ASSERT_TRUE(jm_->AttachAgent("n1", 1, link2).ok());
  EXPECT_EQ(jm_->ClusterStatus().nodes(0).state(), v1::NODE_STATE_READY);
  bool stopped = false;
  for (auto& m : link2->Take()) stopped |= m.has_stop() && m.stop().job_id() == id && m.stop().attempt() == 1;
  EXPECT_TRUE(stopped) << "the written-off attempt's executors were not stopped";
  EXPECT_TRUE(jm_->OnHeartbeat("n1", 1, hb).ok());
}

// What an agent sends is checked before it names a file: logs for a job it does not run,
// or with a job id that is a path, are dropped.
TEST_F(JobManagerTest, LogsAnAgentSendsAreChecked) {
  auto l1 = std::make_shared<FakeLink>(), l2 = std::make_shared<FakeLink>();
  AddNode("n1", 2, l1);
  AddNode("n2", 2, l2);
  block_driver_ = true;
  std::string id = jm_->Submit(Spec(2, 0), "")->first.job_id();
  StartAll(*l1, 2);
  auto send = [&](const std::string& node, const std::string& job, int attempt, int executor) {
    v1::LogBatch b;
    b.set_job_id(job), b.set_attempt(attempt), b.set_executor(executor);
    b.add_lines("hello");
    jm_->OnLogs(node, b);
  };
  send("n1", "../escaped", 1, 0);
  send("n1", id, 1, 7);
  send("n2", id, 1, 0);  // executor 0 runs on n1
  send("n1", id, 2, 0);  // no attempt 2 yet
  EXPECT_FALSE(ReadFile(dir_ + "/escaped/attempt-1/executor-0.log").ok());
  EXPECT_FALSE(ReadFile(dir_ + "/logs/" + id + "/attempt-1/executor-7.log").ok());
  EXPECT_FALSE(ReadFile(dir_ + "/logs/" + id + "/attempt-2/executor-0.log").ok());
  EXPECT_FALSE(ReadFile(dir_ + "/logs/" + id + "/attempt-1/executor-0.log").ok());
  send("n1", id, 1, 0);
  EXPECT_EQ(*ReadFile(dir_ + "/logs/" + id + "/attempt-1/executor-0.log"), "hello\n");
}

// The driver's calls wait for an executor's connection to come up; the first one has a
// bound, so an address the controller cannot reach is an error naming it, not a hang
// until a call's deadline.
TEST(GrpcExecutorConnector, AnUnreachableExecutorIsANamedErrorNotAHang) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);  // a port nothing listens on
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string address = absl::StrCat("127.0.0.1:", ntohs(a.sin_port));
  auto connect = GrpcExecutorConnector("", /*insecure=*/true, /*connect_timeout_ms=*/500);
  const auto t0 = std::chrono::steady_clock::now();
  auto c = connect(ExecutorTarget{address, "secret", 3, "n9"});
  close(fd);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(c.status().message()),
              ::testing::HasSubstr(absl::StrCat("cannot reach executor 3 on node n9 at ", address, " within 0.5 s")));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

}  // namespace
}  // namespace tessera::controller
