#include "controller/services.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_util.h"
#include "common/spec/job_spec.h"
#include "common/status.h"
#include "common/util.h"

namespace tessera::controller {
namespace {

using grpc::ServerContext;
using grpc::Status;

class RpcMetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcMetricsInterceptor(grpc::experimental::ServerRpcInfo* info, Metrics* m)
      : method_(info->method() != nullptr ? info->method() : ""), m_(m), t0_(std::chrono::steady_clock::now()) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
      // gRPC status codes are absl::StatusCode values: one set of names.
      m_->ObserveRpc(method_, absl::StatusCodeToString(static_cast<absl::StatusCode>(methods->GetSendStatus().error_code())), s);
    }
    methods->Proceed();
  }

 private:
  std::string method_;
  Metrics* m_;
  std::chrono::steady_clock::time_point t0_;
};

class RpcMetricsFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsFactory(Metrics* m) : m_(m) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new RpcMetricsInterceptor(info, m_);
  }

 private:
  Metrics* m_;
};

Status Authorize(const ServiceDeps& d, ServerContext* ctx, Role need) {
  auto p = d.tokens->Check(BearerToken(ctx), need);
  return p.ok() ? Status::OK : ToGrpc(p.status());
}

class JobServiceImpl final : public v1::JobService::Service {
 public:
  explicit JobServiceImpl(ServiceDeps d) : d_(std::move(d)) {}

  Status SubmitJob(ServerContext* ctx, const v1::SubmitJobRequest* req, v1::SubmitJobResponse* resp) override {
    if (auto s = Authorize(d_, ctx, Role::kSubmit); !s.ok()) return s;
    if (req->submission_id().size() > 128)
      return Status(grpc::INVALID_ARGUMENT, "submission_id: longer than 128 characters");
    v1::JobSpec spec = req->spec();
    if (auto st = NormalizeAndValidateJobSpec(spec); !st.ok()) return ToGrpc(st);
    if (auto st = CheckJobPaths(spec, d_.path_roots); !st.ok()) return ToGrpc(st);
    auto r = d_.jobs->Submit(spec, req->submission_id());
    if (!r.ok()) return ToGrpc(r.status());
    *resp->mutable_job() = r->first;
    resp->set_created(r->second);
    return Status::OK;
  }

  Status GetJob(ServerContext* ctx, const v1::GetJobRequest* req, v1::GetJobResponse* resp) override {
    if (auto s = Authorize(d_, ctx, Role::kRead); !s.ok()) return s;
    auto j = d_.jobs->GetJob(req->job_id());
    if (!j.ok()) return ToGrpc(j.status());
    *resp->mutable_job() = *j;
    return Status::OK;
  }

  Status ListJobs(ServerContext* ctx, const v1::ListJobsRequest* req, v1::ListJobsResponse* resp) override {
    if (auto s = Authorize(d_, ctx, Role::kRead); !s.ok()) return s;
    std::set<v1::JobState> states;
    for (int s : req->states()) states.insert(static_cast<v1::JobState>(s));
    for (int s : req->states())
      if (!v1::JobState_IsValid(s)) return Status(grpc::INVALID_ARGUMENT, absl::StrCat("states: unknown job state ", s));
    auto page = d_.jobs->ListJobs(states, req->limit(), req->page_token());
    if (!page.ok()) return ToGrpc(page.status());
    for (auto& j : page->jobs) *resp->add_jobs() = std::move(j);
    resp->set_next_page_token(page->next_page_token);
    return Status::OK;
  }

  Status StopJob(ServerContext* ctx, const v1::StopJobRequest* req, v1::StopJobResponse* resp) override {
    if (auto s = Authorize(d_, ctx, Role::kSubmit); !s.ok()) return s;
    auto j = d_.jobs->Stop(req->job_id(), req->reason());
    if (!j.ok()) return ToGrpc(j.status());
    *resp->mutable_job() = *j;
    return Status::OK;
  }

  Status WatchJob(ServerContext* ctx, const v1::WatchJobRequest* req,
                  grpc::ServerWriter<v1::WatchJobResponse>* w) override {
    if (auto s = Authorize(d_, ctx, Role::kRead); !s.ok()) return s;
    // A caller resuming a stream numbered by another state database starts over.
    int64_t seq = req->epoch().empty() || req->epoch() == d_.jobs->epoch() ? req->from_seq() : 0;
    while (!ctx->IsCancelled()) {
      bool done = false;
      auto evs = d_.jobs->WaitEvents(req->job_id(), seq, 1000, &done);
      if (!evs.ok()) return ToGrpc(evs.status());
      for (auto& e : *evs) {
        seq = e.seq();
        v1::WatchJobResponse r;
        r.set_epoch(d_.jobs->epoch());
        *r.mutable_event() = std::move(e);
        if (!w->Write(r)) return Status::OK;
      }
      if (done && evs->empty()) return Status::OK;
    }
    return Status(grpc::CANCELLED, "watch cancelled");
  }

  Status GetLogs(ServerContext* ctx, const v1::GetLogsRequest* req, grpc::ServerWriter<v1::GetLogsResponse>* w) override {
    if (auto s = Authorize(d_, ctx, Role::kRead); !s.ok()) return s;
    const int rank = req->has_rank() ? req->rank() : -1;
    if (rank < -1) return Status(grpc::INVALID_ARGUMENT, "rank: an executor index (>= 0), or unset for all");
    auto job = d_.jobs->GetJob(req->job_id());
    if (!job.ok()) return ToGrpc(job.status());
    std::map<std::pair<int, int>, LogStore::Cursor> cursors;
    while (!ctx->IsCancelled()) {
      bool terminal = d_.jobs->IsTerminal(req->job_id());
      for (auto& c : d_.logs->List(req->job_id(), req->attempt(), rank))
        cursors.try_emplace({c.attempt, c.executor}, c);
      bool any = false;
      for (auto& [k, c] : cursors) {
        while (true) {
          auto lines = d_.logs->ReadNew(req->job_id(), c, 1000);
          if (lines.empty()) break;
          any = true;
          v1::GetLogsResponse r;
          for (auto& l : lines) *r.add_lines() = std::move(l);
          if (!w->Write(r)) return Status::OK;
        }
      }
      if (!req->follow() || (terminal && !any)) return Status::OK;
      if (!any) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return Status::OK;
  }

 private:
  ServiceDeps d_;
};

class ClusterServiceImpl final : public v1::ClusterService::Service {
 public:
  explicit ClusterServiceImpl(ServiceDeps d) : d_(std::move(d)) {}
  Status GetClusterStatus(ServerContext* ctx, const v1::GetClusterStatusRequest*, v1::GetClusterStatusResponse* resp) override {
    if (auto s = Authorize(d_, ctx, Role::kRead); !s.ok()) return s;
    *resp = d_.jobs->ClusterStatus();
    return Status::OK;
  }
  Status DrainNode(ServerContext* ctx, const v1::DrainNodeRequest* req, v1::DrainNodeResponse* resp) override {
    if (auto s = Authorize(d_, ctx, Role::kAdmin); !s.ok()) return s;
    auto n = d_.jobs->Drain(req->node_id(), req->move_jobs(), req->undo());
    if (!n.ok()) return ToGrpc(n.status());
    *resp->mutable_node() = *n;
    return Status::OK;
  }

 private:
  ServiceDeps d_;
};

class StreamLink final : public AgentLink {
 public:
  explicit StreamLink(grpc::ServerReaderWriter<v1::ControllerMessage, v1::AgentMessage>* s) : s_(s) {}
  bool Send(const v1::ControllerMessage& m) override {
    std::lock_guard<std::mutex> l(mu_);
    if (!s_) return false;
    return s_->Write(m);
  }
  void Close() {
    std::lock_guard<std::mutex> l(mu_);
    s_ = nullptr;
  }

 private:
  std::mutex mu_;
  grpc::ServerReaderWriter<v1::ControllerMessage, v1::AgentMessage>* s_;
};

// Failed join attempts, logged with the peer's address (never the token offered): at
// most one line per peer host every 10 s, saying how many more there were meanwhile.
class JoinFailureLog {
 public:
  void Note(const std::string& peer) {
    const std::string host = PeerHost(peer);
    const int64_t now = MonoMs();
    std::lock_guard<std::mutex> l(mu_);
    if (hosts_.size() > 1024) hosts_.clear();  // bounded, whoever knocks
    auto& h = hosts_[host];
    ++h.count;
    if (h.last_logged != 0 && now - h.last_logged < 10000) return;
    spdlog::warn("refused an agent join from {} (join token missing or wrong){}", peer,
                 h.count > 1 ? absl::StrCat("; ", h.count - 1, " more from ", host, " since the last report") : "");
    h.last_logged = now, h.count = 0;
  }

 private:
  // "ipv4:10.0.0.5:41234" -> "ipv4:10.0.0.5"
  static std::string PeerHost(const std::string& peer) {
    auto c = peer.rfind(':');
    return c == std::string::npos ? peer : peer.substr(0, c);
  }
  struct Host {
    int64_t last_logged = 0;
    int64_t count = 0;
  };
  std::mutex mu_;
  std::map<std::string, Host> hosts_;
};

class NodeServiceImpl final : public v1::NodeService::Service {
 public:
  explicit NodeServiceImpl(ServiceDeps d) : d_(std::move(d)) {}

  Status CheckJoin(ServerContext* ctx) {
    if (!ConstantTimeEquals(BearerToken(ctx), d_.join_token)) {
      join_failures_.Note(ctx->peer());
      return Status(grpc::UNAUTHENTICATED, "agent join token is missing or wrong");
    }
    return Status::OK;
  }

  Status RegisterNode(ServerContext* ctx, const v1::RegisterNodeRequest* req, v1::RegisterNodeResponse* resp) override {
    if (auto s = CheckJoin(ctx); !s.ok()) return s;
    if (!IsSafeName(req->node_id()))
      return Status(grpc::INVALID_ARGUMENT, absl::StrCat("node_id: '", req->node_id().substr(0, 64),
                                                         "' must be 1-253 characters of letters, digits, '-', '_' and '.', "
                                                         "starting with a letter or digit"));
    if (req->address().size() > 1024 || req->hostname().size() > 1024 || req->version().size() > 1024 ||
        req->devices_size() > 1024 || req->running_size() > 65536)
      return Status(grpc::INVALID_ARGUMENT, "RegisterNode: a field is larger than any node has");
    if (req->address().empty()) return Status(grpc::INVALID_ARGUMENT, "address: required (host executors listen on)");
    if (auto st = d_.jobs->RegisterNode(*req); !st.ok()) return ToGrpc(st);
    std::vector<std::string> ips, dns = {kExecutorTlsName};
    auto kp = IssueCert(d_.ca, req->node_id(), dns, ips, 365);
    if (!kp.ok()) return ToGrpc(kp.status());
    resp->set_node_cert_pem(kp->cert_pem);
    resp->set_node_key_pem(kp->key_pem);
    resp->set_ca_cert_pem(d_.ca.cert_pem);
    resp->set_lease_ttl_ms(d_.cfg.lease_ttl_ms);
    resp->set_heartbeat_interval_ms(d_.cfg.heartbeat_interval_ms);
    return Status::OK;
  }

  Status Connect(ServerContext* ctx, grpc::ServerReaderWriter<v1::ControllerMessage, v1::AgentMessage>* stream) override {
    if (auto s = CheckJoin(ctx); !s.ok()) return s;
    v1::AgentMessage m;
    if (!stream->Read(&m) || !m.has_hello())
      return Status(grpc::INVALID_ARGUMENT, "the first message on Connect must be hello");
    const std::string node = m.hello().node_id();
    const int64_t inc = m.hello().incarnation();
    auto link = std::make_shared<StreamLink>(stream);
    if (auto st = d_.jobs->AttachAgent(node, inc, link); !st.ok()) return ToGrpc(st);
    absl::Status fenced;
    while (fenced.ok() && stream->Read(&m)) {
      switch (m.msg_case()) {
        case v1::AgentMessage::kHeartbeat: {
          fenced = d_.jobs->OnHeartbeat(node, inc, m.heartbeat());  // a newer agent took the node: end this stream
          if (!fenced.ok()) break;
          v1::ControllerMessage ack;
          ack.mutable_heartbeat_ack()->set_agent_time_ms(m.heartbeat().time_ms());
          ack.mutable_heartbeat_ack()->set_lease_ttl_ms(d_.cfg.lease_ttl_ms);
          link->Send(ack);
          break;
        }
        case v1::AgentMessage::kExecutorEvent: d_.jobs->OnExecutorEvent(node, m.executor_event()); break;
        case v1::AgentMessage::kLogs: d_.jobs->OnLogs(node, m.logs()); break;
        default: break;
      }
    }
    d_.jobs->DetachAgent(node, link.get());
    link->Close();
    return ToGrpc(fenced);
  }

 private:
  ServiceDeps d_;
  JoinFailureLog join_failures_;
};

class RendezvousServiceImpl final : public v1::RendezvousService::Service {
 public:
  explicit RendezvousServiceImpl(ServiceDeps d) : d_(std::move(d)) {}

  Status Check(ServerContext* ctx, const v1::Scope& s, const std::string& key) {
    if (key.size() > 1024) return Status(grpc::INVALID_ARGUMENT, "key: longer than 1024 bytes");
    return ToGrpc(d_.jobs->CheckScope(s.job_id(), s.attempt(), BearerToken(ctx)));
  }
  static Rendezvous::ScopeKey K(const v1::Scope& s) { return {s.job_id(), s.attempt()}; }

  Status Set(ServerContext* ctx, const v1::SetRequest* req, v1::SetResponse*) override {
    if (auto s = Check(ctx, req->scope(), req->key()); !s.ok()) return s;
    if (req->value().size() > (1 << 20)) return Status(grpc::INVALID_ARGUMENT, "value: larger than 1 MiB");
    d_.rdv->Set(K(req->scope()), req->key(), req->value());
    return Status::OK;
  }
  Status Get(ServerContext* ctx, const v1::GetRequest* req, v1::GetResponse* resp) override {
    if (auto s = Check(ctx, req->scope(), req->key()); !s.ok()) return s;
    int64_t timeout = std::clamp<int64_t>(req->timeout_ms(), 0, 600000);
    auto v = d_.rdv->Get(K(req->scope()), req->key(), timeout);
    if (!v.ok()) return ToGrpc(v.status());
    resp->set_value(*v);
    return Status::OK;
  }
  Status Add(ServerContext* ctx, const v1::AddRequest* req, v1::AddResponse* resp) override {
    if (auto s = Check(ctx, req->scope(), req->key()); !s.ok()) return s;
    resp->set_value(d_.rdv->Add(K(req->scope()), req->key(), req->delta()));
    return Status::OK;
  }
  Status Barrier(ServerContext* ctx, const v1::BarrierRequest* req, v1::BarrierResponse*) override {
    if (auto s = Check(ctx, req->scope(), req->key()); !s.ok()) return s;
    if (req->world() < 1) return Status(grpc::INVALID_ARGUMENT, "world: must be >= 1");
    return ToGrpc(d_.rdv->Barrier(K(req->scope()), req->key(), req->world(), std::clamp<int64_t>(req->timeout_ms(), 0, 600000)));
  }
  Status CheckAttempt(ServerContext* ctx, const v1::CheckAttemptRequest* req, v1::CheckAttemptResponse*) override {
    return Check(ctx, req->scope(), "");
  }
  Status RegisterExecutor(ServerContext* ctx, const v1::RegisterExecutorRequest* req, v1::RegisterExecutorResponse*) override {
    if (auto s = Check(ctx, req->scope(), ""); !s.ok()) return s;
    return ToGrpc(d_.jobs->RegisterExecutor(req->scope().job_id(), req->scope().attempt(), req->executor(), req->address()));
  }

 private:
  ServiceDeps d_;
};

}  // namespace

std::unique_ptr<v1::JobService::Service> MakeJobService(ServiceDeps d) { return std::make_unique<JobServiceImpl>(std::move(d)); }
std::unique_ptr<v1::ClusterService::Service> MakeClusterService(ServiceDeps d) { return std::make_unique<ClusterServiceImpl>(std::move(d)); }
std::unique_ptr<v1::NodeService::Service> MakeNodeService(ServiceDeps d) { return std::make_unique<NodeServiceImpl>(std::move(d)); }
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> MakeRpcMetricsInterceptors(Metrics* m) {
  return std::make_unique<RpcMetricsFactory>(m);
}

std::unique_ptr<v1::RendezvousService::Service> MakeRendezvousService(ServiceDeps d) { return std::make_unique<RendezvousServiceImpl>(std::move(d)); }

}  // namespace tessera::controller
