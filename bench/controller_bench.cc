// Controller benchmark (runs here, on CPU):
//  1. N simulated agents (default 1000) register and heartbeat at 1 Hz over their
//     Connect streams against one real tessera-controller (TLS); each heartbeat's
//     round trip is timed to its ack. Reports p50/p99/max and the controller's CPU.
//  2. submit -> RUNNING latency of an 8-executor comm-check job on 2 real agents
//     (4 CPU slots each), measured by the client, repeated.
// Usage: controller_bench [--agents N] [--seconds S] [--jobs J]
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <sstream>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/cli.h"
#include "common/rpc/grpc_util.h"
#include "common/spec/job_spec.h"
#include "common/util.h"
#include "tessera/v1/node_service.grpc.pb.h"

extern char** environ;
using namespace tessera;

namespace {

pid_t Spawn(const std::vector<std::string>& argv, const std::string& log) {
  std::vector<char*> a;
  for (auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  posix_spawn(&pid, a[0], &fa, nullptr, a.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  return pid;
}

double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto p = s.rfind(')');
  std::istringstream f(s.substr(p + 2));
  std::string tok;
  long ut = 0, st = 0;
  for (int i = 3; i <= 15; ++i) {
    f >> tok;
    if (i == 14) ut = std::stol(tok);
    if (i == 15) st = std::stol(tok);
  }
  return static_cast<double>(ut + st) / sysconf(_SC_CLK_TCK);
}

double Pct(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

}  // namespace

int main(int argc, char** argv) {
  int agents = 1000, seconds = 20, jobs = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--agents") agents = atoi(argv[i + 1]);
    else if (k == "--seconds") seconds = atoi(argv[i + 1]);
    else if (k == "--jobs") jobs = atoi(argv[i + 1]);
  }
  std::string bin = SelfExeDir();
  std::string dir = "/tmp/tessera-bench-" + RandomHex(4);
  (void)MakeDirs(dir + "/controller", 0700);
  pid_t ctl = Spawn({bin + "/tessera-controller", "--state-dir", dir + "/controller", "--listen", "127.0.0.1:0",
                     "--lease-ttl", "10", "--log-level", "warn"}, dir + "/controller.log");
  std::string conf;
  for (int i = 0; i < 500 && conf.empty(); ++i) {
    auto t = ReadFile(dir + "/controller/admin.conf");
    if (t.ok()) conf = *t;
    else std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto j = nlohmann::json::parse(conf);
  std::string addr = j["address"], token = j["token"], ca = *ReadFile(dir + "/controller/ca.crt");
  std::string join = std::string(absl::StripAsciiWhitespace(*ReadFile(dir + "/controller/join-token")));

  // ---- 1. simulated agents ----
  const int kChannels = 8;
  std::vector<std::shared_ptr<grpc::Channel>> chans;
  for (int c = 0; c < kChannels; ++c) {
    ChannelOptions o;
    o.address = addr;
    o.ca_pem = ca;
    grpc::ChannelArguments args;
    chans.push_back(*MakeChannel(o));
  }
  std::atomic<bool> measuring{false}, stop{false};
  std::atomic<int> connected{0}, failures{0};
  std::mutex mu;
  std::vector<double> rtts;
  std::vector<std::thread> threads;
  for (int a = 0; a < agents; ++a) {
    threads.emplace_back([&, a] {
      auto stub = v1::NodeService::NewStub(chans[a % kChannels]);
      v1::RegisterNodeRequest req;
      req.set_node_id(absl::StrCat("sim-", a));
      req.set_address("127.0.0.1");
      req.set_incarnation(1);
      auto* d = req.add_devices();
      d->set_type(v1::DEVICE_TYPE_GPU);  // real CPU jobs never land on simulated nodes
      v1::RegisterNodeResponse resp;
      grpc::ClientContext rc;
      PrepareContext(rc, join, 60000);
      if (!stub->RegisterNode(&rc, req, &resp).ok()) { failures++; return; }
      grpc::ClientContext ctx;
      PrepareContext(ctx, join, 0);
      auto stream = stub->Connect(&ctx);
      v1::AgentMessage hello;
      hello.mutable_hello()->set_node_id(req.node_id());
      hello.mutable_hello()->set_incarnation(1);
      stream->Write(hello);
      connected++;
      // Spread the agents over the second.
      std::this_thread::sleep_for(std::chrono::milliseconds((a * 997) % 1000));
      auto next = std::chrono::steady_clock::now();
      while (!stop) {
        v1::AgentMessage hb;
        hb.mutable_heartbeat()->set_time_ms(NowMs());
        auto t0 = std::chrono::steady_clock::now();
        if (!stream->Write(hb)) { failures++; break; }
        v1::ControllerMessage m;
        bool got = false;
        while (stream->Read(&m)) if (m.has_heartbeat_ack()) { got = true; break; }
        if (!got) { failures++; break; }
        double rtt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (measuring) {
          std::lock_guard<std::mutex> l(mu);
          rtts.push_back(rtt);
        }
        next += std::chrono::seconds(1);
        std::this_thread::sleep_until(next);
      }
      ctx.TryCancel();
    });
  }
  for (int i = 0; i < 600 && connected + failures < agents; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::this_thread::sleep_for(std::chrono::seconds(2));
  double cpu0 = CpuSeconds(ctl);
  auto w0 = std::chrono::steady_clock::now();
  measuring = true;
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  measuring = false;
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
  double cpu = (CpuSeconds(ctl) - cpu0) / wall;
  std::vector<double> r;
  {
    std::lock_guard<std::mutex> l(mu);
    r = rtts;
  }
  size_t samples = r.size();
  double p50 = Pct(r, 0.5) * 1e3, p99 = Pct(r, 0.99) * 1e3, mx = r.empty() ? 0 : r.back() * 1e3;

  // ---- 2. submit -> RUNNING with two real agents (simulated ones keep heartbeating) ----
  std::vector<pid_t> real;
  for (int i = 0; i < 2; ++i)
    real.push_back(Spawn({bin + "/tessera-worker", "--controller", addr, "--ca-cert", dir + "/controller/ca.crt",
                          "--join-token", join, "--node-id", absl::StrCat("real-", i), "--cpu-slots", "4", "--no-gpus",
                          "--work-dir", absl::StrCat(dir, "/agent", i), "--log-level", "warn"},
                         absl::StrCat(dir, "/agent", i, ".log")));
  auto cl = *client::Client::Connect({addr, token, ca, false});
  for (int i = 0; i < 300; ++i) {
    auto st = cl->Status();
    int ready = 0;
    for (auto& n : st->nodes()) ready += n.node_id().rfind("real-", 0) == 0 && n.state() == v1::NODE_STATE_READY;
    if (ready == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  auto spec = *ParseJobSpecYaml(
      "name: bench\nkind: comm-check\ngroups:\n  - {name: w, devices: 8, layout: {tp: 2, pp: 2}}\n"
      "comm_check: {sizes: [4KiB], iters: 1, collectives: [all_reduce], groups: [tp]}\n");
  (void)NormalizeAndValidateJobSpec(spec);
  std::vector<double> lat;
  for (int k = 0; k < jobs; ++k) {
    auto t0 = std::chrono::steady_clock::now();
    auto s = cl->Submit(spec, "");
    if (!s.ok()) { fprintf(stderr, "submit: %s\n", s.status().ToString().c_str()); break; }
    while (true) {
      auto job = cl->Get(s->job().job_id());
      if (job->state() == v1::JOB_STATE_RUNNING || IsTerminal(job->state())) {
        lat.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    while (!IsTerminal(cl->Get(s->job().job_id())->state())) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  stop = true;
  for (pid_t p : real) kill(p, SIGTERM);
  for (auto& t : threads) t.join();
  kill(ctl, SIGTERM);
  for (pid_t p : real) waitpid(p, nullptr, 0);
  waitpid(ctl, nullptr, 0);
  std::vector<double> l2 = lat;
  printf("\n== controller_bench (%d cores)\n", static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  printf("simulated agents:        %d connected, %d failed\n", connected.load(), failures.load());
  printf("heartbeat RTT over %ds:  %zu samples, p50 %.2f ms, p99 %.2f ms, max %.2f ms\n", seconds, samples, p50, p99, mx);
  printf("controller CPU:          %.1f%% of one core\n", cpu * 100);
  printf("submit -> RUNNING (8 executors, %zu jobs): median %.0f ms, min %.0f ms, max %.0f ms\n", lat.size(),
         Pct(l2, 0.5) * 1e3, l2.empty() ? 0 : l2.front() * 1e3, l2.empty() ? 0 : l2.back() * 1e3);
  system(("rm -rf " + dir).c_str());
  return failures > 0 ? 1 : 0;
}
