#include "controller/job_manager.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <csignal>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include <google/protobuf/util/message_differencer.h>
#include "common/spec/job_spec.h"
#include "controller/admission.h"
#include "common/status.h"
#include "common/util.h"

namespace tessera::controller {

namespace {
bool Active(v1::JobState s) {
  return s == v1::JOB_STATE_PLACING || s == v1::JOB_STATE_STARTING || s == v1::JOB_STATE_RUNNING || s == v1::JOB_STATE_RESTARTING;
}
// The job's current attempt is one executors may serve: placed and not being torn down
// (RESTARTING is between attempts: the last one is gone or going).
bool LiveAttempt(v1::JobState s, bool tearing_down) {
  return !tearing_down && (s == v1::JOB_STATE_PLACING || s == v1::JOB_STATE_STARTING || s == v1::JOB_STATE_RUNNING);
}
std::string ExitDescription(const v1::ExecutorEvent& ev) {
  if (ev.phase() == v1::EXECUTOR_PHASE_FAILED_TO_START) return absl::StrCat("failed to start: ", ev.message());
  if (ev.signal() != 0) return absl::StrCat("was killed by signal ", ev.signal(), " (", strsignal(ev.signal()), ")");
  return absl::StrCat("exited with code ", ev.exit_code(), ev.message().empty() ? "" : ": ", ev.message());
}
}  // namespace

JobManager::JobManager(JobManagerConfig cfg, Store* store, Rendezvous* rdv, LogStore* logs, Metrics* metrics,
                       DriverFactory drivers, ExecutorConnector connect)
    : cfg_(std::move(cfg)), store_(store), rdv_(rdv), logs_(logs), metrics_(metrics),
      drivers_(std::move(drivers)), connect_(std::move(connect)), epoch_(store->id()), started_mono_(MonoMs()) {}

JobManager::~JobManager() { Shutdown(); }

absl::Status JobManager::Recover() {
  TESSERA_ASSIGN_OR_RETURN(auto incs, store_->LoadNodeIncarnations());
  TESSERA_ASSIGN_OR_RETURN(auto jobs, store_->LoadJobs());
  std::lock_guard<std::mutex> l(mu_);
  incarnations_ = incs;
  int64_t now = MonoMs();
  for (auto& j : jobs) {
    JobRt rt;
    rt.job = j;
    const std::string id = j.job_id();
    TESSERA_ASSIGN_OR_RETURN(const int64_t last_seq, store_->LastEventSeq(id));
    rt.next_seq = last_seq + 1;  // the numbering goes on; older events are read from the store
    const v1::JobState stored_state = j.state();
    job_counter_++;
    if (!j.submission_id().empty()) by_submission_[j.submission_id()] = id;
    // `tessera local`: a job an earlier run left unfinished (killed, Ctrl-C before it
    // could stop it) is not silently resumed beside the one this run was started for.
    if (cfg_.stop_unfinished_on_recover && !tessera::IsTerminal(j.state())) {
      rt.job.set_state(v1::JOB_STATE_STOPPED);
      rt.job.set_reason("left unfinished by an earlier run on this state directory; not resumed");
      rt.job.set_updated_ms(NowMs());
      rt.job.set_finished_ms(NowMs());
      TESSERA_RETURN_IF_ERROR(store_->PutJob(rt.job));
      spdlog::warn("job {} was left {} by an earlier run on this state directory: marked STOPPED, not resumed", id,
                   JobStateName(j.state()));
      j = rt.job;
    }
    // Defence in depth: a stored job is checked again before anything is set up for it (a
    // spec stored by an older version, or a rule added since). One that fails ends FAILED
    // with the reason, instead of the controller tripping over it at every start.
    if (!tessera::IsTerminal(j.state())) {
      v1::JobSpec check = j.spec();
      if (absl::Status st = NormalizeAndValidateJobSpec(check); !st.ok()) {
        rt.job.set_state(v1::JOB_STATE_FAILED);
        rt.job.set_reason(absl::StrCat("the stored job spec is not valid: ", st.message()));
        rt.job.set_updated_ms(NowMs());
        rt.job.set_finished_ms(NowMs());
        rt.job.clear_assignments();
        TESSERA_RETURN_IF_ERROR(store_->PutJob(rt.job));
        spdlog::error("recovered job {} FAILED: {}", id, rt.job.reason());
        j = rt.job;
      }
    }
    if (Active(j.state())) {
      // The driver of this attempt died with the old controller. Stop whatever of the
      // attempt still runs, then start a new attempt (not counted as a restart).
      for (const auto& a : j.assignments()) {
        ExecRt e;
        e.node_id = a.node_id();
        rt.execs[a.executor()] = e;
        auto& n = nodes_[a.node_id()];
        if (n.status.node_id().empty()) {
          n.status.set_node_id(a.node_id());
          n.status.set_state(v1::NODE_STATE_READY);
          n.last_seen_mono = now;  // give it a lease to re-register
        }
      }
      rt.tearing_down = true;
      rt.after_teardown = v1::JOB_STATE_RESTARTING;
      rt.after_reason = "the controller restarted while the job was active";
      rt.count_restart = false;
      if (rt.execs.empty()) rt.tearing_down = false, rt.restart_at_ms = now;
      spdlog::info("recovered job {} in state {}: attempt {} will be replaced", id, JobStateName(j.state()), j.attempt());
      if (j.state() != v1::JOB_STATE_RESTARTING) {
        rt.job.set_state(v1::JOB_STATE_RESTARTING);
        rt.job.set_reason(rt.after_reason);
        rt.job.set_updated_ms(NowMs());
        TESSERA_RETURN_IF_ERROR(store_->PutJob(rt.job));
      }
    }
    if (rt.job.state() != stored_state || last_seq == 0) {  // a change made here (or a store without events)
      v1::JobEvent ev;
      ev.set_state(rt.job.state());
      ev.set_reason(rt.job.reason());
      ev.set_attempt(rt.job.attempt());
      AddEvent(rt, ev);
    }
    job_order_.push_back(id);
    jobs_.emplace(id, std::move(rt));
  }
  // Devices of recovered attempts stay reserved until those executors are gone.
  for (auto& [id, rt] : jobs_) if (rt.tearing_down) SetDevicesUsed(rt, true);
  UpdateGauges();
  return absl::OkStatus();
}

void JobManager::Start() { reconciler_ = std::thread([this] { ReconcileLoop(); }); }

void JobManager::Shutdown() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) return;
    stopping_ = true;  // from here on, driver results change no job state
  }
  cv_.notify_all();
  if (reconciler_.joinable()) reconciler_.join();
  std::vector<std::shared_ptr<DriverRun>> runs;
  {
    std::lock_guard<std::mutex> l(mu_);
    runs.swap(runs_);
  }
  for (auto& r : runs) r->Cancel();
  for (auto& r : runs) if (r->thread.joinable()) r->thread.join();
}

void JobManager::Poke() {
  {
    std::lock_guard<std::mutex> l(mu_);
    wake_ = true;
  }
  cv_.notify_all();
}

void JobManager::Send(Outbox& out) {
  // Resolve each node's stream under the lock; commands for a node without one
  // wait in its pending queue until the agent attaches (AttachAgent flushes it).
  std::vector<std::tuple<std::string, std::shared_ptr<AgentLink>, v1::ControllerMessage>> ready;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [node, msg] : out) {
      auto it = nodes_.find(node);
      if (it == nodes_.end()) continue;
      if (it->second.link) ready.emplace_back(node, it->second.link, std::move(msg));
      else it->second.pending.push_back(std::move(msg));
    }
  }
  out.clear();
  for (auto& [node, link, msg] : ready) {
    if (link->Send(msg)) continue;
    spdlog::warn("could not send a command to node {} (stream closed); it waits for the agent to reconnect", node);
    std::lock_guard<std::mutex> l(mu_);
    auto it = nodes_.find(node);
    if (it != nodes_.end()) it->second.pending.push_back(std::move(msg));
  }
}

void JobManager::AddEvent(JobRt& rt, const v1::JobEvent& ev) {
  v1::JobEvent e = ev;
  e.set_seq(rt.next_seq++);
  e.set_time_ms(NowMs());
  if (absl::Status st = store_->PutEvent(rt.job.job_id(), e); !st.ok())
    spdlog::error("job {}: event {} kept in memory only: {}", rt.job.job_id(), e.seq(), std::string(st.message()));
  rt.events.push_back(std::move(e));
  // The newest events stay in memory for the watchers that follow the job; the store
  // has every one (WaitEvents reads older ones from it).
  if (rt.events.size() > kEventsInMemory) rt.events.erase(rt.events.begin(), rt.events.begin() + kEventsInMemory / 10);
  cv_.notify_all();
}

absl::Status JobManager::Transition(JobRt& rt, v1::JobState state, const std::string& reason) {
  v1::Job next = rt.job;
  next.set_state(state);
  next.set_reason(reason);
  next.set_updated_ms(NowMs());
  if (state == v1::JOB_STATE_RUNNING && next.started_ms() == 0) next.set_started_ms(NowMs());
  if (tessera::IsTerminal(state)) next.set_finished_ms(NowMs());
  auto st = store_->PutJob(next);  // persisted before it is acted on
  if (!st.ok()) {
    spdlog::error("cannot persist job {} -> {}: {}", rt.job.job_id(), JobStateName(state), std::string(st.message()));
    return st;
  }
  rt.job = std::move(next);
  spdlog::info("job {} attempt {}: {}{}{}", rt.job.job_id(), rt.job.attempt(), JobStateName(state),
               reason.empty() ? "" : ": ", reason);
  v1::JobEvent ev;
  ev.set_state(state);
  ev.set_reason(reason);
  ev.set_attempt(rt.job.attempt());
  AddEvent(rt, ev);
  UpdateGauges();
  if (metrics_ != nullptr && tessera::IsTerminal(state)) metrics_->ForgetJob(rt.job.job_id());
  return absl::OkStatus();
}

void JobManager::UpdateGauges() {
  if (!metrics_) return;
  std::map<v1::JobState, int> n;
  for (auto& [id, rt] : jobs_) n[rt.job.state()]++;
  for (int s = v1::JOB_STATE_PENDING; s <= v1::JOB_STATE_STOPPED; ++s)
    metrics_->SetJobsByState(JobStateName(static_cast<v1::JobState>(s)), n[static_cast<v1::JobState>(s)]);
  std::map<v1::NodeState, int> ns;
  for (auto& [id, node] : nodes_) ns[node.status.state()]++;
  for (auto s : {v1::NODE_STATE_READY, v1::NODE_STATE_LOST, v1::NODE_STATE_DRAINING}) metrics_->SetNodes(NodeStateName(s), ns[s]);
}

// ---------------------------------------------------------------- JobService

absl::StatusOr<std::pair<v1::Job, bool>> JobManager::Submit(const v1::JobSpec& spec, const std::string& submission_id) {
  std::lock_guard<std::mutex> l(mu_);
  if (!submission_id.empty()) {
    auto it = by_submission_.find(submission_id);
    if (it != by_submission_.end()) {
      const v1::Job& first = jobs_[it->second].job;
      // A retried submit is the same request; the same id with another spec is a mistake
      // the caller must hear about, not a silent return of a job it did not ask for.
      if (!google::protobuf::util::MessageDifferencer::Equals(first.spec(), spec))
        return absl::AlreadyExistsError(absl::StrCat("submission_id '", submission_id, "' was used for job ",
                                                     first.job_id(), " with a different spec; use a new submission id"));
      return std::make_pair(first, false);
    }
  }
  // A job that can never fit the cluster is refused now rather than left pending forever.
  // "The cluster" is every node registered, whatever its state (DRAINING, LOST a moment
  // ago): capacity that may come back. Right after a start, before the agents had a
  // lease's time to register again, nothing is known yet: the job waits instead.
  const bool settled = Settled();
  auto fits = Place(spec, NodeViews(/*include_used=*/true, /*registered=*/true), /*only_free=*/false);
  if (!fits.ok() && settled)
    return absl::Status(fits.status().code(), absl::StrCat("the job can never fit this cluster: ", fits.status().message()));
  TESSERA_RETURN_IF_ERROR(CheckPlanFits(spec, SmallestDeviceMemory(spec)));
  JobRt rt;
  std::string id;
  do {
    id = absl::StrCat(spec.name(), "-", RandomHex(3));
  } while (jobs_.count(id));
  rt.job.set_job_id(id);
  rt.job.set_submission_id(submission_id);
  *rt.job.mutable_spec() = spec;
  rt.job.set_created_ms(NowMs());
  TESSERA_RETURN_IF_ERROR(Transition(rt, v1::JOB_STATE_PENDING, "waiting to be scheduled"));
  if (!submission_id.empty()) by_submission_[submission_id] = id;
  job_order_.push_back(id);
  auto& stored = jobs_.emplace(id, std::move(rt)).first->second;
  if (metrics_) metrics_->IncSubmitted();
  wake_ = true;
  cv_.notify_all();
  return std::make_pair(stored.job, true);
}

absl::StatusOr<v1::Job> JobManager::GetJob(const std::string& job_id) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
  return it->second.job;
}

v1::Job JobSummary(const v1::Job& j) {
  v1::Job out = j;
  out.clear_result_json();
  out.clear_assignments();
  v1::JobSpec spec;
  spec.set_name(j.spec().name());
  spec.set_kind(j.spec().kind());
  *spec.mutable_groups() = j.spec().groups();
  spec.set_max_restarts(j.spec().max_restarts());
  *out.mutable_spec() = std::move(spec);
  return out;
}

absl::StatusOr<JobManager::JobPage> JobManager::ListJobs(const std::set<v1::JobState>& states, int limit,
                                                         const std::string& page_token) {
  constexpr size_t kPageBytes = 4 << 20;  // well under the control plane's message cap
  if (limit <= 0) limit = 100;
  limit = std::min(limit, 1000);
  std::lock_guard<std::mutex> l(mu_);
  auto it = job_order_.rbegin();
  if (!page_token.empty()) {
    it = std::find(job_order_.rbegin(), job_order_.rend(), page_token);
    if (it == job_order_.rend())
      return absl::InvalidArgumentError(absl::StrCat("page_token: '", page_token, "' is not a job of this controller"));
    ++it;
  }
  JobPage page;
  size_t bytes = 0;
  for (; it != job_order_.rend(); ++it) {
    const auto& j = jobs_[*it].job;
    if (!states.empty() && !states.count(j.state())) continue;
    if (static_cast<int>(page.jobs.size()) >= limit || bytes > kPageBytes) {
      page.next_page_token = page.jobs.back().job_id();
      break;
    }
    page.jobs.push_back(JobSummary(j));
    bytes += page.jobs.back().ByteSizeLong();
  }
  return page;
}

absl::StatusOr<v1::Job> JobManager::Stop(const std::string& job_id, const std::string& reason) {
  Outbox out;
  v1::Job result;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
    JobRt& rt = it->second;
    std::string why = reason.empty() ? "stopped by user" : reason;
    if (tessera::IsTerminal(rt.job.state())) return rt.job;
    if (rt.job.state() == v1::JOB_STATE_PENDING || (rt.job.state() == v1::JOB_STATE_RESTARTING && !rt.tearing_down)) {
      TESSERA_RETURN_IF_ERROR(Transition(rt, v1::JOB_STATE_STOPPED, why));
    } else if (rt.tearing_down && rt.after_teardown == v1::JOB_STATE_RESTARTING) {
      // The attempt is already going down for a restart: what follows it is the stop.
      rt.after_teardown = v1::JOB_STATE_STOPPED;
      rt.after_reason = why;
      rt.teardown_root_cause_known = true;
      spdlog::info("job {} attempt {}: {} while its attempt tears down for a restart; STOPPED once its executors are gone",
                   job_id, rt.job.attempt(), why);
    } else {
      BeginTeardown(rt, v1::JOB_STATE_STOPPED, why, out, /*root_cause=*/true);
    }
    result = rt.job;
  }
  Send(out);
  Poke();
  return result;
}

bool JobManager::IsTerminal(const std::string& job_id) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = jobs_.find(job_id);
  return it == jobs_.end() || tessera::IsTerminal(it->second.job.state());
}

absl::StatusOr<std::vector<v1::JobEvent>> JobManager::WaitEvents(const std::string& job_id, int64_t from_seq,
                                                                 int64_t timeout_ms, bool* done) {
  std::unique_lock<std::mutex> l(mu_);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
    const JobRt& rt = it->second;
    const int64_t first_in_memory = rt.events.empty() ? rt.next_seq : rt.events.front().seq();
    if (from_seq + 1 < first_in_memory) {  // older than memory holds: a page from the store
      const bool terminal = tessera::IsTerminal(rt.job.state());
      const int64_t last = rt.next_seq - 1;
      l.unlock();
      TESSERA_ASSIGN_OR_RETURN(std::vector<v1::JobEvent> page, store_->LoadEvents(job_id, from_seq, kEventsPerPage));
      if (!page.empty()) {
        *done = terminal && page.back().seq() >= last;
        return page;
      }
      from_seq = first_in_memory - 1;  // none stored (writes that failed): what memory holds
      l.lock();
      continue;
    }
    std::vector<v1::JobEvent> out;
    for (const auto& e : rt.events)
      if (e.seq() > from_seq && static_cast<int64_t>(out.size()) < kEventsPerPage) out.push_back(e);
    *done = tessera::IsTerminal(rt.job.state()) && (out.empty() || out.back().seq() == rt.next_seq - 1);
    if (!out.empty() || *done) return out;
    if (stopping_) return absl::UnavailableError("the controller is shutting down; watch again once it is back");
    if (cv_.wait_until(l, deadline) == std::cv_status::timeout) return out;
  }
}

// ------------------------------------------------------------ ClusterService

v1::GetClusterStatusResponse JobManager::ClusterStatus() {
  std::lock_guard<std::mutex> l(mu_);
  v1::GetClusterStatusResponse r;
  int64_t now = MonoMs();
  for (auto& [id, n] : nodes_) {
    auto* s = r.add_nodes();
    *s = n.status;
    s->set_last_heartbeat_ms(NowMs() - (now - n.last_seen_mono));
  }
  r.set_controller_version(cfg_.version);
  r.set_time_ms(NowMs());
  for (auto& [id, rt] : jobs_) (*r.mutable_jobs_by_state())[JobStateName(rt.job.state())]++;
  return r;
}

absl::StatusOr<v1::NodeStatus> JobManager::Drain(const std::string& node_id, bool move_jobs, bool undo) {
  Outbox out;
  v1::NodeStatus status;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = nodes_.find(node_id);
    if (it == nodes_.end()) return absl::NotFoundError(absl::StrCat("node '", node_id, "' not found"));
    NodeRt& n = it->second;
    if (undo && move_jobs) return absl::InvalidArgumentError("drain: move_jobs and undo exclude each other");
    if (undo) {
      if (n.leaving)
        return absl::FailedPreconditionError(absl::StrCat("node '", node_id, "' is leaving (its agent is shutting down); ",
                                                          "it is schedulable again when its agent registers anew"));
      n.cordoned = false, n.evacuating = false;
      if (n.status.state() == v1::NODE_STATE_DRAINING) n.status.set_state(v1::NODE_STATE_READY);
      spdlog::info("node {} is schedulable again", node_id);
      wake_ = true;
      cv_.notify_all();
    } else {
      n.cordoned = true;
      if (n.status.state() == v1::NODE_STATE_READY) n.status.set_state(v1::NODE_STATE_DRAINING);
      if (move_jobs) Evacuate(node_id, "was drained", out);
      else spdlog::info("node {} drained: placing nothing more there", node_id);
    }
    UpdateGauges();
    status = n.status;
  }
  Send(out);
  return status;
}

// ---------------------------------------------------------------- NodeService

absl::Status JobManager::RegisterNode(const v1::RegisterNodeRequest& req) {
  Outbox out;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto known = incarnations_.find(req.node_id());
    if (known != incarnations_.end() && req.incarnation() < known->second)
      return absl::FailedPreconditionError(absl::StrCat("node '", req.node_id(), "' registered with incarnation ",
                                                        req.incarnation(), " but incarnation ", known->second,
                                                        " is already known; a stale agent is refused"));
    bool new_incarnation = known == incarnations_.end() || req.incarnation() != known->second;
    if (new_incarnation) {
      TESSERA_RETURN_IF_ERROR(store_->PutNodeIncarnation(req.node_id(), req.incarnation()));
      incarnations_[req.node_id()] = req.incarnation();
    }
    NodeRt& n = nodes_[req.node_id()];
    if (new_incarnation && n.leaving) {  // the agent that left came back (a new pod, say)
      n.leaving = false, n.evacuating = n.cordoned && n.evacuating;
      if (n.status.state() == v1::NODE_STATE_DRAINING && !n.cordoned) n.status.set_state(v1::NODE_STATE_READY);
    }
    bool was_lost = n.status.state() == v1::NODE_STATE_LOST;
    n.status.set_node_id(req.node_id());
    n.status.set_hostname(req.hostname());
    n.status.set_address(req.address());
    n.status.set_incarnation(req.incarnation());
    n.status.set_version(req.version());
    if (n.cordoned) n.status.set_state(v1::NODE_STATE_DRAINING);  // drained by an admin: until undone
    else if (n.status.state() != v1::NODE_STATE_DRAINING || was_lost) n.status.set_state(v1::NODE_STATE_READY);
    n.status.clear_devices();
    for (const auto& d : req.devices()) *n.status.add_devices() = d;
    n.last_seen_mono = MonoMs();
    // Executors the agent no longer runs have exited (a new incarnation runs none of
    // the old ones); executors it runs that belong to no live attempt are stopped.
    std::set<std::tuple<std::string, int, int>> running;
    for (const auto& r : req.running()) running.insert({r.job_id(), r.attempt(), r.executor()});
    for (auto& [id, rt] : jobs_) {
      for (auto& [x, e] : rt.execs) {
        if (e.node_id != req.node_id() || e.state == ExecState::kExited) continue;
        if (!running.count({id, rt.job.attempt(), x})) {
          spdlog::warn("job {} executor {} is gone from node {} (agent re-registered)", id, x, req.node_id());
          if (!rt.tearing_down)
            BeginTeardown(rt, v1::JOB_STATE_RESTARTING, absl::StrCat("executor ", x, " on node ", req.node_id(),
                                                           " was lost when its agent restarted"), out, true);
          MarkExited(rt, x);
        }
      }
    }
    for (const auto& r : req.running()) {
      auto it = jobs_.find(r.job_id());
      bool live = it != jobs_.end() && it->second.job.attempt() == r.attempt() &&
                  LiveAttempt(it->second.job.state(), it->second.tearing_down);
      if (!live) {
        v1::ControllerMessage m;
        m.mutable_stop()->set_job_id(r.job_id());
        m.mutable_stop()->set_attempt(r.attempt());
        m.mutable_stop()->set_grace_ms(cfg_.stop_grace_ms);
        n.pending.push_back(m);  // sent once the agent attaches its stream
      }
    }
    UpdateStaleDevices(n, req.running());
    // Devices whose executors have not exited stay used (also after a controller restart).
    for (auto& [id, rt] : jobs_)
      for (const auto& a : rt.job.assignments()) {
        auto ex = rt.execs.find(a.executor());
        if (a.node_id() != req.node_id() || ex == rt.execs.end() || ex->second.state == ExecState::kExited) continue;
        for (auto& d : *n.status.mutable_devices())
          if (d.index() == a.device_index() && d.type() == a.device_type()) {
            d.set_used_by_job(id);
            d.set_used_by_executor(a.executor());
          }
      }
    UpdateGauges();
    spdlog::info("node {} registered (incarnation {}, {} devices, {} running executors)", req.node_id(),
                 req.incarnation(), req.devices_size(), req.running_size());
  }
  Send(out);
  Poke();
  return absl::OkStatus();
}

absl::Status JobManager::AttachAgent(const std::string& node_id, int64_t incarnation, std::shared_ptr<AgentLink> link) {
  Outbox out;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = nodes_.find(node_id);
    if (it == nodes_.end() || it->second.status.incarnation() != incarnation)
      return absl::FailedPreconditionError(absl::StrCat("node '", node_id, "' incarnation ", incarnation,
                                                        " is not registered; call RegisterNode first"));
    it->second.link = link;
    it->second.last_seen_mono = MonoMs();
    for (auto& m : it->second.pending) out.emplace_back(node_id, m);
    it->second.pending.clear();
    // Re-send stops for attempts being torn down on this node (the old stream may have lost them).
    for (auto& [id, rt] : jobs_) {
      if (!rt.tearing_down) continue;
      for (auto& [x, e] : rt.execs) {
        if (e.node_id != node_id || e.state == ExecState::kExited) continue;
        v1::ControllerMessage m;
        m.mutable_stop()->set_job_id(id);
        m.mutable_stop()->set_attempt(rt.job.attempt());
        m.mutable_stop()->set_grace_ms(cfg_.stop_grace_ms);
        out.emplace_back(node_id, m);
        break;
      }
    }
  }
  Send(out);
  return absl::OkStatus();
}

void JobManager::DetachAgent(const std::string& node_id, const AgentLink* link) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = nodes_.find(node_id);
  if (it != nodes_.end() && it->second.link.get() == link) it->second.link.reset();
}

absl::Status JobManager::OnHeartbeat(const std::string& node_id, int64_t incarnation, const v1::Heartbeat& hb) {
  Outbox out;
  absl::Status st = ApplyHeartbeat(node_id, incarnation, hb, out);
  Send(out);
  return st;
}

absl::Status JobManager::ApplyHeartbeat(const std::string& node_id, int64_t incarnation, const v1::Heartbeat& hb,
                                         Outbox& out) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return absl::FailedPreconditionError(absl::StrCat("node '", node_id, "' is not registered"));
  if (it->second.status.incarnation() != incarnation)
    return absl::FailedPreconditionError(absl::StrCat("node '", node_id, "' was registered again by another agent (incarnation ",
                                                      it->second.status.incarnation(), "); this agent (incarnation ",
                                                      incarnation, ") no longer owns it — is a second tessera-worker "
                                                      "running with the same --node-id?"));
  // A node declared lost (its agent stalled, or the network dropped) whose agent speaks
  // again: its executors were written off and their jobs moved on. It registers anew
  // (the stream ends with this error; the agent re-registers at once), reporting what it
  // still runs, and what belongs to no live attempt is stopped (RegisterNode).
  if (it->second.status.state() == v1::NODE_STATE_LOST)
    return absl::FailedPreconditionError(absl::StrCat("node '", node_id, "' was declared lost (no heartbeat for over ",
                                                      cfg_.lease_ttl_ms / 1000.0, " s); register again"));
  it->second.last_seen_mono = MonoMs();
  UpdateStaleDevices(it->second, hb.running());
  if (metrics_) metrics_->SetLeaseAge(node_id, 0);
  if (hb.leaving() && !it->second.leaving) {
    it->second.leaving = true;
    Evacuate(node_id, "is leaving", out);
  }
  return absl::OkStatus();
}

void JobManager::Evacuate(const std::string& node_id, const std::string& why, Outbox& out) {
  NodeRt& n = nodes_[node_id];
  n.evacuating = true;
  if (n.status.state() == v1::NODE_STATE_READY) n.status.set_state(v1::NODE_STATE_DRAINING);
  UpdateGauges();
  int asked = 0, torn = 0;
  for (auto& [id, rt] : jobs_) {
    if (rt.tearing_down || tessera::IsTerminal(rt.job.state()) || !OnEvacuatedNode(rt)) continue;
    const std::string& kind = rt.job.spec().kind();
    const bool saves = kind == "pretrain" || kind == "sft" || kind == "grpo" || kind == "ppo";  // DriverContext::preempt
    if (rt.driver && rt.job.state() == v1::JOB_STATE_RUNNING && saves) {
      rt.driver->preempt = true;  // the driver saves at its next step and returns
      ++asked;
    } else {
      BeginTeardown(rt, v1::JOB_STATE_RESTARTING, absl::StrCat("node ", node_id, " ", why), out);
      ++torn;
    }
  }
  spdlog::info("node {} {}: placing nothing more there; {} jobs asked to checkpoint and move, {} restarted", node_id,
               why, asked, torn);
  wake_ = true;
  cv_.notify_all();
}

bool JobManager::OnEvacuatedNode(const JobRt& rt) {
  for (const auto& [x, e] : rt.execs) {
    auto n = nodes_.find(e.node_id);
    if (e.state != ExecState::kExited && n != nodes_.end() && n->second.evacuating) return true;
  }
  return false;
}

void JobManager::OnExecutorEvent(const std::string& node_id, const v1::ExecutorEvent& ev) {
  Outbox out;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = jobs_.find(ev.job_id());
    if (it == jobs_.end()) return;
    JobRt& rt = it->second;
    if (ev.attempt() != rt.job.attempt()) return;  // a stale attempt's news
    auto ex = rt.execs.find(ev.executor());
    if (ex == rt.execs.end() || ex->second.node_id != node_id) return;
    if (ev.phase() == v1::EXECUTOR_PHASE_STARTED) return;
    if (metrics_)
      metrics_->IncExecutorExit(ev.signal() ? "signal" : ev.phase() == v1::EXECUTOR_PHASE_FAILED_TO_START ? "start_failed"
                                : ev.exit_code() == 0 ? "ok" : "error");
    if (ex->second.state == ExecState::kExited) return;
    std::string group_ranks;
    for (const auto& a : rt.job.assignments())
      if (a.executor() == ev.executor())
        for (const auto& gr : a.ranks()) group_ranks += absl::StrCat(group_ranks.empty() ? "" : ", ", gr.group(), " rank ", gr.rank());
    std::string why = absl::StrCat("executor ", ev.executor(), " (", group_ranks, ") on node ", node_id, " ",
                                   ExitDescription(ev));
    bool failed = ev.exit_code() != 0 || ev.signal() != 0 || ev.phase() == v1::EXECUTOR_PHASE_FAILED_TO_START;
    // The executor's own log says how it ended where that was not a clean exit (a process
    // killed by a signal writes no last line of its own): `tessera job logs` shows it.
    if (failed && logs_ != nullptr)
      logs_->Append(rt.job.job_id(), rt.job.attempt(), ev.executor(), node_id,
                    {absl::StrCat("[tessera] executor ", ev.executor(), " ", ExitDescription(ev),
                                  ev.requested_stop() ? " (the job was stopping it)" : "")});
    if (!ev.requested_stop() && (!rt.tearing_down || failed)) {
      spdlog::warn("job {} attempt {}: {}", rt.job.job_id(), rt.job.attempt(), why);
      BeginTeardown(rt, v1::JOB_STATE_RESTARTING, why, out, /*root_cause=*/true);
    }
    MarkExited(rt, ev.executor());
  }
  Send(out);
  Poke();
}

void JobManager::OnLogs(const std::string& node_id, const v1::LogBatch& b) {
  // What an agent says is checked, never used as a path as it comes: the job must be one
  // of ours, the attempt one it has had, the executor one of its executors (and, for the
  // live attempt, one placed on this node).
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = jobs_.find(b.job_id());
    const bool ok = it != jobs_.end() && b.attempt() >= 1 && b.attempt() <= it->second.job.attempt() &&
                    b.executor() >= 0 && b.executor() < it->second.job.assignments_size() &&
                    (b.attempt() != it->second.job.attempt() ||
                     it->second.job.assignments(b.executor()).node_id() == node_id);
    if (!ok) {
      spdlog::warn("node {} sent logs for job '{}' attempt {} executor {}, which it does not run: dropped", node_id,
                   b.job_id().substr(0, 128), b.attempt(), b.executor());
      return;
    }
  }
  std::vector<std::string> lines(b.lines().begin(), b.lines().end());
  logs_->Append(b.job_id(), b.attempt(), b.executor(), node_id, lines);
}

// ----------------------------------------------------------- RendezvousService

absl::Status JobManager::CheckScope(const std::string& job_id, int attempt, const std::string& secret) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job '", job_id, "' not found"));
  const JobRt& rt = it->second;
  if (attempt != rt.job.attempt() || !LiveAttempt(rt.job.state(), rt.tearing_down))
    return absl::FailedPreconditionError(absl::StrCat("job '", job_id, "' attempt ", attempt,
                                                      " is stale (current attempt ", rt.job.attempt(), ", ",
                                                      JobStateName(rt.job.state()), rt.tearing_down ? ", tearing down" : "", ")"));
  if (!ConstantTimeEquals(secret, rt.secret))
    return absl::PermissionDeniedError(absl::StrCat("wrong executor secret for job '", job_id, "' attempt ", attempt));
  return absl::OkStatus();
}

absl::Status JobManager::RegisterExecutor(const std::string& job_id, int attempt, int executor,
                                          const std::string& address) {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end() || it->second.job.attempt() != attempt)
      return absl::FailedPreconditionError("stale attempt");
    auto ex = it->second.execs.find(executor);
    if (ex == it->second.execs.end())
      return absl::InvalidArgumentError(absl::StrCat("job '", job_id, "' has no executor ", executor));
    if (ex->second.state == ExecState::kLaunching) ex->second.state = ExecState::kReady;
    ex->second.address = address;
  }
  Poke();
  return absl::OkStatus();
}

// ----------------------------------------------------------------- Reconciler

void JobManager::ReconcileLoop() {
  while (true) {
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, std::chrono::milliseconds(200), [&] { return wake_ || stopping_; });
      if (stopping_) return;
      wake_ = false;
    }
    ReconcileOnce();
  }
}

void JobManager::ReconcileOnce() {
  Outbox out;
  {
    std::lock_guard<std::mutex> l(mu_);
    CheckLeases(out);
    FinishTeardowns();
    CheckStarting(out);
    ScheduleJobs(out);
  }
  Send(out);
  std::vector<std::shared_ptr<DriverRun>> done;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto it = runs_.begin(); it != runs_.end();) {
      if ((*it)->finished) { done.push_back(*it); it = runs_.erase(it); } else ++it;
    }
  }
  for (auto& r : done) if (r->thread.joinable()) r->thread.join();
}

void JobManager::CheckLeases(Outbox& out) {
  int64_t now = MonoMs();
  // The reconciler runs every 200 ms. A longer gap means this process did not run (a GC
  // or VM pause, SIGSTOP): the agents' heartbeats could not be taken meanwhile, so the
  // time stalled does not count against their leases, nor against start deadlines.
  const int64_t gap = last_lease_check_mono_ > 0 ? now - last_lease_check_mono_ : 0;
  last_lease_check_mono_ = now;
  if (gap > std::max<int64_t>(2000, cfg_.lease_ttl_ms / 2)) {
    spdlog::warn("the controller did not run for {:.1f} s (paused?): node leases and start deadlines are extended by that",
                 gap / 1000.0);
    for (auto& [id, n] : nodes_) n.last_seen_mono += gap;
    for (auto& [id, rt] : jobs_) if (rt.start_deadline_ms > 0) rt.start_deadline_ms += gap;
  }
  for (auto& [id, n] : nodes_) {
    if (metrics_) metrics_->SetLeaseAge(id, (now - n.last_seen_mono) / 1000.0);
    if (n.status.state() == v1::NODE_STATE_LOST || now - n.last_seen_mono <= cfg_.lease_ttl_ms) continue;
    spdlog::warn("node {} missed its lease ({} ms without a heartbeat): lost", id, now - n.last_seen_mono);
    n.status.set_state(v1::NODE_STATE_LOST);
    n.link.reset();
    for (auto& [jid, rt] : jobs_) {
      bool hit = false;
      for (auto& [x, e] : rt.execs) {
        if (e.node_id != id || e.state == ExecState::kExited) continue;
        if (!hit && !rt.tearing_down)
          BeginTeardown(rt, v1::JOB_STATE_RESTARTING, absl::StrCat("node ", id, " was lost (no heartbeat for ",
                                                         cfg_.lease_ttl_ms / 1000.0, " s) with executor ", x, " on it"), out, true);
        hit = true;
        MarkExited(rt, x);
      }
    }
    for (auto& d : *n.status.mutable_devices()) { d.clear_used_by_job(); d.set_used_by_executor(0); }
    UpdateGauges();
  }
}

void JobManager::UpdateStaleDevices(NodeRt& n, const google::protobuf::RepeatedPtrField<v1::RunningExecutor>& running) {
  n.stale_devices.clear();
  for (const auto& r : running) {
    auto it = jobs_.find(r.job_id());
    bool owned = false;
    if (it != jobs_.end() && it->second.job.attempt() == r.attempt()) {
      auto ex = it->second.execs.find(r.executor());
      owned = ex != it->second.execs.end() && ex->second.state != ExecState::kExited;
    }
    if (!owned) n.stale_devices.insert({r.device_type(), r.device_index()});
  }
}

bool JobManager::Settled() {
  if (MonoMs() - started_mono_ > 2 * cfg_.lease_ttl_ms) return true;
  for (const auto& [id, inc] : incarnations_) {
    auto it = nodes_.find(id);
    if (it == nodes_.end() || it->second.status.incarnation() != inc) return false;  // not back yet
  }
  return true;
}

int64_t JobManager::SmallestDeviceMemory(const v1::JobSpec& spec) {
  if (spec.groups_size() == 0) return 0;
  const v1::DeviceType type = spec.groups(0).device_type();
  int64_t least = 0;
  for (const auto& [id, n] : nodes_)
    for (const auto& d : n.status.devices())
      if (d.type() == type && d.memory_bytes() > 0 && (least == 0 || d.memory_bytes() < least)) least = d.memory_bytes();
  return least;
}

std::vector<NodeView> JobManager::NodeViews(bool include_used, bool registered) {
  std::vector<NodeView> views;
  for (auto& [id, n] : nodes_) {
    NodeView v;
    v.node_id = id;
    v.schedulable = registered || n.status.state() == v1::NODE_STATE_READY;
    for (const auto& d : n.status.devices())
      v.devices.push_back({d.type(), d.index(),
                           include_used || (d.used_by_job().empty() && !n.stale_devices.count({d.type(), d.index()}))});
    views.push_back(std::move(v));
  }
  return views;
}

void JobManager::SetDevicesUsed(const JobRt& rt, bool used) {
  for (const auto& a : rt.job.assignments()) {
    auto it = nodes_.find(a.node_id());
    if (it == nodes_.end()) continue;
    for (auto& d : *it->second.status.mutable_devices()) {
      if (d.index() != a.device_index() || d.type() != a.device_type()) continue;
      if (used) { d.set_used_by_job(rt.job.job_id()); d.set_used_by_executor(a.executor()); }
      else if (d.used_by_job() == rt.job.job_id()) { d.clear_used_by_job(); d.set_used_by_executor(0); }
    }
  }
}

void JobManager::ScheduleJobs(Outbox& out) {
  int64_t now = MonoMs();
  for (const auto& id : job_order_) {
    JobRt& rt = jobs_[id];
    bool restart_due = rt.job.state() == v1::JOB_STATE_RESTARTING && !rt.tearing_down && now >= rt.restart_at_ms;
    if (rt.job.state() != v1::JOB_STATE_PENDING && !restart_due) continue;
    auto placed = Place(rt.job.spec(), NodeViews(false), /*only_free=*/true);
    if (!placed.ok()) {
      std::string reason = absl::StrCat("Unschedulable: ", placed.status().message());
      if (!Place(rt.job.spec(), NodeViews(true, true), /*only_free=*/false).ok())
        reason += " (more than the registered nodes have: it waits for nodes to join)";
      if (rt.job.state() == v1::JOB_STATE_PENDING && rt.job.reason() != reason) (void)Transition(rt, v1::JOB_STATE_PENDING, reason);
      continue;  // FIFO with backfill: smaller later jobs may still fit
    }
    rt.job.set_attempt(rt.job.attempt() + 1);
    rt.job.clear_assignments();
    for (auto& a : *placed) *rt.job.add_assignments() = a;
    rt.secret = RandomHex(24);
    rt.execs.clear();
    if (!Transition(rt, v1::JOB_STATE_PLACING, absl::StrCat("placed ", placed->size(), " executors")).ok()) continue;
    SetDevicesUsed(rt, true);
    for (const auto& a : rt.job.assignments()) {
      ExecRt e;
      e.node_id = a.node_id();
      rt.execs[a.executor()] = e;
      v1::ControllerMessage m;
      auto* c = m.mutable_start()->mutable_config();
      c->set_job_id(id);
      c->set_attempt(rt.job.attempt());
      c->set_executor(a.executor());
      c->set_node_id(a.node_id());
      c->set_device_type(a.device_type());
      c->set_device_index(a.device_index());
      c->set_secret(rt.secret);
      c->set_controller_address(cfg_.controller_address);
      for (const auto& r : cfg_.path_roots) c->add_path_roots(r);
      *c->mutable_spec() = rt.job.spec();
      *c->mutable_ranks() = a.ranks();
      out.emplace_back(a.node_id(), m);
    }
    rt.start_deadline_ms = now + rt.job.spec().start_timeout_ms();
    (void)Transition(rt, v1::JOB_STATE_STARTING, absl::StrCat("starting ", rt.execs.size(), " executors"));
  }
}

void JobManager::CheckStarting(Outbox& out) {
  int64_t now = MonoMs();
  for (auto& [id, rt] : jobs_) {
    if (rt.job.state() != v1::JOB_STATE_STARTING || rt.tearing_down) continue;
    std::vector<int> waiting;
    for (auto& [x, e] : rt.execs) if (e.state != ExecState::kReady) waiting.push_back(x);
    if (waiting.empty()) {
      if (Transition(rt, v1::JOB_STATE_RUNNING, "").ok()) StartDriver(rt);
    } else if (now > rt.start_deadline_ms) {
      BeginTeardown(rt, v1::JOB_STATE_RESTARTING, absl::StrCat("executors ", absl::StrJoin(waiting, ","), " did not become ready within ",
                                                     rt.job.spec().start_timeout_ms() / 1000.0, " s"), out, true);
    }
  }
}

void JobManager::StartDriver(JobRt& rt) {
  auto run = std::make_shared<DriverRun>();
  rt.driver = run;
  std::map<int, ExecutorTarget> targets;
  for (auto& [x, e] : rt.execs) targets[x] = ExecutorTarget{e.address, rt.secret, x, e.node_id};
  v1::Job snapshot = rt.job;
  run->thread = std::thread([this, run, snapshot, targets] {
    auto result = [&]() -> absl::StatusOr<std::string> {
      TESSERA_ASSIGN_OR_RETURN(DriverFn fn, drivers_(snapshot.spec().kind()));
      std::map<int, std::shared_ptr<ExecutorClient>> clients;
      for (auto& [x, target] : targets) {
        TESSERA_ASSIGN_OR_RETURN(auto c, connect_(target));
        clients[x] = c;
        std::lock_guard<std::mutex> l(run->mu);
        run->clients.push_back(c);
      }
      if (run->cancelled) return absl::CancelledError("the attempt was torn down");
      DriverContext ctx;
      ctx.job = snapshot;
      ctx.cancelled = &run->cancelled;
      ctx.preempt = &run->preempt;
      for (const auto& g : snapshot.spec().groups()) {
        std::vector<std::shared_ptr<ExecutorClient>> by_rank(g.devices());
        for (const auto& a : snapshot.assignments())
          for (const auto& gr : a.ranks())
            if (gr.group() == g.name()) by_rank[gr.rank()] = clients[a.executor()];
        const auto& pl = g.layout();
        ctx.groups[g.name()] = std::make_unique<WorkerGroup>(
            g.name(), LayoutOf(pl), by_rank,
            snapshot.spec().collective_timeout_ms() * 4 + 60000);
      }
      std::string job_id = snapshot.job_id();
      int attempt = snapshot.attempt();
      ctx.progress = [this, job_id, attempt](const v1::Progress& p) {
        std::lock_guard<std::mutex> l(mu_);
        auto it = jobs_.find(job_id);
        if (it == jobs_.end() || it->second.job.attempt() != attempt || tessera::IsTerminal(it->second.job.state())) return;
        v1::JobEvent ev;
        *ev.mutable_progress() = p;
        ev.set_attempt(attempt);
        AddEvent(it->second, ev);
        if (metrics_ != nullptr && p.step() > 0) {
          metrics_->SetJobMetric(job_id, "step", p.step());
          for (const auto& [k, v] : p.metrics()) metrics_->SetJobMetric(job_id, k, v);
        }
      };
      return fn(ctx);
    }();
    OnDriverDone(snapshot.job_id(), snapshot.attempt(), std::move(result));
    run->finished = true;
  });
  runs_.push_back(run);
}

void JobManager::OnDriverDone(const std::string& job_id, int attempt, absl::StatusOr<std::string> result) {
  Outbox out;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_) return;
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) return;
    JobRt& rt = it->second;
    rt.driver.reset();
    if (rt.job.attempt() != attempt || rt.tearing_down) {
      wake_ = true;
      cv_.notify_all();
      return;
    }
    if (result.ok()) {
      rt.job.set_result_json(*result);
      BeginTeardown(rt, v1::JOB_STATE_SUCCEEDED, "", out);
    } else {
      // Possibly a symptom (an executor died mid-call); an exit event that arrives
      // during teardown replaces this reason with the root cause.
      BeginTeardown(rt, v1::JOB_STATE_RESTARTING, absl::StrCat("driver: ", result.status().message()), out);
    }
    wake_ = true;
    cv_.notify_all();
  }
  Send(out);
}

void JobManager::BeginTeardown(JobRt& rt, v1::JobState target, const std::string& reason, Outbox& out, bool root_cause) {
  if (rt.tearing_down) {
    // Prefer the root cause: an executor's own exit over the driver's view of it.
    if (root_cause && !rt.teardown_root_cause_known && rt.after_teardown != v1::JOB_STATE_SUCCEEDED &&
        rt.after_teardown != v1::JOB_STATE_STOPPED) {
      rt.after_reason = reason;
      rt.teardown_root_cause_known = true;
      if (rt.job.state() == v1::JOB_STATE_RESTARTING) (void)Transition(rt, v1::JOB_STATE_RESTARTING, reason);
    }
    return;
  }
  rt.tearing_down = true;
  rt.teardown_root_cause_known = root_cause;
  // A node leaving (a drain, an upgrade) is no fault of the job's: its restart is free.
  rt.count_restart = !OnEvacuatedNode(rt);
  if (target == v1::JOB_STATE_RESTARTING && rt.count_restart && rt.job.restarts() >= rt.job.spec().max_restarts()) target = v1::JOB_STATE_FAILED;
  rt.after_teardown = target;
  rt.after_reason = reason;
  if (rt.driver) rt.driver->Cancel();
  rdv_->Drop({rt.job.job_id(), rt.job.attempt()});
  if (target == v1::JOB_STATE_RESTARTING) (void)Transition(rt, v1::JOB_STATE_RESTARTING, reason);
  std::set<std::string> nodes;
  for (auto& [x, e] : rt.execs) if (e.state != ExecState::kExited) nodes.insert(e.node_id);
  for (const auto& n : nodes) {
    v1::ControllerMessage m;
    m.mutable_stop()->set_job_id(rt.job.job_id());
    m.mutable_stop()->set_attempt(rt.job.attempt());
    m.mutable_stop()->set_grace_ms(cfg_.stop_grace_ms);
    out.emplace_back(n, m);
  }
  wake_ = true;
}

void JobManager::MarkExited(JobRt& rt, int executor) {
  auto it = rt.execs.find(executor);
  if (it == rt.execs.end()) return;
  it->second.state = ExecState::kExited;
  for (const auto& a : rt.job.assignments()) {
    if (a.executor() != executor) continue;
    auto n = nodes_.find(a.node_id());
    if (n == nodes_.end()) continue;
    for (auto& d : *n->second.status.mutable_devices())
      if (d.index() == a.device_index() && d.type() == a.device_type() && d.used_by_job() == rt.job.job_id()) {
        d.clear_used_by_job();
        d.set_used_by_executor(0);
      }
  }
  wake_ = true;
}

void JobManager::FinishTeardowns() {
  for (auto& [id, rt] : jobs_) {
    if (!rt.tearing_down || rt.driver) continue;  // wait for the driver thread to let go
    bool all_gone = true;
    for (auto& [x, e] : rt.execs) all_gone &= e.state == ExecState::kExited;
    if (!all_gone) continue;
    rt.tearing_down = false;
    SetDevicesUsed(rt, false);
    v1::JobState target = rt.after_teardown;
    if (target == v1::JOB_STATE_RESTARTING) {
      if (rt.count_restart) {
        rt.job.set_restarts(rt.job.restarts() + 1);
        if (metrics_) metrics_->IncRestarts();
      }
      double backoff_s = rt.job.spec().restart_backoff_s() * (1 << std::min(rt.job.restarts(), 6));
      rt.restart_at_ms = MonoMs() + std::min<int64_t>(static_cast<int64_t>(backoff_s * 1000), cfg_.max_backoff_ms);
      if (rt.job.state() == v1::JOB_STATE_RESTARTING && rt.job.reason() == rt.after_reason) {
        rt.job.set_updated_ms(NowMs());
        if (auto st = store_->PutJob(rt.job); !st.ok()) spdlog::error("cannot persist job {}: {}", id, st.ToString());
      } else {
        (void)Transition(rt, v1::JOB_STATE_RESTARTING, rt.after_reason);
      }
    } else {
      (void)Transition(rt, target, rt.after_reason);
    }
  }
}

}  // namespace tessera::controller
