// The controller's web dashboard (controller/dashboard.h) against a real cluster running
// a real training job: its JSON API (tokens required, errors named), then the page
// itself in headless Chromium — the DOM after its script ran shows the nodes, the
// running job and its loss curve, and a screenshot is taken (build/dashboard.png;
// docs/dashboard.png is one). Without Chromium (Ubuntu ships it only as a snap) the
// browser half is skipped with a message; the API half always runs.
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
    const std::string flags = absl::StrCat(
        " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking",
        " --disable-component-update --disable-sync --disable-dev-shm-usage --user-data-dir=", c->dir(), "/chromium",
        " --window-size=1400,900 --virtual-time-budget=6000 ");
    const std::string dom_file = c->dir() + "/dom.html", shot = std::string(TESSERA_BUILD_DIR) + "/dashboard.png";
    int rc = system((chromium + flags + "--dump-dom '" + url + "' > " + dom_file + " 2> " + c->dir() + "/chromium.log").c_str());
    ASSERT_EQ(WEXITSTATUS(rc), 0) << ReadFile(c->dir() + "/chromium.log").value_or("");
    const std::string dom = ReadFile(dom_file).value_or("");
    EXPECT_THAT(dom, HasSubstr("data-ready=\"1\""));
    EXPECT_THAT(dom, HasSubstr("<td>n0</td>"));
    EXPECT_THAT(dom, HasSubstr("class=\"job sel\" data-id=\"" + id + "\""));
    EXPECT_THAT(dom, HasSubstr("RUNNING"));
    EXPECT_THAT(dom, HasSubstr("data-metric=\"loss\""));
    EXPECT_THAT(dom, HasSubstr("<polyline points="));
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

}  // namespace
}  // namespace tessera::testing
