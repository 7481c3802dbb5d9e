#include "client/cli.h"

#include <google/protobuf/util/json_util.h>

#include <cstdlib>
#include <ctime>
#include <iomanip>
#include <iostream>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/rpc/grpc_util.h"
#include "common/spec/job_spec.h"
#include "common/status.h"
#include "common/util.h"

namespace tessera::client {

absl::StatusOr<ClientConfig> ResolveConfig(std::string address, std::string token, std::string ca_path,
                                           std::string config_path, bool insecure) {
  auto env = [](const char* k) { const char* v = std::getenv(k); return v ? std::string(v) : std::string(); };
  if (address.empty()) address = env("TESSERA_ADDRESS");
  if (token.empty()) token = env("TESSERA_TOKEN");
  if (ca_path.empty()) ca_path = env("TESSERA_CA_CERT");
  if (config_path.empty()) config_path = env("TESSERA_CONFIG");
  bool explicit_config = !config_path.empty();
  if (config_path.empty()) config_path = "/var/lib/tessera/admin.conf";
  if (address.empty() || token.empty() || (ca_path.empty() && !insecure)) {
    auto text = ReadFile(config_path);
    if (text.ok()) {
      try {
        auto j = nlohmann::json::parse(*text);
        if (address.empty()) address = j.value("address", "");
        if (token.empty()) token = j.value("token", "");
        if (ca_path.empty()) ca_path = j.value("ca_cert", "");
        insecure = insecure || j.value("insecure", false);
      } catch (const std::exception& e) {
        return absl::InvalidArgumentError(absl::StrCat("config file ", config_path, ": ", e.what()));
      }
    } else if (explicit_config) {
      return absl::InvalidArgumentError(absl::StrCat("config file: ", text.status().message()));
    }
  }
  if (address.empty())
    return absl::InvalidArgumentError("no controller address: pass --address, set TESSERA_ADDRESS, or --config");
  ClientConfig c;
  c.address = address;
  c.token = token;
  c.insecure = insecure;
  if (!insecure) {
    if (ca_path.empty()) return absl::InvalidArgumentError("no CA certificate: pass --ca-cert or set TESSERA_CA_CERT");
    auto ca = ReadFile(ca_path);
    if (!ca.ok()) return absl::InvalidArgumentError(absl::StrCat("CA certificate: ", ca.status().message()));
    c.ca_pem = *ca;
  }
  return c;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientConfig& cfg) {
  ChannelOptions o;
  o.address = cfg.address;
  o.ca_pem = cfg.ca_pem;
  o.insecure = cfg.insecure;
  TESSERA_ASSIGN_OR_RETURN(auto ch, MakeChannel(o));
  auto c = std::unique_ptr<Client>(new Client());
  c->cfg_ = cfg;
  c->jobs_ = v1::JobService::NewStub(ch);
  c->cluster_ = v1::ClusterService::NewStub(ch);
  return c;
}

namespace {
// One unary call with the client's token and a 30 s deadline.
template <typename Resp, typename Req, typename Fn>
absl::StatusOr<Resp> Unary(const std::string& token, const Req& req, Fn fn) {
  grpc::ClientContext ctx;
  PrepareContext(ctx, token, 30000);
  Resp resp;
  auto st = fn(&ctx, req, &resp);
  if (!st.ok()) return FromGrpc(st);
  return resp;
}
}  // namespace

absl::StatusOr<v1::SubmitJobResponse> Client::Submit(const v1::JobSpec& spec, const std::string& sid) {
  v1::SubmitJobRequest req;
  *req.mutable_spec() = spec;
  req.set_submission_id(sid);
  return Unary<v1::SubmitJobResponse>(cfg_.token, req, [&](auto* c, auto& r, auto* o) { return jobs_->SubmitJob(c, r, o); });
}

absl::StatusOr<v1::Job> Client::Get(const std::string& id) {
  v1::GetJobRequest req;
  req.set_job_id(id);
  auto r = Unary<v1::GetJobResponse>(cfg_.token, req, [&](auto* c, auto& q, auto* o) { return jobs_->GetJob(c, q, o); });
  if (!r.ok()) return r.status();
  return r->job();
}

absl::StatusOr<std::vector<v1::Job>> Client::List(int limit, const std::vector<v1::JobState>& states) {
  std::vector<v1::Job> out;
  v1::ListJobsRequest req;
  for (v1::JobState s : states) req.add_states(s);
  do {  // page by page until `limit` jobs (or all: limit <= 0)
    req.set_limit(limit > 0 ? std::min<int>(limit - static_cast<int>(out.size()), 1000) : 1000);
    auto r = Unary<v1::ListJobsResponse>(cfg_.token, req, [&](auto* c, auto& q, auto* o) { return jobs_->ListJobs(c, q, o); });
    if (!r.ok()) return r.status();
    out.insert(out.end(), r->jobs().begin(), r->jobs().end());
    req.set_page_token(r->next_page_token());
  } while (!req.page_token().empty() && (limit <= 0 || static_cast<int>(out.size()) < limit));
  return out;
}

absl::StatusOr<v1::Job> Client::Stop(const std::string& id, const std::string& reason) {
  v1::StopJobRequest req;
  req.set_job_id(id);
  req.set_reason(reason);
  auto r = Unary<v1::StopJobResponse>(cfg_.token, req, [&](auto* c, auto& q, auto* o) { return jobs_->StopJob(c, q, o); });
  if (!r.ok()) return r.status();
  return r->job();
}

absl::StatusOr<v1::GetClusterStatusResponse> Client::Status() {
  return Unary<v1::GetClusterStatusResponse>(cfg_.token, v1::GetClusterStatusRequest{},
                                             [&](auto* c, auto& q, auto* o) { return cluster_->GetClusterStatus(c, q, o); });
}

absl::StatusOr<v1::NodeStatus> Client::Drain(const std::string& node_id, bool move_jobs, bool undo) {
  v1::DrainNodeRequest req;
  req.set_node_id(node_id), req.set_move_jobs(move_jobs), req.set_undo(undo);
  auto r = Unary<v1::DrainNodeResponse>(cfg_.token, req, [&](auto* c, auto& q, auto* o) { return cluster_->DrainNode(c, q, o); });
  if (!r.ok()) return r.status();
  return r->node();
}

namespace {
std::string Clock(int64_t ms) {
  std::time_t t = ms / 1000;
  std::tm tm;
  localtime_r(&t, &tm);
  char b[16];
  std::strftime(b, sizeof(b), "%H:%M:%S", &tm);
  return b;
}
}  // namespace

absl::StatusOr<v1::Job> Client::Watch(const std::string& id, std::ostream& out, int64_t reconnect_ms) {
  int64_t seq = 0;
  std::string epoch;
  int64_t first_progress_ms = 0;
  int64_t lost_since = 0;  // MonoMs() when the controller was last lost; 0 while connected
  int64_t backoff_ms = 250;
  while (true) {
    grpc::ClientContext ctx;
    PrepareContext(ctx, cfg_.token, 0);
    ctx.set_wait_for_ready(lost_since != 0);  // reconnecting: wait for the channel, within the budget
    if (lost_since != 0)
      ctx.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(std::max<int64_t>(1000, reconnect_ms - (MonoMs() - lost_since))));
    v1::WatchJobRequest req;
    req.set_job_id(id);
    req.set_from_seq(seq);
    req.set_epoch(epoch);
    auto reader = jobs_->WatchJob(&ctx, req);
    v1::WatchJobResponse r;
    while (reader->Read(&r)) {
      if (lost_since != 0) {
        out << "[" << Clock(NowMs()) << "] reconnected to the controller\n";
        lost_since = 0, backoff_ms = 250;
      }
      if (r.epoch() != epoch) seq = 0;  // another state database: its events are numbered anew
      epoch = r.epoch();
      const auto& e = r.event();
      seq = e.seq();
      if (e.has_progress()) {
        const auto& p = e.progress();
        out << "[" << Clock(e.time_ms()) << "]   ";
        if (p.total_steps() > 0) {
          // A bar and an ETA from the rate so far (lines, not redraws: logs stay readable).
          if (first_progress_ms == 0) first_progress_ms = e.time_ms();
          const int width = 20;
          int filled = static_cast<int>(width * p.step() / p.total_steps());
          out << "[" << std::string(filled, '#') << std::string(width - filled, '.') << "] " << p.step() << "/"
              << p.total_steps();
          if (p.step() > 0 && p.step() < p.total_steps()) {
            double per = static_cast<double>(e.time_ms() - first_progress_ms) / p.step();
            out << " ETA " << static_cast<int>(per * (p.total_steps() - p.step()) / 1000 + 0.5) << "s";
          }
          out << "  ";
        }
        out << p.message();
        // In one order every line (a protobuf map iterates in no fixed order).
        const std::map<std::string, double> metrics(p.metrics().begin(), p.metrics().end());
        for (const auto& [k, v] : metrics) out << "  " << k << "=" << absl::StrFormat("%.3g", v);
        out << "\n";
      } else {
        out << "[" << Clock(e.time_ms()) << "] " << JobStateName(e.state()) << " (attempt " << e.attempt() << ")"
            << (e.reason().empty() ? "" : ": " + e.reason()) << "\n";
      }
      out.flush();
    }
    auto st = reader->Finish();
    if (st.ok()) return Get(id);
    // A controller that restarts (or is briefly unreachable) ends the stream UNAVAILABLE
    // (or CANCELLED, as its server shuts down, or DEADLINE_EXCEEDED while reconnecting):
    // watch again from where the stream stopped, until reconnect_ms without one.
    const bool transient = st.error_code() == grpc::UNAVAILABLE || st.error_code() == grpc::CANCELLED ||
                           (lost_since != 0 && st.error_code() == grpc::DEADLINE_EXCEEDED);
    if (!transient) return FromGrpc(st);
    if (lost_since == 0) {
      lost_since = MonoMs();
      out << "[" << Clock(NowMs()) << "] lost the controller (" << st.error_message() << "); reconnecting\n";
      out.flush();
    }
    if (MonoMs() - lost_since > reconnect_ms)
      return absl::UnavailableError(absl::StrCat("lost the controller while watching job ", id, " and could not reconnect in ",
                                                 reconnect_ms / 1000, " s (", st.error_message(), "); the job may still run: ",
                                                 "`tessera job status ", id, "`"));
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms = std::min<int64_t>(backoff_ms * 2, 5000);
  }
}

absl::Status Client::Logs(const std::string& id, int rank, int attempt, bool follow, std::ostream& out) {
  grpc::ClientContext ctx;
  PrepareContext(ctx, cfg_.token, 0);
  v1::GetLogsRequest req;
  req.set_job_id(id);
  if (rank >= 0) req.set_rank(rank);
  req.set_attempt(attempt);
  req.set_follow(follow);
  auto reader = jobs_->GetLogs(&ctx, req);
  v1::GetLogsResponse r;
  while (reader->Read(&r))
    for (const auto& l : r.lines())
      out << "[attempt " << l.attempt() << " executor " << l.executor() << " " << l.node_id() << "] " << l.text() << "\n";
  return FromGrpc(reader->Finish());
}

absl::StatusOr<v1::Job> Client::WaitDone(const std::string& id, int64_t timeout_ms) {
  const int64_t start = MonoMs();
  int64_t sleep_ms = 100;
  while (true) {
    auto j = Get(id);
    if (!j.ok()) return j.status();
    if (IsTerminal(j->state())) return j;
    if (timeout_ms > 0 && MonoMs() - start >= timeout_ms)
      return absl::DeadlineExceededError(absl::StrCat("job ", id, " is still ", JobStateName(j->state()), " after ",
                                                      timeout_ms / 1000.0, " s"));
    int64_t nap = sleep_ms;
    if (timeout_ms > 0) nap = std::min(nap, timeout_ms - (MonoMs() - start));
    std::this_thread::sleep_for(std::chrono::milliseconds(std::max<int64_t>(nap, 1)));
    sleep_ms = std::min<int64_t>(sleep_ms * 2, 2000);
  }
}

std::string ShortDuration(int64_t ms) {
  if (ms < 0) return "-";
  const int64_t s = ms / 1000, m = s / 60, h = m / 60, d = h / 24;
  if (s < 60) return absl::StrCat(s, "s");
  if (m < 60) return s % 60 ? absl::StrCat(m, "m", s % 60, "s") : absl::StrCat(m, "m");
  if (h < 24) return m % 60 ? absl::StrCat(h, "h", m % 60, "m") : absl::StrCat(h, "h");
  return h % 24 ? absl::StrCat(d, "d", h % 24, "h") : absl::StrCat(d, "d");
}

absl::StatusOr<v1::JobState> ParseJobState(const std::string& name) {
  std::string n = absl::AsciiStrToUpper(name);
  if (!absl::StartsWith(n, "JOB_STATE_")) n = "JOB_STATE_" + n;
  v1::JobState s;
  if (n != "JOB_STATE_UNSPECIFIED" && v1::JobState_Parse(n, &s)) return s;
  std::string names;
  for (int i = v1::JobState_MIN; i <= v1::JobState_MAX; ++i)
    if (v1::JobState_IsValid(i) && i != v1::JOB_STATE_UNSPECIFIED)
      names += absl::StrCat(names.empty() ? "" : ", ", JobStateName(static_cast<v1::JobState>(i)));
  return absl::InvalidArgumentError(absl::StrCat("--state: no job state '", name, "'; one of ", names));
}

void PrintJobs(const std::vector<v1::Job>& jobs, bool json, std::ostream& out, int64_t now_ms) {
  if (json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& j : jobs) {
      std::string s;
      google::protobuf::util::MessageToJsonString(j, &s);
      arr.push_back(nlohmann::json::parse(s));
    }
    out << arr.dump(2) << "\n";
    return;
  }
  out << absl::StrFormat("%-28s %-12s %-11s %7s %8s %7s %8s  %s\n", "JOB", "KIND", "STATE", "ATTEMPT", "RESTARTS", "AGE",
                         "DURATION", "REASON");
  for (const auto& j : jobs) {
    const int64_t end = j.finished_ms() > 0 ? j.finished_ms() : now_ms;
    out << absl::StrFormat("%-28s %-12s %-11s %7d %8d %7s %8s  %s\n", j.job_id(), j.spec().kind(), JobStateName(j.state()),
                           j.attempt(), j.restarts(), j.created_ms() > 0 ? ShortDuration(now_ms - j.created_ms()) : "-",
                           j.started_ms() > 0 ? ShortDuration(end - j.started_ms()) : "-", j.reason());
  }
}

void PrintJob(const v1::Job& j, bool json, std::ostream& out) {
  if (json) {
    std::string s;
    google::protobuf::util::JsonPrintOptions o;
    o.add_whitespace = true;
    google::protobuf::util::MessageToJsonString(j, &s, o);
    out << s << "\n";
    return;
  }
  out << "job:       " << j.job_id() << "\nkind:      " << j.spec().kind() << "\nstate:     " << JobStateName(j.state())
      << (j.reason().empty() ? "" : " (" + j.reason() + ")") << "\nattempt:   " << j.attempt()
      << "\nrestarts:  " << j.restarts() << " of " << j.spec().max_restarts() << "\n";
  for (const auto& g : j.spec().groups())
    out << "group:     " << g.name() << " (" << g.devices() << " " << (g.device_type() == v1::DEVICE_TYPE_GPU ? "gpu" : "cpu")
        << ", tp=" << g.layout().tp() << " cp=" << g.layout().cp() << " dp=" << g.layout().dp() << " pp=" << g.layout().pp() << ")\n";
  for (const auto& a : j.assignments()) {
    out << "executor " << a.executor() << ": node " << a.node_id() << " " << (a.device_type() == v1::DEVICE_TYPE_GPU ? "gpu" : "cpu")
        << ":" << a.device_index();
    for (const auto& r : a.ranks()) out << "  " << r.group() << "[" << r.rank() << "]";
    out << "\n";
  }
  if (!j.result_json().empty()) PrintCommCheckTable(j.result_json(), out);
}

void PrintCluster(const v1::GetClusterStatusResponse& s, bool json, std::ostream& out) {
  if (json) {
    std::string t;
    google::protobuf::util::JsonPrintOptions o;
    o.add_whitespace = true;
    google::protobuf::util::MessageToJsonString(s, &t, o);
    out << t << "\n";
    return;
  }
  out << "controller: " << s.controller_version() << "\n";
  out << absl::StrFormat("%-20s %-9s %-16s %5s %5s %5s %5s  %s\n", "NODE", "STATE", "ADDRESS", "GPU", "GPU", "CPU", "CPU", "VERSION");
  out << absl::StrFormat("%-20s %-9s %-16s %5s %5s %5s %5s\n", "", "", "", "used", "total", "used", "total");
  for (const auto& n : s.nodes()) {
    int gu = 0, gt = 0, cu = 0, ct = 0;
    for (const auto& d : n.devices()) {
      bool used = !d.used_by_job().empty();
      if (d.type() == v1::DEVICE_TYPE_GPU) { gt++; gu += used; } else { ct++; cu += used; }
    }
    out << absl::StrFormat("%-20s %-9s %-16s %5d %5d %5d %5d  %s\n", n.node_id(), NodeStateName(n.state()), n.address(),
                           gu, gt, cu, ct, n.version());
  }
  for (const auto& [st, n] : s.jobs_by_state()) out << "jobs " << st << ": " << n << "\n";
}

void PrintCommCheckTable(const std::string& result_json, std::ostream& out) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(result_json);
  } catch (...) {
    out << result_json << "\n";
    return;
  }
  if (!j.contains("comm_check")) return;
  out << absl::StrFormat("%-8s %-10s %-15s %10s %6s %11s %10s %10s  %s\n", "GROUP", "KIND", "COLLECTIVE", "SIZE", "RANKS",
                         "TIME(us)", "ALGBW", "BUSBW", "CHECK");
  for (const auto& r : j["comm_check"])
    out << absl::StrFormat("%-8s %-10s %-15s %10s %6d %11.1f %8.2fGB/s %8.2fGB/s  %s\n", r["group"].get<std::string>(),
                           r["kind"].get<std::string>(), r["collective"].get<std::string>(),
                           FormatBytes(r["size"].get<int64_t>()), r["group_size"].get<int>(), r["time_us"].get<double>(),
                           r["algbw_gbps"].get<double>(), r["busbw_gbps"].get<double>(),
                           r["errors"].get<int64_t>() == 0 ? "ok" : "FAILED");
}

}  // namespace tessera::client
