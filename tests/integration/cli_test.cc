// The CLI against real daemons: `tessera job submit` watching across a controller restart,
// and `tessera local`'s Ctrl-C and state directory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <algorithm>
#include <regex>
#include <thread>

#include <signal.h>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/util.h"
#include "tests/integration/cluster.h"

namespace tessera::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

bool WaitFor(const std::function<bool()>& done, int timeout_ms) {
  for (int i = 0; i < timeout_ms / 20; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

std::string PretrainYaml(const std::string& name, int steps) {
  return absl::StrCat("name: ", name,
                      "\nkind: pretrain\ngroups: [{name: actor, devices: 2}]\n"
                      "model: {vocab_size: 256, hidden: 32, num_layers: 2, num_heads: 4, num_kv_heads: 2, ffn: 48, "
                      "seq_len: 16, global_batch: 8, micro_batch: 2}\n"
                      "train: {steps: ",
                      steps, ", lr: 1.0e-2, seed: 5}\n");
}

std::string Read(const std::string& path) { return ReadFile(path).value_or(""); }

// The job id `tessera` printed ("submitted ID").
std::string SubmittedId(const std::string& log) {
  std::smatch m;
  return std::regex_search(log, m, std::regex("submitted (\\S+)")) ? m[1].str() : "";
}

// `tessera job submit` keeps watching while the controller restarts: it says it lost the
// controller, reconnects, follows the job's new attempt and exits 0 when it succeeds.
TEST(Cli, SubmitKeepsWatchingAcrossAControllerRestart) {
  auto c = Up({.agents = 1, .cpu_slots = 2, .lease_s = 4});
  const std::string job = c->dir() + "/job.yaml", log = c->dir() + "/submit.log";
  ASSERT_TRUE(WriteFileAtomic(job, PretrainYaml("watched", 150)).ok());
  Proc cli;
  ASSERT_TRUE(cli.Start({std::string(TESSERA_BIN_DIR) + "/tessera", "--config", c->dir() + "/controller/admin.conf",
                         "job", "submit", "-f", job},
                        log));
  std::string id;
  ASSERT_TRUE(WaitFor([&] { return !(id = SubmittedId(Read(log))).empty(); }, 30000)) << Read(log);
  ASSERT_TRUE(c->WaitState(id, v1::JOB_STATE_RUNNING, 30000).ok());
  c->controller().Kill(SIGKILL);
  c->controller().Wait(5000);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ASSERT_TRUE(c->StartController().ok());
  const int st = cli.Wait(180000);
  ASSERT_NE(st, -1) << "tessera job submit did not end: " << Read(log);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << Read(log);
  const std::string out = Read(log);
  EXPECT_THAT(out, HasSubstr("lost the controller"));
  EXPECT_THAT(out, HasSubstr("reconnected to the controller"));
  EXPECT_THAT(out, HasSubstr("RESTARTING (attempt 1): the controller restarted while the job was active"));
  EXPECT_THAT(out, HasSubstr("job " + id + " SUCCEEDED"));
}

// Ctrl-C on `tessera local` stops its job (the executors stop, the job ends STOPPED) and
// the run exits 130. A run that was killed outright leaves its job unfinished in the
// state directory: the next run marks it STOPPED, says so, and never resumes it beside
// its own job.
TEST(Cli, LocalStopsItsJobOnCtrlCAndNeverResumesAnother) {
  char tmpl[] = "/tmp/tessera-local-test-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl, state = dir + "/state", job = dir + "/long.yaml", short_job = dir + "/short.yaml";
  ASSERT_TRUE(WriteFileAtomic(job, PretrainYaml("long", 100000)).ok());
  ASSERT_TRUE(WriteFileAtomic(short_job, PretrainYaml("short", 3)).ok());
  const std::string bin = std::string(TESSERA_BIN_DIR) + "/tessera";
  auto local = [&](Proc& p, const std::string& file, const std::string& log) {
    return p.Start({bin, "local", file, "--state-dir", state, "--no-gpus"}, log);
  };
  // 1. Ctrl-C.
  std::string id;
  {
    Proc p;
    ASSERT_TRUE(local(p, job, dir + "/1.log"));
    ASSERT_TRUE(WaitFor([&] { return Read(dir + "/1.log").find("RUNNING") != std::string::npos; }, 60000))
        << Read(dir + "/1.log");
    id = SubmittedId(Read(dir + "/1.log"));
    ASSERT_FALSE(id.empty());
    ASSERT_TRUE(WaitFor([&] { return Cluster::ExecutorPids(id, 1).size() == 2; }, 30000));
    p.Kill(SIGINT);
    const int st = p.Wait(60000);
    ASSERT_NE(st, -1) << "tessera local did not end after Ctrl-C: " << Read(dir + "/1.log");
    ASSERT_TRUE(WIFEXITED(st)) << Read(dir + "/1.log");
    EXPECT_EQ(WEXITSTATUS(st), 130) << Read(dir + "/1.log");
    EXPECT_THAT(Read(dir + "/1.log"), HasSubstr("interrupted: stopping the job"));
    EXPECT_THAT(Read(dir + "/1.log"), HasSubstr("job " + id + " STOPPED: interrupted (Ctrl-C) in tessera local"));
    EXPECT_TRUE(Cluster::ExecutorPids(id, 1).empty());
  }
  // 2. Killed outright: its job stays RUNNING in the state directory.
  std::string killed;
  {
    Proc p;
    ASSERT_TRUE(local(p, job, dir + "/2.log"));
    ASSERT_TRUE(WaitFor([&] { return !(killed = SubmittedId(Read(dir + "/2.log"))).empty(); }, 60000));
    ASSERT_TRUE(WaitFor([&] { return Cluster::ExecutorPids(killed, 1).size() == 2; }, 30000));
    p.Kill(SIGKILL);
    p.Wait(5000);
    EXPECT_TRUE(WaitFor([&] { return Cluster::ExecutorPids(killed, 1).empty(); }, 10000));  // died with their agent
  }
  // 3. The next run: its own job only.
  {
    Proc p;
    ASSERT_TRUE(local(p, short_job, dir + "/3.log"));
    const int st = p.Wait(120000);
    ASSERT_NE(st, -1) << Read(dir + "/3.log");
    EXPECT_EQ(WEXITSTATUS(st), 0) << Read(dir + "/3.log");
    const std::string out = Read(dir + "/3.log");
    EXPECT_THAT(out, HasSubstr("job " + killed + " was left "));  // STARTING or RUNNING, as it was killed
    EXPECT_THAT(out, HasSubstr("by an earlier run on this state directory: marked STOPPED, not resumed"));
    EXPECT_THAT(out, HasSubstr("SUCCEEDED"));
    EXPECT_FALSE(std::filesystem::exists(state + "/worker/jobs/" + killed + "/attempt-2")) << "the killed job was resumed";
  }
  (void)system(("rm -rf " + dir).c_str());
}

// The CLI's everyday habits against real daemons: global options after the subcommand,
// --version, `job wait` (exit status by the job's end, 124 past --timeout), `job events`
// (the stream again from the start, metrics in one order), `job list --state` with AGE and
// DURATION, `job logs` saying that an executor was killed, `job stop` waiting for the end
// it prints, and the shell completion script completing subcommands and options.
TEST(Cli, WaitEventsListStopLogsAndCompletionBehaveAsUsersExpect) {
  auto c = Up({.agents = 1, .cpu_slots = 4});
  const std::string bin = std::string(TESSERA_BIN_DIR) + "/tessera", conf = c->dir() + "/controller/admin.conf";
  int n = 0;
  // Runs tessera with `args` (after --config) and returns (exit status, stdout + stderr).
  auto run = [&](std::vector<std::string> args, int timeout_ms = 120000) {
    const std::string log = absl::StrCat(c->dir(), "/cli.", n++, ".log");
    args.insert(args.begin(), {bin, "--config", conf});
    Proc p;
    EXPECT_TRUE(p.Start(args, log));
    const int st = p.Wait(timeout_ms);
    EXPECT_NE(st, -1) << "still running: " << Read(log);
    return std::make_pair(st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1, Read(log));
  };
  auto [vrc, version] = run({"--version"});
  EXPECT_EQ(vrc, 0);
  EXPECT_THAT(version, HasSubstr("tessera 0.1.0"));

  const std::string short_yaml = c->dir() + "/short.yaml", long_yaml = c->dir() + "/long.yaml";
  ASSERT_TRUE(WriteFileAtomic(short_yaml, PretrainYaml("short", 20)).ok());
  ASSERT_TRUE(WriteFileAtomic(long_yaml, PretrainYaml("long", 100000)).ok());
  auto [src, submitted] = run({"job", "submit", "-f", short_yaml, "--no-wait"});
  ASSERT_EQ(src, 0) << submitted;
  const std::string done = SubmittedId(submitted);
  ASSERT_FALSE(done.empty()) << submitted;
  auto [wrc, waited] = run({"job", "wait", done});
  EXPECT_EQ(wrc, 0) << waited;
  EXPECT_THAT(waited, HasSubstr(done + " SUCCEEDED"));
  // Re-attached after the end: every event from the start, each progress line's metrics sorted.
  auto [erc, events] = run({"job", "events", done});
  EXPECT_EQ(erc, 0) << events;
  EXPECT_THAT(events, HasSubstr("RUNNING (attempt 1)"));
  EXPECT_THAT(events, HasSubstr("SUCCEEDED (attempt 1)"));
  int progress_lines = 0;
  for (const std::string& line : std::vector<std::string>(absl::StrSplit(events, '\n'))) {
    std::vector<std::string> keys;
    static const std::regex key(R"(  ([a-z_]+)=)");
    for (std::sregex_iterator it(line.begin(), line.end(), key), end; it != end; ++it) keys.push_back((*it)[1]);
    if (keys.size() < 2) continue;
    ++progress_lines;
    EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end())) << line;
  }
  EXPECT_GE(progress_lines, 10) << events;

  auto [lrc, started] = run({"job", "submit", "-f", long_yaml, "--no-wait"});
  ASSERT_EQ(lrc, 0) << started;
  const std::string running = SubmittedId(started);
  ASSERT_TRUE(c->WaitState(running, v1::JOB_STATE_RUNNING, 60000).ok());
  auto [jrc, listed] = run({"job", "list", "--state", "running", "-o", "json"});  // -o after the subcommand
  ASSERT_EQ(jrc, 0) << listed;
  const auto arr = nlohmann::json::parse(listed.substr(listed.find('[')), nullptr, false);
  ASSERT_TRUE(arr.is_array()) << listed;
  ASSERT_EQ(arr.size(), 1u) << listed;
  EXPECT_EQ(arr[0]["jobId"], running);
  auto [trc, table] = run({"job", "list"});
  EXPECT_EQ(trc, 0);
  EXPECT_THAT(table, HasSubstr("AGE"));
  EXPECT_THAT(table, HasSubstr("DURATION"));
  auto [brc, bad] = run({"job", "list", "--state", "sleeping"});
  EXPECT_EQ(brc, 2);
  EXPECT_THAT(bad, HasSubstr("--state: no job state 'sleeping'; one of PENDING"));
  auto [torc, timed_out] = run({"job", "wait", running, "--timeout", "0.5"});
  EXPECT_EQ(torc, 124) << timed_out;
  EXPECT_THAT(timed_out, HasSubstr("is still RUNNING after 0.5 s"));

  auto [krc, stopped] = run({"job", "stop", running});
  EXPECT_EQ(krc, 0) << stopped;
  EXPECT_THAT(stopped, HasSubstr(running + " STOPPED"));

  // An executor killed outright (a job that does not restart): its log says so.
  ASSERT_TRUE(WriteFileAtomic(long_yaml, PretrainYaml("killed", 100000)).ok());
  auto [k2rc, k2] = run({"job", "submit", "-f", long_yaml, "--no-wait"});
  ASSERT_EQ(k2rc, 0) << k2;
  const std::string killed = SubmittedId(k2);
  ASSERT_TRUE(c->WaitState(killed, v1::JOB_STATE_RUNNING, 60000).ok());
  const auto pids = RunningExecutors(*c, killed, 1, 2);
  ASSERT_EQ(pids.size(), 2u);
  ASSERT_EQ(kill(pids[1], SIGKILL), 0);
  ASSERT_TRUE(c->WaitState(killed, v1::JOB_STATE_FAILED, 60000).ok());
  auto [grc, logs] = run({"job", "logs", killed, "--rank", "1"});
  EXPECT_EQ(grc, 0);
  EXPECT_THAT(logs, HasSubstr("[tessera] executor 1 was killed by signal 9"));

  // The completion script completes the commands it was generated from.
  auto [crc, script] = run({"completion", "bash"});
  ASSERT_EQ(crc, 0);
  ASSERT_TRUE(WriteFileAtomic(c->dir() + "/completion.bash", script).ok());
  auto complete = [&](const std::string& words, int cword) {
    const std::string cmd = absl::StrCat("bash -c 'source ", c->dir(), "/completion.bash; COMP_WORDS=(", words,
                                         "); COMP_CWORD=", cword, "; _tessera_complete; echo \"${COMPREPLY[*]}\"'");
    FILE* f = popen(cmd.c_str(), "r");
    std::string out;
    char buf[512];
    while (f != nullptr && fgets(buf, sizeof buf, f) != nullptr) out += buf;
    if (f != nullptr) pclose(f);
    return out;
  };
  EXPECT_EQ(complete("tessera job s", 2), "submit status stop\n");
  EXPECT_EQ(complete("tessera job list --s", 3), "--state\n");
  EXPECT_THAT(complete("tessera ''", 1), HasSubstr("completion"));
}

}  // namespace
}  // namespace tessera::testing
