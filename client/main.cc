// tessera: the command-line client.
//   tessera job submit -f JOB.yaml [--set k=v]... [--no-wait] [--submission-id ID]
//   tessera job list [--state S]... | status JOB | logs JOB [--follow] [--rank R]
//   tessera job wait JOB [--timeout S] | events JOB | stop JOB [--no-wait]
//   tessera status | node drain|undrain NODE | plan JOB.yaml
//   tessera local JOB.yaml [--cpu-slots N] [--set k=v]...
//   tessera completion bash|zsh | --version
// Global options (-o json|table, --address, ...) go before or after the subcommand.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <mutex>
#include <thread>

#include <CLI/CLI.hpp>

#include "absl/strings/str_cat.h"
#include "client/cli.h"
#include "client/plan_cmd.h"
#include "common/spec/job_paths.h"
#include "common/spec/job_spec.h"
#include "common/logging.h"
#include "common/util.h"
#include "common/version.h"
#include "client/completion.h"
#include "controller/controller.h"
#include "worker/agent/agent.h"

namespace {

using namespace tessera;

int Fail(const absl::Status& s) {
  std::cerr << "error: " << absl::StatusCodeToString(s.code()) << ": " << s.message() << "\n";
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

// base_dir non-empty (tessera local): relative paths in the spec are taken from it.
absl::StatusOr<v1::JobSpec> LoadSpec(const std::string& file, const std::vector<std::string>& sets,
                                     const std::string& base_dir = "") {
  auto text = ReadFile(file);
  if (!text.ok()) return absl::InvalidArgumentError(absl::StrCat("job file: ", text.status().message()));
  auto spec = ParseJobSpecYaml(*text, sets);
  if (!spec.ok()) return absl::Status(spec.status().code(), absl::StrCat(file, ": ", spec.status().message()));
  if (!base_dir.empty()) ResolveRelativePaths(*spec, base_dir);
  auto st = NormalizeAndValidateJobSpec(*spec);
  if (!st.ok()) return absl::Status(st.code(), absl::StrCat(file, ": ", st.message()));
  return spec;
}

int SubmitAndWait(client::Client& c, const v1::JobSpec& spec, const std::string& sid, bool wait, bool json,
                  const std::function<void(const std::string&)>& submitted = nullptr) {
  auto r = c.Submit(spec, sid);
  if (!r.ok()) return Fail(r.status());
  const auto& job = r->job();
  if (submitted) submitted(job.job_id());
  std::cerr << (r->created() ? "submitted " : "already submitted as ") << job.job_id() << "\n";
  if (!wait) {
    std::cout << job.job_id() << "\n";
    return 0;
  }
  auto final_job = c.Watch(job.job_id(), std::cerr);
  if (!final_job.ok()) return Fail(final_job.status());
  if (json) client::PrintJob(*final_job, true, std::cout);
  else if (!final_job->result_json().empty()) client::PrintCommCheckTable(final_job->result_json(), std::cout);
  std::cerr << "job " << final_job->job_id() << " " << JobStateName(final_job->state())
            << (final_job->reason().empty() ? "" : ": " + final_job->reason()) << "\n";
  return final_job->state() == v1::JOB_STATE_SUCCEEDED ? 0 : 1;
}

// `tessera local`'s signals: the first SIGINT or SIGTERM stops the job through the
// controller (its executors stop, the watch sees STOPPED) and the run exits 130; a second
// one exits at once (the next run marks what was left STOPPED; nothing is resumed).
class LocalInterrupts {
 public:
  // Before any thread starts: they inherit the blocked mask, and one thread takes the signals.
  LocalInterrupts() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGINT);
    sigaddset(&set_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set_, nullptr);
    std::thread([this] {
      int sig = 0, count = 0;
      while (sigwait(&set_, &sig) == 0) {
        if (++count > 1) {
          std::cerr << "\ninterrupted again: exiting without waiting for the job to stop\n";
          std::_Exit(130);
        }
        std::function<void()> stop;
        {
          std::lock_guard<std::mutex> l(mu_);
          interrupted_ = true;
          stop = stop_;
        }
        std::cerr << "\ninterrupted: stopping the job (again to exit at once)\n";
        if (stop) stop();
      }
    }).detach();
  }
  // What the first signal does once the job exists (before: the run ends after submitting).
  void OnInterrupt(std::function<void()> stop) {
    bool now = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = stop;
      now = interrupted_;
    }
    if (now) stop();
  }
  bool interrupted() {
    std::lock_guard<std::mutex> l(mu_);
    return interrupted_;
  }

 private:
  sigset_t set_;
  std::mutex mu_;
  bool interrupted_ = false;
  std::function<void()> stop_;
};

int RunLocal(const std::string& file, const std::vector<std::string>& sets, int cpu_slots, std::string state_dir,
             bool json, bool gpus) {
  LocalInterrupts interrupts;
  // A local run may name paths under the working directory and the state directory;
  // relative ones are taken from the working directory.
  const std::string cwd = std::filesystem::current_path().string();
  auto spec = LoadSpec(file, sets, cwd);
  if (!spec.ok()) return Fail(spec.status());
  if (state_dir.empty()) state_dir = absl::StrCat("/tmp/tessera-local-", getuid());
  if (cpu_slots <= 0) {
    for (const auto& g : spec->groups())
      if (g.device_type() == v1::DEVICE_TYPE_CPU && g.colocate_with().empty()) cpu_slots += g.devices();
  }
  controller::ControllerOptions co;
  co.state_dir = state_dir;
  co.path_roots = {cwd, state_dir};
  co.listen = "127.0.0.1:0";
  co.advertise = "";
  co.stop_unfinished_jobs = true;  // an earlier run's leftovers are never resumed beside this job
  auto ctl = controller::Controller::Start(co);
  if (!ctl.ok()) return Fail(ctl.status());
  agent::AgentOptions ao;
  ao.controller = (*ctl)->address().substr(0, 0) + absl::StrCat("127.0.0.1:", (*ctl)->port());
  ao.ca_cert_path = state_dir + "/ca.crt";
  ao.join_token = (*ctl)->join_token();
  ao.node_id = "local";
  ao.cpu_slots = cpu_slots;
  ao.use_gpus = gpus;
  ao.work_dir = state_dir + "/worker";
  ao.listen_host = "127.0.0.1";
  auto ag = agent::Agent::Create(ao);
  if (!ag.ok()) return Fail(ag.status());
  if (auto st = (*ag)->Start(); !st.ok()) return Fail(st);
  for (int i = 0; i < 200 && !(*ag)->registered(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  client::ClientConfig cc;
  cc.address = absl::StrCat("127.0.0.1:", (*ctl)->port());
  cc.token = (*ctl)->admin_token();
  cc.ca_pem = (*ctl)->ca_pem();
  auto cl = client::Client::Connect(cc);
  if (!cl.ok()) return Fail(cl.status());
  client::Client* c = cl->get();
  int rc = SubmitAndWait(*c, *spec, "", true, json, [&](const std::string& job_id) {
    interrupts.OnInterrupt([c, job_id] {
      if (auto j = c->Stop(job_id, "interrupted (Ctrl-C) in tessera local"); !j.ok())
        std::cerr << "could not stop job " << job_id << ": " << j.status().message() << "\n";
    });
  });
  (*ag)->Shutdown();
  (*ctl)->Shutdown();
  return interrupts.interrupted() ? 130 : rc;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tessera: submit and watch jobs on a Tessera cluster"};
  app.require_subcommand(1);
  app.fallthrough();  // the global options after a subcommand too (`tessera job list -o json`)
  app.set_version_flag("--version", std::string(tessera::kVersion));
  std::string address, token, ca, config, output = "table", level = "warn";
  bool insecure = false;
  app.add_option("--address", address, "controller host:port (TESSERA_ADDRESS)");
  app.add_option("--token", token, "bearer token (TESSERA_TOKEN)");
  app.add_option("--ca-cert", ca, "controller CA certificate (TESSERA_CA_CERT)");
  app.add_option("--config", config, "client config file written by the controller (TESSERA_CONFIG)");
  app.add_flag("--insecure-loopback", insecure, "plaintext to a loopback controller");
  app.add_option("-o,--output", output, "table|json")->check(CLI::IsMember({"table", "json"}));
  app.add_option("--log-level", level);

  auto* job = app.add_subcommand("job", "jobs");
  job->require_subcommand(1);
  std::string file, sid, job_id;
  std::vector<std::string> sets;
  bool no_wait = false, follow = false;
  int rank = -1, attempt = 0, limit = 100;
  auto* submit = job->add_subcommand("submit", "submit a job and stream its progress until it ends");
  submit->add_option("-f,--file", file, "job file (YAML)")->required();
  submit->add_option("--set", sets, "override a job-file key: dotted.key=value (repeatable)");
  submit->add_flag("--no-wait", no_wait, "print the job id and return");
  submit->add_option("--submission-id", sid, "idempotency key: resubmitting returns the same job");
  auto* list = job->add_subcommand("list", "list jobs (newest first)");
  list->add_option("--limit", limit, "at most this many (0: all)");
  std::vector<std::string> states;
  list->add_option("--state", states, "only jobs in this state (repeatable: PENDING, RUNNING, SUCCEEDED, FAILED, ...)");
  auto* status = job->add_subcommand("status", "show one job");
  status->add_option("job", job_id)->required();
  auto* logs = job->add_subcommand("logs", "print a job's executor logs");
  logs->add_option("job", job_id)->required();
  logs->add_flag("--follow", follow, "keep printing until the job ends");
  logs->add_option("--rank", rank, "executor index (default: all)");
  logs->add_option("--attempt", attempt, "attempt (default: all)");
  auto* stop = job->add_subcommand("stop", "stop a job and wait until it has stopped");
  stop->add_option("job", job_id)->required();
  stop->add_flag("--no-wait", no_wait, "return once the stop is asked for");
  double timeout_s = 0;
  stop->add_option("--timeout", timeout_s, "seconds to wait for it to stop (default: no limit)");
  auto* wait = job->add_subcommand("wait", "wait until a job ends; exit 0 if it succeeded");
  wait->add_option("job", job_id)->required();
  wait->add_option("--timeout", timeout_s, "seconds to wait (default: no limit; then exit 124)");
  auto* events = job->add_subcommand("events", "print a job's events and progress from its start, following until it ends");
  events->add_option("job", job_id)->required();
  auto* completion = app.add_subcommand("completion", "print a shell completion script (bash or zsh)");
  std::string shell;
  completion->add_option("shell", shell, "bash or zsh")->required()->check(CLI::IsMember({"bash", "zsh"}));
  auto* cluster = app.add_subcommand("status", "nodes, devices free/used, versions");
  auto* node = app.add_subcommand("node", "nodes (admin)");
  node->require_subcommand(1);
  std::string node_id;
  bool move_jobs = false;
  auto* drain = node->add_subcommand("drain", "place nothing more on a node (until undrained)");
  drain->add_option("node", node_id)->required();
  drain->add_flag("--move-jobs", move_jobs,
                  "also move its jobs now: training jobs save a checkpoint and resume elsewhere");
  auto* undrain = node->add_subcommand("undrain", "make a drained node schedulable again");
  undrain->add_option("node", node_id)->required();
  auto* plan = app.add_subcommand("plan", "per-rank memory and communication of a training job's layout");
  int plan_devices = 0;
  std::string plan_memory;
  plan->add_option("file", file, "job file (YAML)")->required();
  plan->add_option("--set", sets, "override a job-file key (repeatable)");
  plan->add_option("--devices", plan_devices, "also propose layouts of this many devices ...");
  plan->add_option("--memory", plan_memory, "... that fit this much memory per device (e.g. 80GiB)");
  auto* local = app.add_subcommand("local", "run controller and agent in this process and run one job");
  int cpu_slots = 0;
  std::string state_dir;
  bool no_gpus = false;
  local->add_option("file", file, "job file (YAML)")->required();
  local->add_option("--set", sets, "override a job-file key (repeatable)");
  local->add_option("--cpu-slots", cpu_slots, "CPU devices (default: what the job needs)");
  local->add_option("--state-dir", state_dir, "state directory (default /tmp/tessera-local-UID)");
  local->add_flag("--no-gpus", no_gpus, "do not offer GPUs");
  CLI11_PARSE(app, argc, argv);
  tessera::InitLogging("tessera", level);
  bool json = output == "json";

  if (*completion) {
    std::cout << tessera::client::CompletionScript(app, "tessera", shell);
    return 0;
  }
  if (*local) return RunLocal(file, sets, cpu_slots, state_dir, json, !no_gpus);
  if (*plan) {  // relative paths as `tessera local` takes them (plan reads none but model.hf_dir)
    auto spec = LoadSpec(file, sets, std::filesystem::current_path().string());
    if (!spec.ok()) return Fail(spec.status());
    int64_t memory = 0;
    if (!plan_memory.empty()) {
      auto m = tessera::ParseBytes(plan_memory);
      if (!m.ok()) return Fail(absl::InvalidArgumentError(absl::StrCat("--memory: ", m.status().message())));
      memory = *m;
    }
    return tessera::client::RunPlan(*spec, plan_devices, memory, json, std::cout);
  }

  auto cfg = tessera::client::ResolveConfig(address, token, ca, config, insecure);
  if (!cfg.ok()) return Fail(cfg.status());
  auto c = tessera::client::Client::Connect(*cfg);
  if (!c.ok()) return Fail(c.status());
  if (*submit) {
    auto spec = LoadSpec(file, sets);
    if (!spec.ok()) return Fail(spec.status());
    return SubmitAndWait(**c, *spec, sid, !no_wait, json);
  }
  if (*list) {
    std::vector<tessera::v1::JobState> want;
    for (const std::string& s : states) {
      auto st = tessera::client::ParseJobState(s);
      if (!st.ok()) return Fail(st.status());
      want.push_back(*st);
    }
    auto jobs = (*c)->List(limit, want);
    if (!jobs.ok()) return Fail(jobs.status());
    tessera::client::PrintJobs(*jobs, json, std::cout, tessera::NowMs());
    return 0;
  }
  // A job's end as `job wait` and `job stop` print it: the state (and reason), or the job
  // with -o json; exit 0 for SUCCEEDED (stop: for STOPPED too), 1 otherwise.
  auto print_end = [&](const tessera::v1::Job& j) {
    if (json) tessera::client::PrintJob(j, true, std::cout);
    else std::cout << j.job_id() << " " << tessera::JobStateName(j.state()) << (j.reason().empty() ? "" : ": " + j.reason()) << "\n";
  };
  const int64_t timeout_ms = static_cast<int64_t>(timeout_s * 1000);
  // The exit status of a wait that did not end the job's way: 124 past --timeout.
  auto wait_failed = [](const absl::Status& st) {
    if (st.code() != absl::StatusCode::kDeadlineExceeded) return Fail(st);
    std::cerr << "error: " << st.message() << "\n";
    return 124;
  };
  if (*wait) {
    auto j = (*c)->WaitDone(job_id, timeout_ms);
    if (!j.ok()) return wait_failed(j.status());
    print_end(*j);
    return j->state() == tessera::v1::JOB_STATE_SUCCEEDED ? 0 : 1;
  }
  if (*events) {
    auto j = (*c)->Watch(job_id, std::cout);
    if (!j.ok()) return Fail(j.status());
    return j->state() == tessera::v1::JOB_STATE_SUCCEEDED ? 0 : 1;
  }
  if (*status) {
    auto j = (*c)->Get(job_id);
    if (!j.ok()) return Fail(j.status());
    tessera::client::PrintJob(*j, json, std::cout);
    return 0;
  }
  if (*logs) {
    auto st = (*c)->Logs(job_id, rank, attempt, follow, std::cout);
    return st.ok() ? 0 : Fail(st);
  }
  if (*stop) {
    auto j = (*c)->Stop(job_id, "");
    if (!j.ok()) return Fail(j.status());
    if (!no_wait && !tessera::IsTerminal(j->state())) {
      auto done = (*c)->WaitDone(job_id, timeout_ms);
      if (!done.ok()) return wait_failed(done.status());
      j = done;
    }
    print_end(*j);
    return j->state() == tessera::v1::JOB_STATE_STOPPED || j->state() == tessera::v1::JOB_STATE_SUCCEEDED || no_wait ? 0 : 1;
  }
  if (*drain || *undrain) {
    auto n = (*c)->Drain(node_id, move_jobs, static_cast<bool>(*undrain));
    if (!n.ok()) return Fail(n.status());
    std::cout << n->node_id() << " " << tessera::NodeStateName(n->state())
              << (*drain && move_jobs ? " (its jobs are moving)" : "") << "\n";
    return 0;
  }
  if (*cluster) {
    auto s = (*c)->Status();
    if (!s.ok()) return Fail(s.status());
    tessera::client::PrintCluster(*s, json, std::cout);
    return 0;
  }
  return 2;
}
