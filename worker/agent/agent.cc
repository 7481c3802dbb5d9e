#include "worker/agent/agent.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_util.h"
#include "common/status.h"
#include "common/util.h"
#include "common/version.h"
#include "worker/agent/devices.h"

extern char** environ;

namespace tessera::agent {

absl::StatusOr<std::unique_ptr<Agent>> Agent::Create(AgentOptions o) {
  if (o.node_id.empty()) {
    char h[256] = {0};
    gethostname(h, sizeof(h) - 1);
    o.node_id = h;
  }
  if (!IsSafeName(o.node_id))
    return absl::InvalidArgumentError(absl::StrCat("--node-id '", o.node_id, "': must be 1-253 characters of letters, ",
                                                   "digits, '-', '_' and '.', starting with a letter or digit"));
  if (o.executor_binary.empty()) o.executor_binary = SelfExeDir() + "/tessera-worker";
  if (access(o.executor_binary.c_str(), X_OK) != 0)
    return absl::NotFoundError(absl::StrCat("executor binary ", o.executor_binary, " is not executable"));
  if (o.join_token.empty()) return absl::InvalidArgumentError("a join token is required (--join-token or --join-token-file)");
  std::unique_ptr<Agent> a(new Agent(o));
  if (!o.insecure) {
    auto ca = ReadFile(o.ca_cert_path);
    if (!ca.ok()) return absl::InvalidArgumentError(absl::StrCat("CA certificate: ", ca.status().message()));
    a->ca_pem_ = *ca;
  }
  TESSERA_RETURN_IF_ERROR(MakeDirs(o.work_dir, 0700));
  TESSERA_ASSIGN_OR_RETURN(const bool tightened, TightenPrivateDir(o.work_dir, "--work-dir"));  // it keeps the node's key
  if (tightened) spdlog::warn("--work-dir {} was open to other users; its mode is now 0700", o.work_dir);
  // A restarted agent must register with a larger incarnation than the one before it,
  // even if the wall clock stepped back in between (NTP, or a host whose clock was
  // ahead): the clock in microseconds, but past the last one used in this work dir
  // (kept there).
  const std::string inc_file = o.work_dir + "/incarnation";
  int64_t last = 0;
  if (auto text = ReadFile(inc_file); text.ok()) (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &last);
  a->incarnation_ = std::max<int64_t>((NowMs() + o.clock_skew_ms) * 1000 + getpid() % 1000, last + 1);
  TESSERA_RETURN_IF_ERROR(WriteFileAtomic(inc_file, absl::StrCat(a->incarnation_, "\n"), 0600));
  a->devices_ = DiscoverDevices(o.cpu_slots, o.use_gpus);
  if (a->devices_.empty()) return absl::InvalidArgumentError("this node has no devices: no GPUs found and --cpu-slots is 0");
  return a;
}

Agent::~Agent() { Shutdown(); }

absl::Status Agent::Start() {
  exits_ = &prometheus::BuildCounter().Name("tessera_agent_executor_exits_total")
                .Help("Executor exits by how they ended (ok, error, signal)").Register(*registry_);
  running_ = &prometheus::BuildGauge().Name("tessera_agent_executors_running").Help("Executors running")
                  .Register(*registry_).Add({});
  registered_gauge_ = &prometheus::BuildGauge().Name("tessera_agent_registered")
                           .Help("1 while registered with the controller").Register(*registry_).Add({});
  registrations_ = &prometheus::BuildCounter().Name("tessera_agent_registrations_total")
                        .Help("Successful registrations (re-registrations after losing the controller included)")
                        .Register(*registry_).Add({});
  heartbeat_rtt_ = &prometheus::BuildHistogram().Name("tessera_agent_heartbeat_rtt_seconds")
                        .Help("Heartbeat round trip to the controller").Register(*registry_)
                        .Add({}, prometheus::Histogram::BucketBoundaries{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1});
  // Port 0 in either address asks the kernel for a port; the ports actually bound are
  // logged and written to <work-dir>/endpoints.json ({"metrics": host:port, "health": ...}).
  nlohmann::json endpoints = nlohmann::json::object();
  if (!opts_.metrics_listen.empty()) {
    try {
      exposer_ = std::make_unique<prometheus::Exposer>(opts_.metrics_listen);
      exposer_->RegisterCollectable(registry_);
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", opts_.metrics_listen, ": ", e.what()));
    }
    const auto ports = exposer_->GetListeningPorts();
    if (ports.empty()) return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", opts_.metrics_listen));
    endpoints["metrics"] = WithPort(opts_.metrics_listen, ports.front());
  }
  if (!opts_.health_listen.empty()) {
    int port = 0;
    TESSERA_ASSIGN_OR_RETURN(health_, StartHealthServer(opts_.health_listen, &port));
    health_->GetHealthCheckService()->SetServingStatus(kAgentLivenessService, true);
    endpoints["health"] = WithPort(opts_.health_listen, port);
  }
  if (!endpoints.empty()) {
    for (auto& [what, where] : endpoints.items()) spdlog::info("agent serving {} on {}", what, where.get<std::string>());
    TESSERA_RETURN_IF_ERROR(WriteFileAtomic(opts_.work_dir + "/endpoints.json", endpoints.dump(2) + "\n", 0644));
  } else {
    unlink((opts_.work_dir + "/endpoints.json").c_str());  // none from an earlier run with other flags
  }
  runner_ = std::thread([this] { Run(); });
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  return absl::OkStatus();
}

void Agent::SetRegistered(bool r) {
  registered_ = r;
  if (registered_gauge_) registered_gauge_->Set(r ? 1 : 0);
  if (r && registrations_) registrations_->Increment();
  if (health_) health_->GetHealthCheckService()->SetServingStatus("", r);  // readiness; liveness stays
}

void Agent::Shutdown() {
  if (stop_.exchange(true)) return;
  if (health_) health_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  {
    std::lock_guard<std::mutex> l(stream_mu_);
    if (ctx_) ctx_->TryCancel();
  }
  stop_cv_.notify_all();
  if (runner_.joinable()) runner_.join();
  if (heartbeat_.joinable()) heartbeat_.join();
  std::vector<std::thread> readers;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [k, e] : execs_) {
      e.requested_stop = true;
      e.sent_kill = true;
      kill(e.pid, SIGKILL);
    }
  }
  // Readers remove themselves from execs_; wait for them.
  for (int i = 0; i < 100; ++i) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (execs_.empty()) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::lock_guard<std::mutex> l(mu_);
  for (auto& t : done_readers_) if (t.joinable()) t.join();
  for (auto& [k, e] : execs_) if (e.reader.joinable()) e.reader.detach();
}

std::vector<v1::RunningExecutor> Agent::Running() {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<v1::RunningExecutor> out;
  for (auto& [k, e] : execs_) {
    v1::RunningExecutor r;
    r.set_job_id(std::get<0>(k));
    r.set_attempt(std::get<1>(k));
    r.set_executor(std::get<2>(k));
    r.set_pid(e.pid);
    r.set_device_type(e.device_type);
    r.set_device_index(e.device_index);
    out.push_back(r);
  }
  return out;
}

absl::Status Agent::RegisterOnce(v1::NodeService::Stub* stub, v1::RegisterNodeResponse* resp) {
  grpc::ClientContext ctx;
  PrepareContext(ctx, opts_.join_token, 10000);
  v1::RegisterNodeRequest req;
  req.set_node_id(opts_.node_id);
  char h[256] = {0};
  gethostname(h, sizeof(h) - 1);
  req.set_hostname(h);
  req.set_address(opts_.listen_host);
  req.set_incarnation(incarnation_);
  req.set_version(kVersion);
  for (auto& d : devices_) *req.add_devices() = d;
  for (auto& r : Running()) *req.add_running() = r;
  return FromGrpc(stub->RegisterNode(&ctx, req, resp));
}

void Agent::Run() {
  ChannelOptions co;
  co.address = opts_.controller;
  co.ca_pem = ca_pem_;
  co.insecure = opts_.insecure;
  int64_t backoff = 250;
  std::unique_ptr<v1::NodeService::Stub> stub;
  while (!stop_) {
    if (!stub) {
      // A fresh channel per attempt: a channel that saw the controller go away keeps
      // its own reconnect backoff, which would delay re-registration.
      auto ch = MakeChannel(co);
      if (!ch.ok()) {
        spdlog::error("agent: {}", std::string(ch.status().message()));
        return;
      }
      stub = v1::NodeService::NewStub(*ch);
    }
    v1::RegisterNodeResponse resp;
    auto st = RegisterOnce(stub.get(), &resp);
    if (!st.ok()) {
      // A wrong join token or a fenced (stale) incarnation will not fix itself soon.
      if (st.code() == absl::StatusCode::kUnauthenticated || st.code() == absl::StatusCode::kFailedPrecondition)
        backoff = 5000;
      spdlog::warn("agent {}: cannot register with {}: {} (retrying in {} ms)", opts_.node_id, opts_.controller,
                   st.ToString(), backoff);
      std::unique_lock<std::mutex> l(stream_mu_);
      stop_cv_.wait_for(l, std::chrono::milliseconds(backoff), [&] { return stop_.load(); });
      backoff = std::min<int64_t>(backoff * 2, 2000);
      stub.reset();
      continue;
    }
    backoff = 250;
    heartbeat_ms_ = resp.heartbeat_interval_ms() > 0 ? resp.heartbeat_interval_ms() : 2000;
    auto w1 = WriteFileAtomic(opts_.work_dir + "/node.crt", resp.node_cert_pem(), 0644);
    auto w2 = WriteFileAtomic(opts_.work_dir + "/node.key", resp.node_key_pem(), 0600);
    auto w3 = WriteFileAtomic(opts_.work_dir + "/ca.crt", resp.ca_cert_pem(), 0644);
    if (!w1.ok() || !w2.ok() || !w3.ok()) spdlog::error("agent: cannot write TLS material to {}", opts_.work_dir);
    spdlog::info("agent {}: registered with {} (incarnation {}, {} devices)", opts_.node_id, opts_.controller,
                 incarnation_, devices_.size());
    Serve(stub.get());
    SetRegistered(false);
    stub.reset();
    if (!stop_) spdlog::warn("agent {}: lost the controller stream; re-registering", opts_.node_id);
  }
}

void Agent::Serve(v1::NodeService::Stub* stub) {
  grpc::ClientContext ctx;
  PrepareContext(ctx, opts_.join_token, 0);
  auto stream = stub->Connect(&ctx);
  v1::AgentMessage hello;
  hello.mutable_hello()->set_node_id(opts_.node_id);
  hello.mutable_hello()->set_incarnation(incarnation_);
  {
    std::lock_guard<std::mutex> l(stream_mu_);
    if (stop_) return;
    if (!stream->Write(hello)) {
      auto st = stream->Finish();
      spdlog::warn("agent: Connect failed: {}", st.error_message());
      return;
    }
    ctx_ = &ctx;
    stream_ = stream.get();
    while (!pending_.empty()) {
      if (!stream->Write(pending_.front())) break;
      pending_.pop_front();
    }
  }
  SetRegistered(true);
  v1::ControllerMessage m;
  while (stream->Read(&m)) Handle(m);
  {
    std::lock_guard<std::mutex> l(stream_mu_);
    ctx_ = nullptr;
    stream_ = nullptr;
  }
  auto st = stream->Finish();
  if (!st.ok() && !stop_) spdlog::warn("agent: controller stream ended: {}", st.error_message());
}

void Agent::SendUp(const v1::AgentMessage& m, bool droppable) {
  std::lock_guard<std::mutex> l(stream_mu_);
  if (stream_ && stream_->Write(m)) return;
  if (droppable && pending_.size() > 10000) return;
  pending_.push_back(m);
}

void Agent::HeartbeatLoop() {
  while (!stop_) {
    {
      std::unique_lock<std::mutex> l(stream_mu_);
      stop_cv_.wait_for(l, std::chrono::milliseconds(heartbeat_ms_.load()),
                        [&] { return stop_.load() || beat_now_.load(); });
      if (stop_) return;
      beat_now_ = false;
    }
    if (!registered_) continue;
    v1::AgentMessage m;
    m.mutable_heartbeat()->set_time_ms(NowMs() + opts_.clock_skew_ms);
    m.mutable_heartbeat()->set_leaving(leaving_);
    for (auto& r : Running()) *m.mutable_heartbeat()->add_running() = r;
    std::lock_guard<std::mutex> l(stream_mu_);
    if (stream_) stream_->Write(m);
  }
}

int Agent::Leave(int64_t grace_ms) {
  if (!leaving_.exchange(true)) {
    spdlog::info("agent {}: leaving; waiting up to {} s for the controller to move {} executors", opts_.node_id,
                 grace_ms / 1000.0, Running().size());
    {
      std::lock_guard<std::mutex> l(stream_mu_);
      beat_now_ = true;
    }
    stop_cv_.notify_all();
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms);
  size_t left = Running().size();
  while (left > 0 && std::chrono::steady_clock::now() < deadline && !stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    left = Running().size();
  }
  if (left > 0) spdlog::warn("agent {}: {} executors still running after {} s; killing them", opts_.node_id, left, grace_ms / 1000.0);
  else spdlog::info("agent {}: no executors left; leaving", opts_.node_id);
  Shutdown();
  return static_cast<int>(left);
}

void Agent::Handle(const v1::ControllerMessage& m) {
  if (m.has_start()) StartExecutor(m.start().config());
  else if (m.has_stop()) StopExecutors(m.stop().job_id(), m.stop().attempt(), m.stop().grace_ms());
  else if (m.has_heartbeat_ack() && heartbeat_rtt_)
    heartbeat_rtt_->Observe(std::max<int64_t>(0, NowMs() + opts_.clock_skew_ms - m.heartbeat_ack().agent_time_ms()) / 1000.0);
}

void Agent::StartExecutor(const v1::ExecutorConfig& cfg) {
  Key key{cfg.job_id(), cfg.attempt(), cfg.executor()};
  auto fail = [&](const std::string& why) {
    spdlog::error("agent: executor {} of job {} attempt {} failed to start: {}", cfg.executor(), cfg.job_id(), cfg.attempt(), why);
    v1::AgentMessage m;
    auto* e = m.mutable_executor_event();
    e->set_job_id(cfg.job_id());
    e->set_attempt(cfg.attempt());
    e->set_executor(cfg.executor());
    e->set_phase(v1::EXECUTOR_PHASE_FAILED_TO_START);
    e->set_message(why);
    SendUp(m, false);
  };
  if (leaving_) return fail("the node is leaving (its agent was asked to stop)");
  {
    std::lock_guard<std::mutex> l(mu_);
    if (execs_.count(key)) return;  // already running: a re-sent command
  }
  std::string dir = absl::StrCat(opts_.work_dir, "/jobs/", cfg.job_id(), "/attempt-", cfg.attempt());
  if (auto st = MakeDirs(dir, 0700); !st.ok()) return fail(std::string(st.message()));
  v1::ExecutorConfig local = cfg;
  local.set_listen_host(opts_.listen_host);
  std::string path = absl::StrCat(dir, "/executor-", cfg.executor(), ".pb");
  if (auto st = WriteFileAtomic(path, local.SerializeAsString(), 0600); !st.ok()) return fail(std::string(st.message()));

  std::vector<std::string> args = {opts_.executor_binary, "executor", "--config", path, "--listen-host", opts_.listen_host};
  if (opts_.insecure) args.push_back("--insecure");
  else for (auto s : {"--ca-cert", "/ca.crt", "--cert", "/node.crt", "--key", "/node.key"}) args.push_back(s[0] == '/' ? opts_.work_dir + s : s);
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  for (const auto& [k, v] : cfg.spec().env()) env.push_back(k + "=" + v);
  // CPU executors share the machine's cores: each gets cores / cpu-slots BLAS threads
  // unless the job or the agent's environment says otherwise (as torchrun sets
  // OMP_NUM_THREADS for its workers) — two executors with a thread per core each spun
  // against each other (3x slower SFT steps on 2 cores, docs/operations.md).
  if (cfg.device_type() == v1::DEVICE_TYPE_CPU) {
    bool set = false;
    for (const auto& e : env) set |= absl::StartsWith(e, "OMP_NUM_THREADS=") || absl::StartsWith(e, "OPENBLAS_NUM_THREADS=");
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (!set) env.push_back(absl::StrCat("OMP_NUM_THREADS=", std::max(1, cores / std::max(1, opts_.cpu_slots))));
  }
  std::vector<char*> argv, envp;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);

  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return fail(absl::StrCat("pipe: ", strerror(errno)));
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  // The executor gets a process group of its own, so that a terminal's Ctrl-C (meant for
  // `tessera local`, which stops its job through the controller) or a signal to the
  // agent's group does not reach it behind the agent's back; and a clean signal state
  // (the agent's caller may block SIGINT/SIGTERM in its threads).
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP);
  pid_t pid = 0;
  std::lock_guard<std::mutex> l(mu_);  // held so the reader cannot reap before the entry exists
  int rc = posix_spawn(&pid, argv[0], &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    mu_.unlock();
    fail(absl::StrCat("spawn ", argv[0], ": ", strerror(rc)));
    mu_.lock();
    return;
  }
  spdlog::info("agent: started executor {} of job {} attempt {} (pid {})", cfg.executor(), cfg.job_id(), cfg.attempt(), pid);
  Exec& e = execs_[key];
  e.pid = pid;
  e.device_type = cfg.device_type();
  e.device_index = cfg.device_index();
  if (running_) running_->Increment();
  e.reader = std::thread([this, key, fd = fds[0], pid] { ReadAndReap(key, fd, pid); });
  v1::AgentMessage m;
  auto* ev = m.mutable_executor_event();
  ev->set_job_id(cfg.job_id());
  ev->set_attempt(cfg.attempt());
  ev->set_executor(cfg.executor());
  ev->set_phase(v1::EXECUTOR_PHASE_STARTED);
  ev->set_pid(pid);
  std::thread([this, m] { SendUp(m, false); }).detach();
}

namespace {
// Whether `pid`, our child, has exited (a zombie not yet reaped); it stays unreaped.
bool HasExited(pid_t pid) {
  siginfo_t info{};
  return waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid;
}
}  // namespace

void Agent::StopExecutors(const std::string& job, int attempt, int64_t grace_ms) {
  std::vector<pid_t> pids;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [k, e] : execs_)
      if (std::get<0>(k) == job && std::get<1>(k) <= attempt) {
        // One that had already exited (its reader has not reaped it yet) was not stopped
        // by this request: its exit is news — often the reason the attempt is being torn
        // down, when the driver saw its connection close first.
        e.requested_stop = e.requested_stop || !HasExited(e.pid);
        pids.push_back(e.pid);
        kill(e.pid, SIGTERM);
      }
  }
  if (pids.empty()) return;
  spdlog::info("agent: stopping {} executors of job {} attempt {}", pids.size(), job, attempt);
  std::thread([this, pids, grace_ms] {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms);
    while (std::chrono::steady_clock::now() < deadline && !stop_) {
      bool alive = false;
      {
        std::lock_guard<std::mutex> l(mu_);
        for (auto& [k, e] : execs_) for (pid_t p : pids) alive |= e.pid == p;
      }
      if (!alive) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [k, e] : execs_)
      for (pid_t p : pids)
        if (e.pid == p) {
          e.sent_kill = true;
          kill(p, SIGKILL);
        }
  }).detach();
}

namespace {
constexpr size_t kMaxLogLine = 64 << 10;  // longer executor output lines are cut to this
}  // namespace

void Agent::ReadAndReap(Key key, int fd, pid_t pid) {
  const auto& [job, attempt, executor] = key;
  std::string buf;
  char chunk[8192];
  auto flush = [&](bool all) {
    v1::AgentMessage m;
    auto* lb = m.mutable_logs();
    lb->set_job_id(job);
    lb->set_attempt(attempt);
    lb->set_executor(executor);
    size_t start = 0, nl;
    while ((nl = buf.find('\n', start)) != std::string::npos) {
      lb->add_lines(buf.substr(start, std::min(nl - start, kMaxLogLine)));
      start = nl + 1;
    }
    // A line without an end (a program printing without newlines) is cut, not buffered
    // without bound.
    if (!all && buf.size() - start > kMaxLogLine) {
      lb->add_lines(buf.substr(start, kMaxLogLine));
      start = buf.size();
    }
    if (all && start < buf.size()) { lb->add_lines(buf.substr(start, kMaxLogLine)); start = buf.size(); }
    buf.erase(0, start);
    if (lb->lines_size() > 0) SendUp(m, true);
  };
  while (true) {
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buf.append(chunk, n);
    flush(false);
  }
  flush(true);
  close(fd);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  v1::AgentMessage m;
  auto* ev = m.mutable_executor_event();
  ev->set_job_id(job);
  ev->set_attempt(attempt);
  ev->set_executor(executor);
  ev->set_phase(v1::EXECUTOR_PHASE_EXITED);
  ev->set_pid(pid);
  if (WIFSIGNALED(status)) ev->set_signal(WTERMSIG(status));
  else ev->set_exit_code(WEXITSTATUS(status));
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = execs_.find(key);
    if (it != execs_.end()) {
      // Killed by a signal this agent did not send (it sends SIGTERM to stop, SIGKILL when
      // the grace runs out): the death is news even if a stop was asked for meanwhile.
      const Exec& x = it->second;
      const bool ours = !WIFSIGNALED(status) || WTERMSIG(status) == SIGTERM || (WTERMSIG(status) == SIGKILL && x.sent_kill);
      ev->set_requested_stop(x.requested_stop && ours);
      done_readers_.push_back(std::move(it->second.reader));
      execs_.erase(it);
      if (running_) running_->Decrement();
    }
  }
  if (exits_) exits_->Add({{"how", ev->signal() ? "signal" : ev->exit_code() == 0 ? "ok" : "error"}}).Increment();
  spdlog::info("agent: executor {} of job {} attempt {} (pid {}) ended: {}", executor, job, attempt, pid,
               ev->signal() ? absl::StrCat("signal ", ev->signal()) : absl::StrCat("exit code ", ev->exit_code()));
  SendUp(m, false);
}

}  // namespace tessera::agent
