// The fault suite (docs/design.md §9): real daemons on loopback, real processes stopped
// or cut off; each test states what must happen and asserts it, including that the
// cluster goes on serving other work. (Executor and agent kills, controller restarts and
// bad input are in tests/integration/cluster_test.cc.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include <filesystem>
#include <iostream>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/util.h"
#include "tests/integration/cluster.h"

namespace tessera::testing {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

// A TCP proxy on a free loopback port forwarding to 127.0.0.1:target. Cut() closes every
// connection through it and closes new ones at once — a network partition — until Heal().
// TLS passes through untouched (the proxy only moves bytes).
class Proxy {
 public:
  explicit Proxy(int target) : target_(target) {
    listen_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listen_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    socklen_t len = sizeof(a);
    getsockname(listen_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    listen(listen_, 64);
    accept_ = std::thread([this] { AcceptLoop(); });
  }
  ~Proxy() {
    stop_ = true;
    Cut();
    accept_.join();
    close(listen_);
    std::lock_guard<std::mutex> l(mu_);
    for (auto& t : pumps_) t.join();
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  void Cut() {
    cut_ = true;
    std::lock_guard<std::mutex> l(mu_);
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);
  }
  void Heal() { cut_ = false; }

 private:
  void AcceptLoop() {
    while (!stop_) {
      pollfd p{listen_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      const int client = accept(listen_, nullptr, nullptr);
      if (client < 0) continue;
      if (cut_) {
        close(client);
        continue;
      }
      const int server = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(target_);
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (connect(server, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        close(client), close(server);
        continue;
      }
      std::lock_guard<std::mutex> l(mu_);
      fds_.push_back(client), fds_.push_back(server);
      pumps_.emplace_back([this, client, server] { Pump(client, server); });
      pumps_.emplace_back([this, client, server] { Pump(server, client); });
    }
  }
  // Moves bytes one way until either side ends; then ends both.
  void Pump(int from, int to) {
    char buf[16384];
    for (;;) {
      const ssize_t n = read(from, buf, sizeof(buf));
      if (n <= 0 || cut_) break;
      ssize_t done = 0;
      while (done < n) {
        const ssize_t w = write(to, buf + done, n - done);
        if (w <= 0) break;
        done += w;
      }
      if (done < n) break;
    }
    shutdown(from, SHUT_RDWR), shutdown(to, SHUT_RDWR);
  }

  int target_, listen_ = -1, port_ = 0;
  std::atomic<bool> stop_{false}, cut_{false};
  std::thread accept_;
  std::mutex mu_;
  std::vector<int> fds_;  // (closed when the test process ends; shut down on Cut)
  std::vector<std::thread> pumps_;
};

v1::NodeState NodeStateOf(Cluster& c, const std::string& node) {
  auto st = c.client().Status();
  if (st.ok())
    for (const auto& n : st->nodes())
      if (n.node_id() == node) return n.state();
  return v1::NodeState();
}

bool WaitFor(const std::function<bool()>& done, int timeout_ms) {
  for (int i = 0; i < timeout_ms / 20; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

// A hung peer (one executor stopped with SIGSTOP mid-training): the other rank's next
// collective times out after collective_timeout_s and the job fails with a reason that
// says so — it does not hang; the stopped executor is killed with its attempt; and the
// freed devices run the next job normally.
TEST(Faults, AHungPeerEndsInAClearFailureNotAHang) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  v1::JobSpec spec = PretrainSpec(2, 1, 0, 100000);
  spec.set_collective_timeout_ms(3000);
  spec.set_max_restarts(0);
  const std::string id = Submit(*c, spec);
  auto pids = RunningExecutors(*c, id, 1, 2);
  ASSERT_EQ(pids.size(), 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // into the steps
  const auto t0 = std::chrono::steady_clock::now();
  kill(pids[1], SIGSTOP);
  auto j = c->WaitState(id, v1::JOB_STATE_FAILED, 60000);
  ASSERT_TRUE(j.ok()) << j.status();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 30.0) << "the timeout is 3 s";
  EXPECT_THAT(j->reason(), AnyOf(HasSubstr("timed out"), HasSubstr("timeout"), HasSubstr("Timed out")));
  EXPECT_TRUE(WaitFor([&] { return Cluster::ExecutorPids(id, 1).empty(); }, 20000)) << "the stopped executor was not killed";
  auto next = c->WaitState(Submit(*c, CommCheckSpec(2, 2, 1, 0)), v1::JOB_STATE_SUCCEEDED, 60000);
  EXPECT_TRUE(next.ok()) << next.status();
}

// A network partition between the controller and one agent (a proxy the test cuts): the
// node is LOST after its lease, the job running there restarts on the other node and
// finishes; when the network heals the agent registers again (READY) and the executors
// of the abandoned attempt are stopped — nothing runs twice.
TEST(Faults, APartitionedNodeIsLostItsJobMovesAndItRejoinsWhenHealed) {
  Cluster c({.agents = 2, .cpu_slots = 2, .lease_s = 2});
  ASSERT_TRUE(c.StartController().ok());
  Proxy proxy(std::stoi(c.address().substr(c.address().rfind(':') + 1)));
  ASSERT_TRUE(c.StartAgent(1, proxy.address()).ok());  // n1, behind the proxy
  ASSERT_TRUE(c.WaitNodes(1, 20000).ok());
  v1::JobSpec spec = PretrainSpec(2, 1, 0, 400);
  spec.set_max_restarts(3);
  const std::string id = Submit(c, spec);
  ASSERT_EQ(RunningExecutors(c, id, 1, 2).size(), 2u);  // on n1, the only node
  ASSERT_TRUE(c.StartAgent(0).ok());                    // n0, direct
  ASSERT_TRUE(c.WaitNodes(2, 20000).ok());
  proxy.Cut();
  EXPECT_TRUE(WaitFor([&] { return NodeStateOf(c, "n1") == v1::NODE_STATE_LOST; }, 20000)) << "n1 was not marked LOST";
  auto j = c.WaitState(id, v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_GE(j->attempt(), 2) << "the job should have restarted on n0";
  proxy.Heal();
  EXPECT_TRUE(WaitFor([&] { return NodeStateOf(c, "n1") == v1::NODE_STATE_READY; }, 30000)) << "n1 did not rejoin";
  EXPECT_TRUE(WaitFor([&] { return Cluster::ExecutorPids(id, 1).empty(); }, 30000))
      << "the abandoned attempt's executors still run";
}

// The controller stalls past the lease (a GC or VM pause; here SIGSTOP for three
// leases): the time it did not run does not count against the agents — no node is lost
// for the controller's own stall, the running job goes on in its attempt, and the
// cluster schedules new work at once.
TEST(Faults, AControllerStalledPastTheLeaseLosesNoNodeAndSchedulesAfter) {
  Cluster c({.agents = 2, .cpu_slots = 2, .lease_s = 2});
  ASSERT_TRUE(c.StartController().ok());
  ASSERT_TRUE(c.StartAgent(0).ok());
  ASSERT_TRUE(c.StartAgent(1).ok());
  ASSERT_TRUE(c.WaitNodes(2, 20000).ok());
  const std::string id = Submit(c, PretrainSpec(2, 1, 0, 300));
  ASSERT_EQ(RunningExecutors(c, id, 1, 2).size(), 2u);
  c.controller().Kill(SIGSTOP);
  std::this_thread::sleep_for(std::chrono::seconds(7));
  c.controller().Kill(SIGCONT);
  // Every node stays READY from here on (none LOST, none asked to re-register).
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(NodeStateOf(c, "n0"), v1::NODE_STATE_READY);
    EXPECT_EQ(NodeStateOf(c, "n1"), v1::NODE_STATE_READY);
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  auto j = c.WaitState(id, v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(j->attempt(), 1) << "the job was restarted by the controller's own stall: " << j->reason();
  auto next = c.WaitState(Submit(c, CommCheckSpec(4, 2, 1, 0)), v1::JOB_STATE_SUCCEEDED, 60000);  // both nodes take work
  EXPECT_TRUE(next.ok()) << next.status();
  EXPECT_THAT(*ReadFile(c.dir() + "/controller.log"), HasSubstr("the controller did not run for"));
}

// An agent stalls past its lease (SIGSTOP for five leases; its executors are not stopped):
// its node is LOST and the job moves to the other node. When the agent runs again it is
// told to register anew, does, and the node is READY; the executors of the attempt that
// was written off stop (they notice their attempt is closed, or are stopped when the
// agent reports them) — nothing runs twice — and the node takes new work.
TEST(Faults, AnAgentStalledPastItsLeaseRejoinsAndItsFencedExecutorsStop) {
  Cluster c({.agents = 2, .cpu_slots = 2, .lease_s = 2});
  ASSERT_TRUE(c.StartController().ok());
  ASSERT_TRUE(c.StartAgent(1).ok());
  ASSERT_TRUE(c.WaitNodes(1, 20000).ok());
  v1::JobSpec spec = PretrainSpec(2, 1, 0, 400);
  spec.set_max_restarts(3);
  const std::string id = Submit(c, spec);
  ASSERT_EQ(RunningExecutors(c, id, 1, 2).size(), 2u);  // on n1
  ASSERT_TRUE(c.StartAgent(0).ok());
  ASSERT_TRUE(c.WaitNodes(2, 20000).ok());
  c.agents()[1]->Kill(SIGSTOP);
  EXPECT_TRUE(WaitFor([&] { return NodeStateOf(c, "n1") == v1::NODE_STATE_LOST; }, 20000)) << "n1 was not marked LOST";
  std::this_thread::sleep_for(std::chrono::seconds(6));
  c.agents()[1]->Kill(SIGCONT);
  EXPECT_TRUE(WaitFor([&] { return NodeStateOf(c, "n1") == v1::NODE_STATE_READY; }, 30000)) << "n1 did not come back";
  EXPECT_TRUE(WaitFor([&] { return Cluster::ExecutorPids(id, 1).empty(); }, 30000))
      << "the written-off attempt's executors still run";
  auto j = c.WaitState(id, v1::JOB_STATE_SUCCEEDED, 180000);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_GE(j->attempt(), 2);
  ASSERT_TRUE(c.client().Drain("n0", false, false).ok());  // the next job can only go to n1
  auto next = c.WaitState(Submit(c, CommCheckSpec(2, 2, 1, 0)), v1::JOB_STATE_SUCCEEDED, 60000);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->assignments(0).node_id(), "n1");
}

// A symbolic link under a path root that leads out of it (the controller's check at
// submit is lexical): the executors resolve it where they open the files and refuse it
// by field; nothing is written outside the root.
TEST(Faults, ASymlinkOutOfAPathRootIsRefusedWhereTheFilesAreOpened) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  char tmpl[] = "/tmp/tessera-outside-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string outside = tmpl;
  ASSERT_EQ(symlink(outside.c_str(), (c->dir() + "/escape").c_str()), 0);
  v1::JobSpec spec = PretrainSpec(2, 1, 0, 2);
  spec.mutable_train()->mutable_checkpoint()->set_dir(c->dir() + "/escape/ck");
  auto j = c->WaitState(Submit(*c, spec), v1::JOB_STATE_FAILED, 60000);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_THAT(j->reason(), HasSubstr("train.checkpoint.dir: '" + c->dir() + "/escape/ck' resolves to '" + outside + "/ck'"));
  EXPECT_TRUE(std::filesystem::is_empty(outside)) << "something was written outside the root";
  std::filesystem::remove_all(outside);
}

}  // namespace
}  // namespace tessera::testing

namespace tessera::testing {
namespace {

// The disk fills up during a checkpoint (the checkpoint directory on a 1 MiB tmpfs; each
// checkpoint of the test model is ~0.4 MB): the job fails naming the full disk, the
// previous checkpoint stays the latest (and whole: its metadata and shards are there),
// the failed save's partial files are gone, and the cluster runs the next job. Needs to
// mount a tmpfs (root or CAP_SYS_ADMIN); skipped, saying so, where it cannot.
TEST(Faults, ADiskFullDuringACheckpointKeepsThePreviousOneLatest) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  const std::string small = c->dir() + "/small-disk";
  ASSERT_TRUE(MakeDirs(small).ok());
  if (system(("mount -t tmpfs -o size=1m tmpfs " + small + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN)";
  struct Unmount {
    std::string dir;
    ~Unmount() { (void)!system(("umount " + dir).c_str()); }
  } unmount{small};
  v1::JobSpec spec = PretrainSpec(2, 1, 0, 8);
  spec.set_max_restarts(0);
  spec.mutable_train()->mutable_checkpoint()->set_dir(small + "/ckpt");
  spec.mutable_train()->mutable_checkpoint()->set_save_every(1);
  auto j = c->WaitState(Submit(*c, spec), v1::JOB_STATE_FAILED, 120000);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_THAT(j->reason(), HasSubstr("No space left on device"));
  auto latest = ReadFile(small + "/ckpt/latest");
  ASSERT_TRUE(latest.ok()) << "no checkpoint was committed before the disk filled";
  const std::string name(absl::StripAsciiWhitespace(*latest));
  EXPECT_TRUE(ReadFile(small + "/ckpt/" + name + "/metadata.json").ok()) << name;
  EXPECT_TRUE(ReadFile(small + "/ckpt/" + name + "/rank-00000.safetensors").ok()) << name;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(small + "/ckpt", ec))
    EXPECT_EQ(e.path().extension(), "" ) << "left behind: " << e.path();
  auto next = c->WaitState(Submit(*c, CommCheckSpec(2, 2, 1, 0)), v1::JOB_STATE_SUCCEEDED, 60000);
  EXPECT_TRUE(next.ok()) << next.status();
}

}  // namespace
}  // namespace tessera::testing

namespace tessera::testing {
namespace {

std::vector<double> Losses(const v1::Job& j) {
  auto r = nlohmann::json::parse(j.result_json(), nullptr, false);
  return r.is_discarded() || !r.contains("losses") ? std::vector<double>{} : r["losses"].get<std::vector<double>>();
}

// The job's latest reported step once it reaches `step` (read from the dashboard's API;
// gives up after ~12 s).
int64_t WaitForStep(Cluster& c, const std::string& id, int64_t want) {
  int64_t step = 0;
  for (int i = 0; i < 600 && step < want; ++i) {
    const std::string r = HttpGet(c.controller_dashboard_port(), "/api/jobs/" + id + "/events", c.read_token());
    const auto body = nlohmann::json::parse(r.substr(std::min(r.size(), r.find("\r\n\r\n") + 4)), nullptr, false);
    if (body.is_object())
      for (const auto& e : body["events"])
        if (e.contains("progress") && e["progress"].contains("step")) {
          const auto& v = e["progress"]["step"];  // int64 fields are strings in proto JSON
          step = v.is_string() ? std::stoll(v.get<std::string>()) : v.get<int64_t>();
        }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return step;
}

// The per-step losses of `spec` run to the end undisturbed (without checkpoints).
std::vector<double> UndisturbedLosses(Cluster& c, const v1::JobSpec& spec) {
  auto straight = c.WaitState(Submit(c, spec), v1::JOB_STATE_SUCCEEDED, 120000);
  EXPECT_TRUE(straight.ok()) << straight.status();
  if (!straight.ok()) return {};
  return Losses(*straight);
}

// The soak test (bounded): a CPU training job that checkpoints every 2 steps while a
// random executor of it is SIGKILLed every ~1.5 s. Each kill tears the attempt down and
// a new one resumes from the last checkpoint; the job finishes with exactly the final
// loss of the same job undisturbed (exact resume: weights, AdamW moments, data position).
// The report lists the kills survived and the restarts taken.
TEST(Faults, SoakRandomExecutorKillsEndWithTheUndisturbedFinalLoss) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  constexpr int kSteps = 300;
  v1::JobSpec spec = PretrainSpec(2, 1, 1, kSteps);
  const auto want = UndisturbedLosses(*c, spec);
  ASSERT_EQ(want.size(), size_t(kSteps));

  spec.mutable_train()->mutable_checkpoint()->set_dir(c->dir() + "/soak-ckpt");
  spec.mutable_train()->mutable_checkpoint()->set_save_every(2);
  spec.set_max_restarts(100);
  spec.set_restart_backoff_s(0.1);
  const std::string id = Submit(*c, spec);
  std::mt19937 rng(7);
  int kills = 0;
  for (int round = 0; round < 8; ++round) {
    auto job = c->client().Get(id);
    if (job.ok() && (job->state() == v1::JOB_STATE_SUCCEEDED || job->state() == v1::JOB_STATE_FAILED)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1000 + rng() % 1000));
    // Every executor process of the job, whatever its attempt.
    std::vector<pid_t> pids;
    for (int attempt = 1; attempt <= 101 && pids.empty(); ++attempt) {
      auto p = Cluster::ExecutorPids(id, attempt);
      pids.insert(pids.end(), p.begin(), p.end());
    }
    if (pids.empty()) continue;  // between attempts
    if (kill(pids[rng() % pids.size()], SIGKILL) == 0) ++kills;
  }
  auto done = c->WaitState(id, v1::JOB_STATE_SUCCEEDED, 300000);
  ASSERT_TRUE(done.ok()) << done.status();
  const auto tail = Losses(*done);
  ASSERT_FALSE(tail.empty());
  std::cout << "soak: " << kills << " executor kills survived, " << done->attempt() - 1 << " restarts taken, "
            << kSteps << " steps, final loss " << tail.back() << " (undisturbed " << want.back() << ")\n";
  EXPECT_GE(kills, 3) << "the job ended before the kills: make it longer";
  EXPECT_GE(done->attempt(), 2);
  EXPECT_EQ(tail.back(), want.back()) << "the final loss differs from the undisturbed run's";
}

// A node leaving gracefully (its agent gets SIGTERM: a Kubernetes drain, an upgrade, a
// preemption): the agent tells the controller, which places nothing more there and has
// the training job running there save a checkpoint after its current step; the attempt
// then restarts on the other node from that checkpoint — not counted against
// max_restarts (0 here) — and the job ends with exactly the undisturbed run's final loss.
// The agent exits 0 once its executors are gone, having killed none.
TEST(Faults, ALeavingNodesJobCheckpointsAndResumesElsewhere) {
  auto c = Up({.agents = 2, .cpu_slots = 2});
  constexpr int kSteps = 300;
  v1::JobSpec spec = PretrainSpec(2, 1, 1, kSteps);
  const auto want = UndisturbedLosses(*c, spec);
  ASSERT_EQ(want.size(), size_t(kSteps));

  const std::string ckpt = c->dir() + "/leave-ckpt";
  spec.mutable_train()->mutable_checkpoint()->set_dir(ckpt);
  spec.mutable_train()->mutable_checkpoint()->set_save_every(100000);  // only the leaving save and the last
  spec.set_max_restarts(0);
  const std::string id = Submit(*c, spec);
  ASSERT_TRUE(c->WaitState(id, v1::JOB_STATE_RUNNING, 60000).ok());
  const int port = c->controller_dashboard_port();
  ASSERT_GE(WaitForStep(*c, id, 20), 20);
  auto job = c->client().Get(id);
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->state(), v1::JOB_STATE_RUNNING) << "the job ended before the node left: make it longer";
  const int leaving = job->assignments(0).node_id() == "n0" ? 0 : 1;
  c->agents()[leaving]->Kill(SIGTERM);
  const int status = c->agents()[leaving]->Wait(60000);
  ASSERT_NE(status, -1) << "the agent did not leave";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const std::string log = ReadFile(absl::StrCat(c->dir(), "/agent", leaving, ".log")).value_or("");
  EXPECT_THAT(log, HasSubstr("no executors left; leaving"));

  auto done = c->WaitState(id, v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->attempt(), 2);
  EXPECT_EQ(done->restarts(), 0) << "a node leaving counted against max_restarts";
  for (const auto& a : done->assignments()) EXPECT_EQ(a.node_id(), absl::StrCat("n", 1 - leaving));
  const std::string events = HttpGet(port, "/api/jobs/" + id + "/events", c->read_token());
  EXPECT_THAT(events, HasSubstr("a node of the job is leaving or was drained: saved the checkpoint of step "));
  int saves = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(ckpt, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("step-", 0) == 0 && name != "step-00000300") {
      ++saves;
      const int n = std::stoi(name.substr(5));
      EXPECT_GE(n, 20);
      EXPECT_LT(n, kSteps);
    }
  }
  EXPECT_EQ(saves, 1) << "expected the one checkpoint saved as the node left";
  const auto tail = Losses(*done);
  ASSERT_FALSE(tail.empty());
  EXPECT_EQ(tail.back(), want.back()) << "the final loss differs from the undisturbed run's";
  auto st = c->client().Status();
  ASSERT_TRUE(st.ok());
  for (const auto& n : st->nodes())
    if (n.node_id() == absl::StrCat("n", leaving)) {
      EXPECT_NE(n.state(), v1::NODE_STATE_READY);
    }
}

// An admin drains a node (`tessera node drain N --move-jobs`): nothing more is placed
// there, and the training job running there saves after its current step and resumes on
// the other node — a restart not counted against max_restarts (0). The node stays
// drained across its agent's restart; `tessera node undrain` returns it. Bad requests are
// refused: a read token, an unknown node.
TEST(Faults, ADrainedNodesJobsMoveAndUndrainReturnsIt) {
  auto c = Up({.agents = 2, .cpu_slots = 2});
  v1::JobSpec spec = PretrainSpec(2, 1, 1, 300);
  spec.mutable_train()->mutable_checkpoint()->set_dir(c->dir() + "/drain-ckpt");
  spec.mutable_train()->mutable_checkpoint()->set_save_every(100000);
  spec.set_max_restarts(0);
  const std::string id = Submit(*c, spec);
  ASSERT_TRUE(c->WaitState(id, v1::JOB_STATE_RUNNING, 60000).ok());
  ASSERT_GE(WaitForStep(*c, id, 10), 10);
  auto job = c->client().Get(id);
  ASSERT_TRUE(job.ok());
  const std::string node = job->assignments(0).node_id(), other = node == "n0" ? "n1" : "n0";
  auto reader = c->ClientWithToken(c->read_token());
  EXPECT_EQ((*reader)->Drain(node, true, false).status().code(), absl::StatusCode::kPermissionDenied);
  auto unknown = c->client().Drain("nope", false, false);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("node 'nope' not found"));
  const std::string cli = std::string(TESSERA_BIN_DIR) + "/tessera --config " + c->dir() + "/controller/admin.conf ";
  const std::string out = c->dir() + "/drain.out";
  int rc = system((cli + "node drain " + node + " --move-jobs > " + out + " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 0) << ReadFile(out).value_or("");
  EXPECT_THAT(ReadFile(out).value_or(""), HasSubstr(node + " DRAINING (its jobs are moving)"));
  auto done = c->WaitState(id, v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->attempt(), 2);
  EXPECT_EQ(done->restarts(), 0);
  for (const auto& a : done->assignments()) EXPECT_EQ(a.node_id(), other);
  // Nothing new goes to the drained node, even after its agent restarts.
  const int agent = node == "n0" ? 0 : 1;
  c->agents()[agent]->Kill(SIGKILL);
  c->agents()[agent]->Wait(10000);
  ASSERT_TRUE(c->StartAgent(agent).ok());
  auto incarnation = [&] {
    auto st = c->client().Status();
    if (st.ok())
      for (const auto& n : st->nodes())
        if (n.node_id() == node) return std::pair{n.incarnation(), n.state()};
    return std::pair{int64_t{0}, v1::NODE_STATE_UNSPECIFIED};
  };
  const int64_t before = incarnation().first;
  for (int i = 0; i < 500 && incarnation().first == before; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_NE(incarnation().first, before) << "the agent did not register again";
  EXPECT_EQ(incarnation().second, v1::NODE_STATE_DRAINING);
  auto cc = c->WaitState(Submit(*c, CommCheckSpec(2, 2, 1, 0)), v1::JOB_STATE_SUCCEEDED, 60000);
  ASSERT_TRUE(cc.ok()) << cc.status();
  for (const auto& a : cc->assignments()) EXPECT_EQ(a.node_id(), other);
  rc = system((cli + "node undrain " + node + " > " + out + " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 0) << ReadFile(out).value_or("");
  EXPECT_THAT(ReadFile(out).value_or(""), HasSubstr(node + " READY"));
  // Both nodes take work again: four executors need both.
  auto both = c->WaitState(Submit(*c, CommCheckSpec(4, 2, 1, 0)), v1::JOB_STATE_SUCCEEDED, 60000);
  ASSERT_TRUE(both.ok()) << both.status();
  std::set<std::string> nodes;
  for (const auto& a : both->assignments()) nodes.insert(a.node_id());
  EXPECT_EQ(nodes.size(), 2u);
}

// A corrupt checkpoint (one byte of a shard flipped after the job ends): a job resuming
// from it fails naming the file and the SHA-256 mismatch — it does not train on garbage —
// and the next job runs normally.
TEST(Faults, ACorruptCheckpointIsRefusedByName) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  v1::JobSpec spec = PretrainSpec(2, 1, 0, 4);
  spec.mutable_train()->mutable_checkpoint()->set_dir(c->dir() + "/ckpt");
  ASSERT_TRUE(c->WaitState(Submit(*c, spec), v1::JOB_STATE_SUCCEEDED, 120000).ok());
  const std::string shard = c->dir() + "/ckpt/step-00000004/rank-00000.safetensors";
  auto bytes = ReadFile(shard);
  ASSERT_TRUE(bytes.ok());
  std::string flipped = *bytes;
  flipped[flipped.size() / 2] ^= 0x5a;
  ASSERT_TRUE(WriteFileAtomic(shard, flipped).ok());
  spec.mutable_train()->set_steps(8);
  spec.set_max_restarts(0);
  auto j = c->WaitState(Submit(*c, spec), v1::JOB_STATE_FAILED, 120000);
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_THAT(j->reason(), HasSubstr("rank-00000.safetensors: SHA-256 mismatch"));
  auto next = c->WaitState(Submit(*c, CommCheckSpec(2, 2, 1, 0)), v1::JOB_STATE_SUCCEEDED, 60000);
  EXPECT_TRUE(next.ok()) << next.status();
}

// Two agents claim the same node id (a second tessera-worker started by mistake): the
// newer registration (the larger incarnation) owns the node; the older agent's stream is
// ended at its next heartbeat with the reason, and its registrations are refused; the
// node is listed once, and jobs run on it.
TEST(Faults, ADuplicateAgentRegistrationIsFenced) {
  Cluster c({.agents = 2, .cpu_slots = 2});
  ASSERT_TRUE(c.StartController().ok());
  ASSERT_TRUE(c.StartAgent(0).ok());
  ASSERT_TRUE(c.WaitNodes(1, 20000).ok());
  // A second agent process that also calls itself n0 (its own work dir).
  Proc twin;
  ASSERT_TRUE(twin.Start({std::string(TESSERA_BIN_DIR) + "/tessera-worker", "--controller", c.address(), "--ca-cert",
                          c.dir() + "/controller/ca.crt", "--join-token-file", c.dir() + "/controller/join-token",
                          "--node-id", "n0", "--cpu-slots", "2", "--no-gpus", "--work-dir", c.dir() + "/twin",
                          "--listen-host", "127.0.0.1"},
                         c.dir() + "/twin.log"));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  auto st = c.client().Status();
  ASSERT_TRUE(st.ok());
  int n0 = 0;
  for (const auto& n : st->nodes()) n0 += n.node_id() == "n0";
  EXPECT_EQ(n0, 1);
  auto j = c.WaitState(Submit(c, CommCheckSpec(2, 2, 1, 0)), v1::JOB_STATE_SUCCEEDED, 60000);
  EXPECT_TRUE(j.ok()) << j.status();
  // The first agent learns at its next heartbeat that it was fenced off, says why, and
  // its attempts to register again with its older incarnation are refused.
  EXPECT_TRUE(WaitFor([&] {
    return ReadFile(c.dir() + "/agent0.log").value_or("").find("was registered again by another agent") != std::string::npos;
  }, 10000)) << ReadFile(c.dir() + "/agent0.log").value_or("");
  EXPECT_TRUE(WaitFor([&] { return ReadFile(c.dir() + "/agent0.log").value_or("").find("cannot register") != std::string::npos; },
                      10000));
  twin.Kill(SIGTERM);
  twin.Wait(3000);
}

}  // namespace
}  // namespace tessera::testing

namespace tessera::testing {
namespace {

// Clock skew: an agent whose clock is an hour ahead of the controller's joins and runs
// jobs (leases are measured on the controller's own monotonic clock, not from the
// agent's timestamps); and when it restarts with a clock an hour *behind* its last run
// (a host whose clock was stepped back), it still registers — its incarnation continues
// from the one it used last (kept in its work dir) instead of going back with the
// clock, which the controller would refuse as a stale agent.
TEST(Faults, ClockSkewNeitherLosesNodesNorLocksOutARestartedAgent) {
  Cluster c({.agents = 1, .cpu_slots = 2, .lease_s = 2});
  ASSERT_TRUE(c.StartController().ok());
  ASSERT_TRUE(c.StartAgent(0, "", {"--clock-skew-ms", "3600000"}).ok());
  ASSERT_TRUE(c.WaitNodes(1, 20000).ok());
  auto j = c.WaitState(Submit(c, CommCheckSpec(2, 2, 1, 0)), v1::JOB_STATE_SUCCEEDED, 60000);
  ASSERT_TRUE(j.ok()) << j.status();
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));  // past a lease
  EXPECT_EQ(NodeStateOf(c, "n0"), v1::NODE_STATE_READY);
  auto incarnation = [&] {
    auto st = c.client().Status();
    if (st.ok())
      for (const auto& n : st->nodes())
        if (n.node_id() == "n0" && n.state() == v1::NODE_STATE_READY) return n.incarnation();
    return int64_t{0};
  };
  const int64_t before = incarnation();
  c.agents()[0]->Kill(SIGTERM);
  c.agents()[0]->Wait(5000);
  ASSERT_TRUE(c.StartAgent(0, "", {"--clock-skew-ms", "-3600000"}).ok());
  EXPECT_TRUE(WaitFor([&] { return incarnation() > before; }, 20000)) << ReadFile(c.dir() + "/agent0.log").value_or("");
  EXPECT_EQ(ReadFile(c.dir() + "/agent0.log").value_or("").find("a stale agent is refused"), std::string::npos);
  auto k = c.WaitState(Submit(c, CommCheckSpec(2, 2, 1, 0)), v1::JOB_STATE_SUCCEEDED, 60000);
  EXPECT_TRUE(k.ok()) << k.status();
}

}  // namespace
}  // namespace tessera::testing
