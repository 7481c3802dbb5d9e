// The controller's web dashboard (controller/dashboard.h) against a real cluster running
// real jobs: its JSON API (tokens required, errors named), then the page itself in
// headless Chromium — the DOM after its script ran shows the nodes, the running job and
// its loss curve, and a screenshot is taken (build/dashboard.png; docs/dashboard.png is
// one); a job that restarted has its attempts apart on real axes, smoothed, on a log
// scale, beside another run, with the value under the pointer; a failed job's reason in
// full; a comm-check's results; a banner when the controller cannot be reached. Without
// Chromium (Ubuntu ships it only as a snap) the browser halves are skipped with a
// message; the API checks always run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/util.h"
#include "tests/integration/cluster.h"

namespace tessera::testing {
namespace {
using ::testing::HasSubstr;

int Status(const std::string& response) {
  return response.size() > 12 ? std::atoi(response.c_str() + 9) : 0;
}
nlohmann::json Body(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  return nlohmann::json::parse(at == std::string::npos ? "" : response.substr(at + 4), nullptr, false);
}

// Headless Chromium's flags for a page of this test's cluster: its own profile directory
// (`profile`), 6 s of virtual time for the page's script and refreshes.
std::string ChromiumFlags(const std::string& profile, const std::string& window = "1400,900") {
  return absl::StrCat(" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking",
                      " --disable-component-update --disable-sync --disable-dev-shm-usage --user-data-dir=", profile,
                      " --window-size=", window, " --virtual-time-budget=6000 ");
}

std::string Chromium() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser"})
    if (access(p, X_OK) == 0) return p;
  return "";
}

TEST(Dashboard, ShowsARunningJobsCurvesAndLogs) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  const int port = c->controller_dashboard_port();
  ASSERT_GT(port, 0);
  const std::string id = Submit(*c, PretrainSpec(2, 1, 0, 1000000));
  ASSERT_TRUE(c->WaitState(id, v1::JOB_STATE_RUNNING, 60000).ok());
  // Wait for some steps' metrics.
  nlohmann::json events;
  int steps = 0;
  for (int i = 0; i < 600 && steps < 30; ++i) {
    events = Body(HttpGet(port, "/api/jobs/" + id + "/events?from=0", c->read_token()));
    steps = 0;
    for (const auto& e : events["events"]) steps += e.contains("progress") && e["progress"].contains("metrics");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GE(steps, 30) << events.dump();
  bool loss = false;
  for (const auto& e : events["events"]) loss |= e.contains("progress") && e["progress"]["metrics"].contains("loss");
  EXPECT_TRUE(loss);

  // The API: a token is required and any role reads; bad requests are named.
  EXPECT_EQ(Status(HttpGet(port, "/api/jobs")), 401);
  EXPECT_EQ(Status(HttpGet(port, "/api/jobs", std::string(32, 'a'))), 401);
  const std::string jobs = HttpGet(port, "/api/jobs", c->read_token());
  ASSERT_EQ(Status(jobs), 200);
  ASSERT_EQ(Body(jobs)["jobs"].size(), 1u);
  EXPECT_EQ(Body(jobs)["jobs"][0]["jobId"], id);
  EXPECT_EQ(Body(jobs)["jobs"][0]["state"], "JOB_STATE_RUNNING");
  const auto cluster = Body(HttpGet(port, "/api/cluster", c->admin_token()));
  ASSERT_EQ(cluster["nodes"].size(), 1u);
  EXPECT_EQ(cluster["nodes"][0]["devices"][0]["usedByJob"], id);
  const auto logs = Body(HttpGet(port, "/api/jobs/" + id + "/logs?rank=1", c->read_token()));
  EXPECT_EQ(logs["attempt"], 1);
  ASSERT_FALSE(logs["lines"].empty());
  EXPECT_THAT(logs["lines"][0].get<std::string>(), HasSubstr("executor 1 of job " + id));
  const std::string bad_rank = HttpGet(port, "/api/jobs/" + id + "/logs?rank=x", c->read_token());
  EXPECT_EQ(Status(bad_rank), 400);
  EXPECT_EQ(Body(bad_rank)["error"], "rank: expected a rank (0, 1, ...)");
  EXPECT_EQ(Status(HttpGet(port, "/api/jobs/nope/events", c->read_token())), 404);
  EXPECT_EQ(Status(HttpGet(port, "/api/jobs/" + id + "/events?from=z", c->read_token())), 400);
  const std::string page = HttpGet(port, "/");
  EXPECT_EQ(Status(page), 200);
  EXPECT_THAT(page, HasSubstr("<title>Tessera</title>"));

  // The page in a browser, while the job runs.
  const std::string chromium = Chromium();
  if (chromium.empty()) {
    std::cout << "[ SKIPPED ] the browser half: no /usr/bin/chromium here (scripts/setup.sh installs it on Debian)\n";
  } else {
    const std::string url = absl::StrCat("http://127.0.0.1:", port, "/#token=", c->read_token());
    const std::string flags = ChromiumFlags(c->dir() + "/chromium");
    const std::string dom_file = c->dir() + "/dom.html", shot = std::string(TESSERA_BUILD_DIR) + "/dashboard.png";
    int rc = system((chromium + flags + "--dump-dom '" + url + "' > " + dom_file + " 2> " + c->dir() + "/chromium.log").c_str());
    ASSERT_EQ(WEXITSTATUS(rc), 0) << ReadFile(c->dir() + "/chromium.log").value_or("");
    const std::string dom = ReadFile(dom_file).value_or("");
    EXPECT_THAT(dom, HasSubstr("data-ready=\"1\""));
    EXPECT_THAT(dom, HasSubstr(">n0</td>"));
    EXPECT_THAT(dom, HasSubstr("class=\"job sel\" data-id=\"" + id + "\""));
    EXPECT_THAT(dom, HasSubstr("RUNNING"));
    EXPECT_THAT(dom, HasSubstr("data-metric=\"loss\""));
    EXPECT_THAT(dom, HasSubstr("<polyline class=\"line\""));
    EXPECT_THAT(dom, HasSubstr("executor 0 of job " + id));  // rank 0's log
    unlink(shot.c_str());
    rc = system((chromium + flags + "--screenshot=" + shot + " '" + url + "' > /dev/null 2>> " + c->dir() + "/chromium.log").c_str());
    EXPECT_EQ(WEXITSTATUS(rc), 0) << ReadFile(c->dir() + "/chromium.log").value_or("");
    struct stat st {};
    ASSERT_EQ(stat(shot.c_str(), &st), 0) << "no screenshot";
    EXPECT_GT(st.st_size, 20000) << "the screenshot is nearly empty";
    std::cout << "screenshot of the dashboard: " << shot << "\n";
  }
  ASSERT_TRUE(c->client().Stop(id).ok());
  EXPECT_TRUE(c->WaitState(id, v1::JOB_STATE_STOPPED, 30000).ok());
}

// The DOM of the page at `url` after its script ran (6 s of virtual time), headless.
std::string Dom(const std::string& chromium, Cluster& c, const std::string& url, const std::string& tag) {
  const std::string flags = ChromiumFlags(c.dir() + "/chromium-" + tag);
  const std::string out = c.dir() + "/dom-" + tag + ".html", log = c.dir() + "/chromium-" + tag + ".log";
  const int rc = system((chromium + flags + "--dump-dom '" + url + "' > " + out + " 2> " + log).c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 0) << ReadFile(log).value_or("");
  return ReadFile(out).value_or("");
}

std::string HtmlText(const std::string& s) {  // as a serialized DOM writes a text node
  std::string out;
  for (char ch : s) out += ch == '&' ? "&amp;" : ch == '<' ? "&lt;" : ch == '>' ? "&gt;" : std::string(1, ch);
  return out;
}

TEST(Dashboard, KeepsAttemptsApartComparesRunsShowsReasonsAndResultsAndSaysWhenTheControllerIsGone) {
  auto c = Up({.agents = 1, .cpu_slots = 2});
  const int port = c->controller_dashboard_port();
  ASSERT_GT(port, 0);
  // A comm-check's results; a pretrain with a long name that restarts from its checkpoint
  // (attempt 2 re-runs steps); one whose executor dies with no restarts left.
  const std::string cc = Submit(*c, CommCheckSpec(2, 2, 1, 0));
  ASSERT_TRUE(c->WaitState(cc, v1::JOB_STATE_SUCCEEDED, 60000).ok());
  v1::JobSpec spec = PretrainSpec(2, 1, 0, 40);
  spec.set_name("a-pretrain-run-whose-name-goes-on-and-on-" + std::string(22, 'x'));  // the longest a name may be
  spec.mutable_train()->mutable_checkpoint()->set_dir(c->dir() + "/ckpt");
  spec.mutable_train()->mutable_checkpoint()->set_save_every(4);
  spec.set_max_restarts(1);
  spec.set_restart_backoff_s(0.2);
  const std::string restarted = Submit(*c, spec);
  auto pids = RunningExecutors(*c, restarted, 1, 2);
  ASSERT_EQ(pids.size(), 2u);
  for (int i = 0; i < 3000 && !ReadFile(c->dir() + "/ckpt/latest").ok(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_EQ(kill(pids[1], SIGKILL), 0);
  auto job = c->WaitState(restarted, v1::JOB_STATE_SUCCEEDED, 120000);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->attempt(), 2) << "the kill came after the job ended";
  const std::string failed = Submit(*c, PretrainSpec(2, 1, 0, 1000000));
  pids = RunningExecutors(*c, failed, 1, 2);
  ASSERT_EQ(pids.size(), 2u);
  for (int i = 0; i < 600; ++i) {  // some steps' losses first
    const auto ev = Body(HttpGet(port, "/api/jobs/" + failed + "/events?from=0", c->read_token()));
    int steps = 0;
    for (const auto& e : ev["events"]) steps += e.contains("progress") && e["progress"].contains("metrics");
    if (steps >= 5) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(kill(pids[0], SIGKILL), 0);
  auto gone = c->WaitState(failed, v1::JOB_STATE_FAILED, 60000);
  ASSERT_TRUE(gone.ok()) << gone.status();
  const std::string reason = gone->reason();
  ASSERT_GT(reason.size(), 40u) << reason;

  // The API's whole job: its result and its reason.
  const auto whole = Body(HttpGet(port, "/api/jobs/" + cc, c->read_token()));
  EXPECT_THAT(whole["resultJson"].get<std::string>(), HasSubstr("\"comm_check\""));
  EXPECT_EQ(Body(HttpGet(port, "/api/jobs/" + failed, c->read_token()))["reason"], reason);
  EXPECT_EQ(Status(HttpGet(port, "/api/jobs/nope", c->read_token())), 404);
  EXPECT_EQ(Status(HttpGet(port, "/api/jobs/" + cc)), 401);

  const std::string chromium = Chromium();
  if (chromium.empty()) {
    std::cout << "[ SKIPPED ] the browser half: no /usr/bin/chromium here (scripts/setup.sh installs it on Debian)\n";
    return;
  }
  const std::string base = absl::StrCat("http://127.0.0.1:", port, "/#token=", c->read_token());
  // The restarted run beside the failed one, smoothed, on a log scale, the pointer over it.
  std::string dom = Dom(chromium, *c, base + "&job=" + restarted + "&compare=" + failed + "&smooth=0.6&log=1&hover=1", "runs");
  EXPECT_THAT(dom, HasSubstr("data-ready=\"1\""));
  EXPECT_THAT(dom, HasSubstr("class=\"job sel\" data-id=\"" + restarted + "\""));
  EXPECT_THAT(dom, HasSubstr("data-metric=\"loss\" data-scale=\"log\""));
  EXPECT_THAT(dom, HasSubstr("class=\"attempt-mark\""));
  EXPECT_THAT(dom, HasSubstr(">attempt 2</text>"));
  EXPECT_THAT(dom, HasSubstr("class=\"line\" data-attempt=\"1\""));
  EXPECT_THAT(dom, HasSubstr("class=\"line\" data-attempt=\"2\""));
  EXPECT_THAT(dom, HasSubstr("class=\"raw\""));  // smoothed: the raw curve faded behind
  EXPECT_THAT(dom, HasSubstr("class=\"tick\""));
  EXPECT_THAT(dom, HasSubstr("stroke=\"#e4572e\""));  // the compared run's line
  EXPECT_THAT(dom, HasSubstr("class=\"run\""));
  EXPECT_THAT(dom, HasSubstr(failed + " · pt</span>"));  // in the legend
  EXPECT_THAT(dom, ::testing::ContainsRegex("class=\"tip\"[^>]*>.*step [0-9]+: [0-9.e+-]+ · " + restarted));
  EXPECT_THAT(dom, HasSubstr("data-overflow=\"0\""));  // the long name does not widen the page
  EXPECT_THAT(dom, HasSubstr("· 1 restart</div>"));
  {  // and its picture (build/dashboard-runs.png)
    const std::string shot = std::string(TESSERA_BUILD_DIR) + "/dashboard-runs.png";
    unlink(shot.c_str());
    const int rc = system((chromium + ChromiumFlags(c->dir() + "/chromium-shot", "1400,1000") + "--screenshot=" + shot + " '" +
                           base + "&job=" + restarted + "&compare=" + failed + "&smooth=0.6&hover=1' > /dev/null 2>&1").c_str());
    EXPECT_EQ(WEXITSTATUS(rc), 0);
    struct stat sb {};
    EXPECT_EQ(stat(shot.c_str(), &sb), 0) << "no screenshot";
  }
  // The failed job: its reason whole.
  dom = Dom(chromium, *c, base + "&job=" + failed, "failed");
  EXPECT_THAT(dom, HasSubstr("<div id=\"reason\" class=\"FAILED\">" + HtmlText(reason) + "</div>"));
  // The comm-check: its results.
  dom = Dom(chromium, *c, base + "&job=" + cc, "cc");
  EXPECT_THAT(dom, HasSubstr("Comm-check results"));
  EXPECT_THAT(dom, HasSubstr("<td>all_reduce</td>"));
  EXPECT_THAT(dom, HasSubstr("<td>1 × 2</td>"));
  // No controller to reach: the page (saved) says so.
  const std::string page = c->dir() + "/page.html";
  const std::string body = HttpGet(port, "/");
  ASSERT_TRUE(WriteFileAtomic(page, body.substr(body.find("\r\n\r\n") + 4)).ok());
  dom = Dom(chromium, *c, "file://" + page + "#token=x", "gone");
  EXPECT_THAT(dom, HasSubstr("data-unreachable=\"1\""));
  EXPECT_THAT(dom, HasSubstr("cannot reach the controller (since "));
}

}  // namespace
}  // namespace tessera::testing
