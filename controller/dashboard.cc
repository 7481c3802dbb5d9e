#include "controller/dashboard.h"

#include <CivetServer.h>
#include <google/protobuf/util/json_util.h>

#include <nlohmann/json.hpp>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/rpc/grpc_util.h"

namespace tessera::controller {
namespace {

std::string ToJson(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions o;
  o.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, o);
  return out;
}

void Reply(mg_connection* conn, int code, const char* type, const std::string& body) {
  const char* text = code == 200 ? "OK" : code == 401 ? "Unauthorized" : code == 404 ? "Not Found" : "Bad Request";
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n"
            "X-Content-Type-Options: nosniff\r\nContent-Security-Policy: default-src 'self'; script-src 'unsafe-inline'; "
            "style-src 'unsafe-inline'; img-src data:\r\nConnection: close\r\n\r\n",
            code, text, type, body.size());
  mg_write(conn, body.data(), body.size());
}

std::string Query(mg_connection* conn, const char* key) {
  const mg_request_info* ri = mg_get_request_info(conn);
  if (ri->query_string == nullptr) return "";
  char buf[256];
  const int n = mg_get_var(ri->query_string, strlen(ri->query_string), key, buf, sizeof buf);
  return n < 0 ? "" : std::string(buf, n);
}

}  // namespace

struct Dashboard::Impl : public CivetHandler {
  JobManager* jobs;
  const TokenAuthority* tokens;
  LogStore* logs;
  std::unique_ptr<CivetServer> server;

  bool handleGet(CivetServer*, mg_connection* conn) override {
    const mg_request_info* ri = mg_get_request_info(conn);
    const std::string uri = ri->local_uri ? ri->local_uri : "/";
    if (uri == "/" || uri == "/index.html") {
      Reply(conn, 200, "text/html; charset=utf-8", kDashboardPage);
      return true;
    }
    if (!absl::StartsWith(uri, "/api/")) {
      Reply(conn, 404, "text/plain", "not found\n");
      return true;
    }
    const char* auth = mg_get_header(conn, "Authorization");
    std::string token = auth && absl::StartsWithIgnoreCase(auth, "bearer ") ? std::string(auth + 7) : "";
    if (auto p = tokens->Check(token, Role::kRead); !p.ok()) {
      Reply(conn, 401, "application/json", nlohmann::json{{"error", "a valid token is required"}}.dump());
      return true;
    }
    const std::vector<std::string> parts = absl::StrSplit(uri.substr(5), '/');
    if (parts.size() == 1 && parts[0] == "cluster") {
      Reply(conn, 200, "application/json", ToJson(jobs->ClusterStatus()));
    } else if (parts.size() == 1 && parts[0] == "jobs") {
      std::string body = "{\"jobs\":[";
      const auto list = jobs->ListJobs({}, 200);
      if (list.ok())
        for (size_t i = 0; i < list->jobs.size(); ++i) absl::StrAppend(&body, i ? "," : "", ToJson(list->jobs[i]));
      Reply(conn, 200, "application/json", body + "]}");
    } else if (parts.size() == 2 && parts[0] == "jobs") {
      auto job = jobs->GetJob(parts[1]);
      if (!job.ok()) {
        Reply(conn, 404, "application/json", nlohmann::json{{"error", std::string(job.status().message())}}.dump());
        return true;
      }
      Reply(conn, 200, "application/json", ToJson(*job));
    } else if (parts.size() == 3 && parts[0] == "jobs" && parts[2] == "events") {
      int64_t from = 0;
      if (!Query(conn, "from").empty() && !absl::SimpleAtoi(Query(conn, "from"), &from)) {
        Reply(conn, 400, "application/json", nlohmann::json{{"error", "from: expected an integer"}}.dump());
        return true;
      }
      bool done = false;
      auto events = jobs->WaitEvents(parts[1], from, 0, &done);
      if (!events.ok()) {
        Reply(conn, 404, "application/json", nlohmann::json{{"error", std::string(events.status().message())}}.dump());
        return true;
      }
      std::string body = "{\"events\":[";
      for (size_t i = 0; i < events->size(); ++i) absl::StrAppend(&body, i ? "," : "", ToJson((*events)[i]));
      // more: a full page; the rest from its last seq.
      const bool more = static_cast<int64_t>(events->size()) == JobManager::kEventsPerPage;
      Reply(conn, 200, "application/json",
            absl::StrCat(body, "],\"done\":", done ? "true" : "false", ",\"more\":", more ? "true" : "false", "}"));
    } else if (parts.size() == 3 && parts[0] == "jobs" && parts[2] == "logs") {
      int rank = 0;
      if (!absl::SimpleAtoi(Query(conn, "rank"), &rank) || rank < 0) {
        Reply(conn, 400, "application/json", nlohmann::json{{"error", "rank: expected a rank (0, 1, ...)"}}.dump());
        return true;
      }
      if (!jobs->GetJob(parts[1]).ok()) {
        Reply(conn, 404, "application/json", nlohmann::json{{"error", "no job " + parts[1]}}.dump());
        return true;
      }
      nlohmann::json lines = nlohmann::json::array();
      int attempt = 0;
      auto cursors = logs->List(parts[1], 0, rank);
      if (!cursors.empty()) {
        auto latest = cursors.front();
        for (const auto& c : cursors)
          if (c.attempt > latest.attempt) latest = c;
        attempt = latest.attempt;
        for (const auto& l : logs->Tail(parts[1], latest, 200)) lines.push_back(l.text());
      }
      Reply(conn, 200, "application/json", nlohmann::json{{"attempt", attempt}, {"lines", lines}}.dump());
    } else {
      Reply(conn, 404, "application/json", nlohmann::json{{"error", "no such API: " + uri}}.dump());
    }
    return true;
  }
};

Dashboard::Dashboard(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Dashboard::~Dashboard() {
  if (impl_ && impl_->server) impl_->server->close();
}

int Dashboard::port() const {
  const auto ports = impl_->server->getListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

absl::StatusOr<std::unique_ptr<Dashboard>> Dashboard::Start(const std::string& listen, JobManager* jobs,
                                                            const TokenAuthority* tokens, LogStore* logs) {
  if (!IsLoopbackAddress(listen))
    return absl::InvalidArgumentError(absl::StrCat("--dashboard-listen ", listen,
                                                   ": the dashboard is plaintext HTTP, so it listens on loopback only "
                                                   "(reach it through an SSH tunnel or kubectl port-forward)"));
  auto impl = std::make_unique<Impl>();
  impl->jobs = jobs, impl->tokens = tokens, impl->logs = logs;
  std::string ports = listen;
  if (absl::StartsWith(ports, "localhost:")) ports = "127.0.0.1:" + ports.substr(10);
  try {
    impl->server = std::make_unique<CivetServer>(
        std::vector<std::string>{"listening_ports", ports, "num_threads", "4", "request_timeout_ms", "10000"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve the dashboard on ", listen, ": ", e.what()));
  }
  impl->server->addHandler("/", impl.get());
  return std::unique_ptr<Dashboard>(new Dashboard(std::move(impl)));
}

}  // namespace tessera::controller
