#include "tests/integration/cluster.h"

#include "gtest/gtest.h"
#include "absl/strings/str_split.h"

#include <iostream>
#include <sstream>

#include <filesystem>

#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/spec/job_spec.h"
#include "common/util.h"

extern char** environ;

namespace tessera::testing {

bool Proc::Start(const std::vector<std::string>& argv, const std::string& log_path) {
  std::vector<char*> a;
  for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  int rc = posix_spawn(&pid_, a[0], &fa, nullptr, a.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) pid_ = -1;
  return rc == 0;
}

void Proc::Kill(int sig) {
  if (pid_ > 0) ::kill(pid_, sig);
}

int Proc::Wait(int timeout_ms) {
  if (pid_ <= 0) return 0;
  for (int i = 0; i <= timeout_ms / 10; ++i) {
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      return st;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

// The port of address `key` in the JSON file `path` (a daemon writes it atomically once
// it listens), waiting up to 10 s for it; -1 if it never appears.
int PublishedPort(const std::string& path, const std::string& key) {
  for (int i = 0; i < 1000; ++i) {
    auto text = ReadFile(path);
    if (text.ok()) {
      auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains(key) && j[key].is_string()) {
        const std::string addr = j[key];
        return std::stoi(addr.substr(addr.rfind(':') + 1));
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

std::string HttpGet(int port, const std::string& path, const std::string& token) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) { close(fd); return ""; }
  std::string req = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n" +
                    (token.empty() ? "" : "Authorization: Bearer " + token + "\r\n") + "\r\n";
  (void)!write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  return out;
}

Cluster::Cluster(ClusterOptions o) : o_(o) {
  dir_ = "/tmp/tessera-it-" + RandomHex(4);
  (void)MakeDirs(dir_ + "/controller", 0700);
  admin_token_ = RandomHex(16);
  read_token_ = RandomHex(16);
  (void)WriteFileAtomic(secrets_dir() + "/tokens",  // the harness's tokens in place of any made before
                        absl::StrCat("admin admin ", admin_token_, "\nread viewer ", read_token_, "\n"), 0600);
}

// After a failed test: the last lines of every daemon's and executor's log, so that a
// failure on a CI machine (whose test directory is gone afterwards) can be diagnosed.
void DumpLogTails(const std::string& dir) {
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec); !ec && it != std::filesystem::end(it);
       it.increment(ec)) {
    if (!it->is_regular_file() || it->path().extension() != ".log") continue;
    auto text = ReadFile(it->path().string());
    if (!text.ok()) continue;
    std::vector<std::string> lines = absl::StrSplit(*text, '\n');
    const size_t from = lines.size() > 25 ? lines.size() - 25 : 0;
    std::cout << "---- " << it->path().string() << " (last " << lines.size() - from << " lines)\n";
    for (size_t i = from; i < lines.size(); ++i) std::cout << lines[i] << "\n";
  }
}

Cluster::~Cluster() {
  client_.reset();
  if (::testing::Test::HasFailure()) DumpLogTails(dir_);
  for (auto& a : agents_) if (a) { a->Kill(SIGTERM); a->Wait(3000); }
  agents_.clear();
  controller_.reset();
  if (!getenv("TESSERA_KEEP_TEST_DIRS")) system(("rm -rf " + dir_).c_str());
}

std::string Cluster::address() const { return absl::StrCat("127.0.0.1:", port_); }
std::string Cluster::secrets_dir() const { return o_.secrets_dir.empty() ? dir_ + "/controller" : o_.secrets_dir; }
std::string Cluster::ca_pem() const { return *ReadFile(secrets_dir() + "/ca.crt"); }
std::string Cluster::agent_work_dir(int i) const { return absl::StrCat(dir_, "/agent", i); }
int Cluster::controller_metrics_port() const { return PublishedPort(dir_ + "/controller/admin.conf", "metrics_address"); }
int Cluster::agent_metrics_port() const { return PublishedPort(agent_work_dir(0) + "/endpoints.json", "metrics"); }
int Cluster::agent_health_port() const { return PublishedPort(agent_work_dir(0) + "/endpoints.json", "health"); }
int Cluster::controller_dashboard_port() const { return PublishedPort(dir_ + "/controller/admin.conf", "dashboard_address"); }
int Cluster::controller_health_port() const { return PublishedPort(dir_ + "/controller/admin.conf", "health_address"); }

absl::Status Cluster::StartController() {
  controller_ = std::make_unique<Proc>();
  std::string conf = dir_ + "/controller/admin.conf";
  unlink(conf.c_str());
  std::vector<std::string> argv = {std::string(TESSERA_BIN_DIR) + "/tessera-controller",
                                   "--state-dir", dir_ + "/controller",
                                   "--listen", absl::StrCat("127.0.0.1:", port_),
                                   "--lease-ttl", absl::StrCat(o_.lease_s),
                                   "--metrics-listen", "127.0.0.1:0",
                                   "--health-listen", "127.0.0.1:0",
                                   "--dashboard-listen", "127.0.0.1:0",
                                   "--path-root", dir_};
  if (!o_.secrets_dir.empty()) argv.insert(argv.end(), {"--secrets-dir", o_.secrets_dir});
  if (!controller_->Start(argv, dir_ + "/controller.log")) return absl::InternalError("cannot start controller");
  for (int i = 0; i < 1000; ++i) {
    auto text = ReadFile(conf);
    if (text.ok()) {
      auto j = nlohmann::json::parse(*text);
      std::string addr = j["address"];
      port_ = std::stoi(addr.substr(addr.rfind(':') + 1));
      client::ClientConfig cc{address(), admin_token_, ca_pem(), false};
      auto c = client::Client::Connect(cc);
      if (!c.ok()) return c.status();
      client_ = std::move(*c);
      return absl::OkStatus();
    }
    if (controller_->Wait(0) != -1) return absl::InternalError("controller exited; see " + dir_ + "/controller.log");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return absl::DeadlineExceededError("controller did not write admin.conf");
}

absl::Status Cluster::StartAgent(int i, const std::string& controller, const std::vector<std::string>& extra) {
  if (static_cast<int>(agents_.size()) <= i) agents_.resize(i + 1);
  agents_[i] = std::make_unique<Proc>();
  std::vector<std::string> argv = {std::string(TESSERA_BIN_DIR) + "/tessera-worker",
                                   "--controller", controller.empty() ? address() : controller,
                                   "--ca-cert", secrets_dir() + "/ca.crt",
                                   "--join-token-file", secrets_dir() + "/join-token",
                                   "--node-id", absl::StrCat("n", i),
                                   "--cpu-slots", absl::StrCat(o_.cpu_slots),
                                   "--no-gpus",
                                   "--work-dir", agent_work_dir(i),
                                   "--listen-host", "127.0.0.1"};
  if (i == 0) {
    for (const char* s : {"--metrics-listen", "127.0.0.1:0", "--health-listen", "127.0.0.1:0"}) argv.push_back(s);
  }
  argv.insert(argv.end(), extra.begin(), extra.end());
  if (!agents_[i]->Start(argv, absl::StrCat(dir_, "/agent", i, ".log"))) return absl::InternalError("cannot start agent");
  return absl::OkStatus();
}

absl::Status Cluster::WaitNodes(int ready, int timeout_ms) {
  for (int i = 0; i < timeout_ms / 20; ++i) {
    auto s = client_->Status();
    if (s.ok()) {
      int n = 0;
      for (auto& node : s->nodes()) n += node.state() == v1::NODE_STATE_READY;
      if (n >= ready) return absl::OkStatus();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat(ready, " nodes did not become ready"));
}

absl::StatusOr<std::unique_ptr<client::Client>> Cluster::ClientWithToken(const std::string& token) {
  return client::Client::Connect({address(), token, ca_pem(), false});
}

absl::StatusOr<v1::Job> Cluster::WaitState(const std::string& job, v1::JobState s, int timeout_ms) {
  v1::Job last;
  for (int i = 0; i < timeout_ms / 20; ++i) {
    auto j = client_->Get(job);
    if (j.ok()) {
      last = *j;
      if (j->state() == s) return *j;
      if (IsTerminal(j->state())) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError(absl::StrCat("job ", job, " is ", JobStateName(last.state()), " (", last.reason(),
                                                  "), not ", JobStateName(s)));
}

std::vector<pid_t> Cluster::ExecutorPids(const std::string& job, int attempt) {
  std::vector<pid_t> out;
  std::string needle = absl::StrCat("/jobs/", job, "/attempt-", attempt, "/executor-");
  DIR* d = opendir("/proc");
  while (dirent* e = readdir(d)) {
    pid_t pid = atoi(e->d_name);
    if (pid <= 0) continue;
    std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"));
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (cmd.find(needle) != std::string::npos && cmd.find("executor") != std::string::npos) out.push_back(pid);
  }
  closedir(d);
  return out;
}

v1::JobSpec CommCheckSpec(int devices, int tp, int pp, int max_restarts, int iters) {
  auto s = ParseJobSpecYaml(absl::StrCat(
      "name: cc\nkind: comm-check\nrestart_backoff_s: 0.2\nmax_restarts: ", max_restarts,
      "\ncollective_timeout_s: 20\ngroups:\n  - name: workers\n    devices: ", devices, "\n    layout: {tp: ", tp,
      ", pp: ", pp, "}\ncomm_check:\n  sizes: [4KiB, 64KiB]\n  iters: ", iters, "\n"));
  (void)NormalizeAndValidateJobSpec(*s);
  return *s;
}

v1::JobSpec PretrainSpec(int devices, int tp, int zero, int steps, bool sp, int cp, int pp) {
  auto s = ParseJobSpecYaml(absl::StrCat(
      "name: pt\nkind: pretrain\ncollective_timeout_s: 30\ngroups:\n  - name: actor\n    devices: ", devices,
      "\n    layout: {tp: ", tp, ", cp: ", cp, ", pp: ", pp, ", zero: ", zero, ", sp: ", sp ? "true" : "false",
      "}\nmodel: {vocab_size: 256, hidden: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2, ffn: 48, seq_len: 16,\n"
      "        global_batch: 8, micro_batch: 2, qkv_bias: true}\n"
      "train: {steps: ",
      steps, ", lr: 1.0e-2, min_lr: 1.0e-3, warmup_steps: 1, seed: 5, init_std: 0.1}\n"));
  (void)NormalizeAndValidateJobSpec(*s);
  return *s;
}

std::unique_ptr<Cluster> Up(ClusterOptions o) {
  auto c = std::make_unique<Cluster>(o);
  EXPECT_TRUE(c->StartController().ok());
  for (int i = 0; i < o.agents; ++i) EXPECT_TRUE(c->StartAgent(i).ok());
  EXPECT_TRUE(c->WaitNodes(o.agents, 20000).ok());
  return c;
}

std::string Submit(Cluster& c, const v1::JobSpec& spec) {
  auto r = c.client().Submit(spec, "");
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->job().job_id() : "";
}

// Waits until the job runs and returns its executor pids.
std::vector<pid_t> RunningExecutors(Cluster& c, const std::string& id, int attempt, size_t n) {
  std::vector<pid_t> pids;
  for (int i = 0; i < 1500 && pids.size() < n; ++i) {
    pids = Cluster::ExecutorPids(id, attempt);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(c.WaitState(id, v1::JOB_STATE_RUNNING, 30000).ok());
  return pids;
}

bool StartOneNode(Cluster& c) {
  return c.StartController().ok() && c.StartAgent(0).ok() && c.WaitNodes(1, 20000).ok();
}

v1::Job RunJob(Cluster& c, const v1::JobSpec& spec, std::string* progress) {
  auto r = c.client().Submit(spec, "");
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return v1::Job();
  std::ostringstream out;
  auto job = c.client().Watch(r->job().job_id(), out);
  EXPECT_TRUE(job.ok()) << job.status();
  if (progress != nullptr) *progress = out.str();
  return job.ok() ? *job : v1::Job();
}

std::vector<std::map<std::string, double>> LinesWith(const std::string& progress, const std::string& key) {
  std::vector<std::map<std::string, double>> out;
  for (absl::string_view line : absl::StrSplit(progress, '\n')) {
    if (line.find(absl::StrCat(" ", key, "=")) == absl::string_view::npos) continue;
    std::map<std::string, double> m;
    for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      const size_t eq = word.find('=');
      if (eq == absl::string_view::npos || eq == 0) continue;
      try {
        m[std::string(word.substr(0, eq))] = std::stod(std::string(word.substr(eq + 1)));
      } catch (const std::exception&) {  // not a number: not a metric
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

v1::JobSpec SmallRlSpec(const std::string& kind) {
  v1::JobSpec spec = PretrainSpec(2, 1, 0, 3);
  spec.set_kind(kind);
  spec.mutable_train()->mutable_data()->set_digits(1);
  spec.mutable_rl()->set_prompts_per_step(4);
  spec.mutable_rl()->set_eval_problems(10);
  if (kind == "ppo") {
    spec.mutable_rl()->set_group_size(2);
    spec.mutable_rl()->set_kl_reward_coef(0.05);
  } else {
    spec.mutable_rl()->set_group_size(4);
    spec.mutable_rl()->set_kl_coef(0.01);
    spec.mutable_rl()->set_entropy_coef(0.05);
  }
  return spec;
}

}  // namespace tessera::testing
