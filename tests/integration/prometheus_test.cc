// The daemons' metrics as a real Prometheus sees them (Debian's prometheus, which
// scripts/setup.sh installs; the test skips where it is absent): a Prometheus on loopback
// scrapes the controller and an agent every 100 ms while a pretrain job and an RL job
// with a rollout pool run, and then
//   - a job's series carry job_id, and `job` stays the scrape job's (no exported_job);
//   - a finished job's series leave the exposition (an instant query after the end finds
//     nothing) while its history stays (a range query over the run finds its steps);
//   - every query of deploy/grafana/tessera.json runs without error over the run, and
//     answers with data for what these jobs report (all but MFU, which needs a GPU's peak),
//     the cluster panels too; the dashboard's job_id variable lists the jobs;
//   - the shipped scrape configuration for a cluster run by hand passes promtool.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <set>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/spec/job_spec.h"
#include "common/util.h"
#include "tests/integration/cluster.h"

namespace tessera::testing {
namespace {
using ::testing::HasSubstr;

constexpr const char* kPrometheus = "/usr/bin/prometheus";
constexpr const char* kPromtool = "/usr/bin/promtool";

int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 && getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  close(fd);
  return port;
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      snprintf(buf, sizeof(buf), "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

// The JSON body of a Prometheus API GET (null on no answer).
nlohmann::json Api(int port, const std::string& path) {
  const std::string r = HttpGet(port, path);
  const size_t body = r.find("\r\n\r\n");
  if (body == std::string::npos) return nullptr;
  return nlohmann::json::parse(r.substr(body + 4), nullptr, false);
}

double NowS() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

nlohmann::json QueryRange(int port, const std::string& q, double start, double end) {
  return Api(port, absl::StrCat("/api/v1/query_range?query=", UrlEncode(q), "&start=", absl::StrFormat("%.3f", start),
                                "&end=", absl::StrFormat("%.3f", end), "&step=0.5"));
}

nlohmann::json Query(int port, const std::string& q) {
  return Api(port, absl::StrCat("/api/v1/query?query=", UrlEncode(q)));
}

TEST(Prometheus, ScrapesTheDaemonsAndAnswersTheDashboardsQueries) {
  if (access(kPrometheus, X_OK) != 0) GTEST_SKIP() << kPrometheus << " is not installed (scripts/setup.sh installs it)";
  auto c = Up({.agents = 1, .cpu_slots = 4});
  const int cm = c->controller_metrics_port(), am = c->agent_metrics_port();
  ASSERT_GT(cm, 0);
  ASSERT_GT(am, 0);
  const std::string dir = c->dir() + "/prometheus";
  ASSERT_TRUE(MakeDirs(dir, 0700).ok());
  const std::string config = absl::StrCat(
      "global:\n  scrape_interval: 100ms\n  scrape_timeout: 90ms\n"
      "scrape_configs:\n"
      "  - job_name: tessera-controller\n    static_configs:\n      - targets: ['127.0.0.1:", cm, "']\n"
      "  - job_name: tessera-agent\n    static_configs:\n      - targets: ['127.0.0.1:", am, "']\n");
  ASSERT_TRUE(WriteFileAtomic(dir + "/prometheus.yml", config, 0600).ok());
  // Prometheus cannot publish a port it picked: a free one is chosen here, and another
  // where a test running beside this one took it first (Prometheus then exits).
  std::unique_ptr<Proc> prom;
  int port = -1;
  bool ready = false;
  for (int attempt = 0; attempt < 5 && !ready; ++attempt) {
    port = FreeLoopbackPort();
    ASSERT_GT(port, 0);
    prom = std::make_unique<Proc>();
    ASSERT_TRUE(prom->Start({kPrometheus, "--config.file=" + dir + "/prometheus.yml", "--storage.tsdb.path=" + dir + "/data",
                             absl::StrCat("--web.listen-address=127.0.0.1:", port), "--log.level=warn"},
                            absl::StrCat(dir, "/prometheus.", attempt, ".log")));
    for (int i = 0; i < 300 && !ready && prom->Wait(0) == -1; ++i) {
      ready = HttpGet(port, "/-/ready").find(" 200 ") != std::string::npos;
      if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ASSERT_TRUE(ready) << ReadFile(dir + "/prometheus.0.log").value_or("");
  // Targets reach the scrape loop a few seconds after the start (service discovery sends
  // its updates at most every 5 s): wait until both daemons have been scraped.
  int up = 0;
  for (int i = 0; i < 300 && up < 2; ++i) {
    const auto r = Query(port, "up");
    up = 0;
    for (const auto& series : r["data"]["result"]) up += series["value"][1] == "1";
    if (up < 2) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(up, 2) << Api(port, "/api/v1/targets").dump();

  const double start = NowS();
  EXPECT_FALSE(c->client().Get("no-such-job").ok());  // an RPC that fails (NOT_FOUND), for the errors panel
  v1::JobSpec pt = PretrainSpec(2, 1, 0, 200);  // a few seconds: scraped many times
  pt.mutable_train()->mutable_checkpoint()->set_dir(c->dir() + "/ckpt");
  pt.mutable_train()->mutable_checkpoint()->set_save_every(100);
  const std::string pretrain = Submit(*c, pt);
  ASSERT_TRUE(c->WaitState(pretrain, v1::JOB_STATE_SUCCEEDED, 120000).ok());
  v1::JobSpec rl = SmallRlSpec("grpo");  // with a held-out evaluation and a rollout pool of its own (weight syncs)
  rl.mutable_rl()->set_eval_every(10);
  rl.mutable_train()->set_steps(150);  // a few seconds too
  auto* pool = rl.add_groups();
  pool->set_name("rollout"), pool->set_role("rollout"), pool->set_devices(2);
  pool->mutable_layout()->set_dp(2);
  ASSERT_TRUE(NormalizeAndValidateJobSpec(rl).ok());
  const std::string grpo = Submit(*c, rl);
  ASSERT_TRUE(c->WaitState(grpo, v1::JOB_STATE_SUCCEEDED, 120000).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // scrapes after both ended
  const double end = NowS();

  // Both jobs' losses were scraped while they ran, under job_id; `job` is the scrape job.
  for (const std::string& id : {pretrain, grpo}) {
    const auto r = QueryRange(port, absl::StrCat("tessera_job_step{job_id=\"", id, "\"}"), start, end);
    ASSERT_EQ(r["status"], "success") << r.dump();
    ASSERT_EQ(r["data"]["result"].size(), 1u) << id << ": " << r.dump();
    const auto& series = r["data"]["result"][0];
    EXPECT_EQ(series["metric"]["job"], "tessera-controller");
    EXPECT_EQ(series["metric"]["job_id"], id);
    EXPECT_FALSE(series["metric"].contains("exported_job")) << series.dump();
    EXPECT_GE(series["values"].size(), 1u);
    // Gone from the exposition once the job ended: nothing now, in the daemon or in Prometheus.
    const auto now = Query(port, absl::StrCat("tessera_job_step{job_id=\"", id, "\"}"));
    EXPECT_EQ(now["data"]["result"].size(), 0u) << now.dump();
    EXPECT_THAT(HttpGet(cm, "/metrics"), ::testing::Not(HasSubstr(absl::StrCat("job_id=\"", id, "\""))));
  }
  const auto steps = QueryRange(port, absl::StrCat("max_over_time(tessera_job_step{job_id=\"", pretrain, "\"}[1h])"), end - 1, end);
  ASSERT_EQ(steps["data"]["result"].size(), 1u) << steps.dump();
  EXPECT_GE(std::stod(steps["data"]["result"][0]["values"].back()[1].get<std::string>()), 100);  // the steps were scraped as they went
  // The memory peak in bytes (reported in GB), the checkpoint time in seconds.
  const auto mem = QueryRange(port, absl::StrCat("tessera_job_memory_peak_bytes{job_id=\"", pretrain, "\"}"), start, end);
  ASSERT_EQ(mem["data"]["result"].size(), 1u) << mem.dump();
  EXPECT_GT(std::stod(mem["data"]["result"][0]["values"][0][1].get<std::string>()), 1e5);

  // The dashboard's job_id variable lists both jobs.
  auto text = ReadFile(std::string(TESSERA_SOURCE_DIR) + "/deploy/grafana/tessera.json");
  ASSERT_TRUE(text.ok());
  const auto dash = nlohmann::json::parse(*text);
  std::string var_query;
  for (const auto& v : dash["templating"]["list"])
    if (v["name"] == "job_id") var_query = v["query"];
  static const std::regex label_values(R"re(label_values\((\w+), (\w+)\))re");
  std::smatch lv;
  ASSERT_TRUE(std::regex_match(var_query, lv, label_values)) << "the job_id variable: " << var_query;
  const auto values = Api(port, absl::StrCat("/api/v1/label/", lv[2].str(), "/values?match[]=", UrlEncode(lv[1].str()),
                                              absl::StrFormat("&start=%.3f&end=%.3f", start, end)));
  std::set<std::string> listed;
  for (const auto& v : values["data"]) listed.insert(v.get<std::string>());
  EXPECT_TRUE(listed.count(pretrain) && listed.count(grpo)) << values.dump();

  // Every panel's query over the run: no error, and data for all that these jobs report.
  int targets = 0, answered = 0;
  for (const auto& p : dash["panels"]) {
    if (p["type"] == "row") continue;
    for (const auto& t : p["targets"]) {
      const std::string expr = absl::StrReplaceAll(t["expr"].get<std::string>(), {{"$job_id", pretrain + "|" + grpo}});
      ++targets;
      const auto r = QueryRange(port, expr, start, end);
      ASSERT_EQ(r["status"], "success") << p["title"] << ": " << expr << "\n" << r.dump();
      const bool needs_gpu = absl::StrContains(expr, "mfu");
      if (!needs_gpu) EXPECT_GE(r["data"]["result"].size(), 1u) << p["title"] << ": " << expr << " has no data";
      answered += !r["data"]["result"].empty();
    }
  }
  EXPECT_GE(targets, 25);
  EXPECT_GE(answered, targets - 1);
}

// The shipped scrape configuration for a cluster run by hand is valid Prometheus
// configuration (the Kubernetes one needs Kubernetes service discovery, which Debian's
// build leaves out: tests/deploy/manifests_test.cc checks it against the manifests).
TEST(Prometheus, ShippedScrapeConfigPassesPromtool) {
  if (access(kPromtool, X_OK) != 0) GTEST_SKIP() << kPromtool << " is not installed (scripts/setup.sh installs it)";
  const std::string path = std::string(TESSERA_SOURCE_DIR) + "/deploy/prometheus/prometheus.yml";
  const std::string cmd = absl::StrCat(kPromtool, " check config --syntax-only ", path, " 2>&1");
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof(buf), pipe) != nullptr) out += buf;
  EXPECT_EQ(pclose(pipe), 0) << out;
}

}  // namespace
}  // namespace tessera::testing
