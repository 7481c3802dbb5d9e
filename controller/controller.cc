#include "controller/controller.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/ascii.h"
#include "common/rpc/grpc_util.h"
#include "common/rpc/tensor_stream.h"
#include "common/status.h"
#include "common/util.h"
#include "common/version.h"
#include "controller/services.h"
#include "tessera/v1/executor_service.grpc.pb.h"

namespace tessera::controller {
namespace {

// An executor's answer on a stream of R: its statistics first, then a batch in chunks.
// Take every message read (after the first error it only drains: Finish wants the
// stream read to its end); Done, after Finish, gives the statistics and the batch.
template <class R>
class StatsThenBatch {
 public:
  using Stats = std::decay_t<decltype(std::declval<R&>().stats())>;
  explicit StatsThenBatch(const char* op) : op_(op) {}
  void Take(R& m) {
    if (!bad_.ok()) return;
    if (m.has_stats() && !stats_) stats_ = std::move(*m.mutable_stats());
    else if (m.has_chunk() && stats_) bad_ = batch_.Add(std::move(*m.mutable_chunk()));
    else bad_ = absl::InternalError(absl::StrCat(op_, ": the stream does not start with the statistics"));
  }
  absl::StatusOr<Stats> Done(v1::TensorBatch* batch) && {
    if (!bad_.ok()) return bad_;
    if (!stats_) return absl::InternalError(absl::StrCat(op_, ": the stream ended without the statistics"));
    TESSERA_ASSIGN_OR_RETURN(*batch, std::move(batch_).Finish());
    return *std::move(stats_);
  }

 private:
  const char* op_;
  std::optional<Stats> stats_;
  BatchAssembler batch_;
  absl::Status bad_;
};


constexpr const char* kSecretFiles[] = {"ca.crt", "ca.key", "join-token", "tokens"};

absl::StatusOr<KeyPair> LoadOrMakeCa(const std::string& dir, bool read_only) {
  auto cert = ReadFile(dir + "/ca.crt");
  auto key = ReadFile(dir + "/ca.key");
  if (cert.ok() && key.ok()) return KeyPair{*cert, *key};
  if (read_only)
    return absl::FailedPreconditionError(absl::StrCat("--secrets-dir ", dir, ": no ca.crt and ca.key (make them with ",
                                                      "`tessera-controller init-secrets --out DIR`)"));
  TESSERA_ASSIGN_OR_RETURN(KeyPair ca, MakeCa("tessera-ca"));
  TESSERA_RETURN_IF_ERROR(WriteFileAtomic(dir + "/ca.key", ca.key_pem, 0600));
  TESSERA_RETURN_IF_ERROR(WriteFileAtomic(dir + "/ca.crt", ca.cert_pem, 0644));
  spdlog::info("created a CA in {}", dir);
  return ca;
}

absl::StatusOr<std::string> LoadOrMakeSecret(const std::string& path, bool read_only) {
  auto s = ReadFile(path);
  if (s.ok()) {
    std::string v(absl::StripAsciiWhitespace(*s));
    if (!v.empty()) return v;
  }
  if (read_only) return absl::FailedPreconditionError(absl::StrCat("--secrets-dir: ", path, " is missing or empty"));
  std::string v = RandomHex(24);
  TESSERA_RETURN_IF_ERROR(WriteFileAtomic(path, v + "\n", 0600));
  return v;
}

class GrpcExecutorClient final : public ExecutorClient {
 public:
  GrpcExecutorClient(std::shared_ptr<grpc::Channel> ch, const ExecutorTarget& t)
      : stub_(v1::ExecutorService::NewStub(ch)), secret_(t.secret), executor_(std::to_string(t.executor)),
        where_(absl::StrCat("executor ", t.executor, " on node ", t.node_id)) {}
  std::string where() const override { return where_; }

  // A call's context, registered so that Cancel reaches it; End unregisters it.
  absl::StatusOr<std::shared_ptr<grpc::ClientContext>> Begin(int64_t timeout_ms) {
    auto ctx = std::make_shared<grpc::ClientContext>();
    PrepareContext(*ctx, secret_, timeout_ms);
    ctx->AddMetadata(kExecutorMetadata, executor_);
    // The executor registered its address, so it listens: a failed connection attempt
    // (a loaded host) is retried until the deadline instead of failing the call at once.
    // A dead executor does not leave the call waiting: its exit tears the attempt down,
    // which cancels every call in flight (Cancel).
    ctx->set_wait_for_ready(true);
    std::lock_guard<std::mutex> l(mu_);
    if (cancelled_) return absl::CancelledError("the attempt was torn down");
    active_.insert(ctx.get());
    return ctx;
  }
  void End(grpc::ClientContext* ctx) {
    std::lock_guard<std::mutex> l(mu_);
    active_.erase(ctx);
  }

  template <typename Req, typename Resp>
  absl::StatusOr<Resp> Unary(grpc::Status (v1::ExecutorService::Stub::*rpc)(grpc::ClientContext*, const Req&, Resp*),
                             const Req& req, int64_t timeout_ms) {
    TESSERA_ASSIGN_OR_RETURN(auto ctx, Begin(timeout_ms));
    Resp resp;
    grpc::Status st = (stub_.get()->*rpc)(ctx.get(), req, &resp);
    End(ctx.get());
    if (!st.ok()) return FromGrpc(st);
    return resp;
  }

  absl::StatusOr<v1::InitGroupResponse> InitGroup(const v1::InitGroupRequest& q, int64_t t) override {
    return Unary(&v1::ExecutorService::Stub::InitGroup, q, t);
  }
  absl::StatusOr<v1::CommCheckResponse> CommCheck(const v1::CommCheckRequest& q, int64_t t) override {
    return Unary(&v1::ExecutorService::Stub::CommCheck, q, t);
  }
  absl::StatusOr<v1::TrainInitResponse> TrainInit(const v1::TrainInitRequest& q, int64_t t) override {
    return Unary(&v1::ExecutorService::Stub::TrainInit, q, t);
  }
  absl::StatusOr<v1::TrainStepResponse> TrainStep(const v1::TrainStepRequest& q, int64_t t) override {
    return Unary(&v1::ExecutorService::Stub::TrainStep, q, t);
  }
  absl::StatusOr<v1::RolloutInitResponse> RolloutInit(const v1::RolloutInitRequest& q, int64_t t) override {
    return Unary(&v1::ExecutorService::Stub::RolloutInit, q, t);
  }
  absl::StatusOr<v1::RlEvalResponse> RlEval(const v1::RlEvalRequest& q, int64_t t) override {
    return Unary(&v1::ExecutorService::Stub::RlEval, q, t);
  }
  absl::StatusOr<v1::BridgeInitResponse> BridgeInit(const v1::BridgeInitRequest& q, int64_t t) override {
    return Unary(&v1::ExecutorService::Stub::BridgeInit, q, t);
  }
  absl::StatusOr<v1::SyncWeightsResponse> SyncWeights(const v1::SyncWeightsRequest& q, int64_t t) override {
    return Unary(&v1::ExecutorService::Stub::SyncWeights, q, t);
  }
  absl::StatusOr<v1::WeightsDigestResponse> WeightsDigest(const v1::WeightsDigestRequest& q, int64_t t) override {
    return Unary(&v1::ExecutorService::Stub::WeightsDigest, q, t);
  }
  absl::StatusOr<v1::GenerateResponse> Generate(const v1::GenerateRequest& q, int64_t t) override {
    return Unary(&v1::ExecutorService::Stub::Generate, q, t);
  }
  absl::Status Shutdown(int64_t timeout_ms) override {
    return Unary(&v1::ExecutorService::Stub::Shutdown, v1::ShutdownRequest{}, timeout_ms).status();
  }

  // The statistics, then the samples in chunks.
  absl::StatusOr<v1::RolloutStats> RolloutGenerate(const v1::RolloutGenerateRequest& req, v1::TensorBatch* samples,
                                                   int64_t timeout_ms) override {
    TESSERA_ASSIGN_OR_RETURN(auto ctx, Begin(timeout_ms));
    std::unique_ptr<grpc::ClientReader<v1::RolloutGenerateResponse>> in = stub_->RolloutGenerate(ctx.get(), req);
    StatsThenBatch<v1::RolloutGenerateResponse> got("RolloutGenerate");
    for (v1::RolloutGenerateResponse m; in->Read(&m);) got.Take(m);
    const grpc::Status st = in->Finish();
    End(ctx.get());
    if (!st.ok()) return FromGrpc(st);
    return std::move(got).Done(samples);
  }

  // The header, then the samples in chunks.
  absl::StatusOr<v1::RlUpdateResponse> RlUpdate(const v1::RlUpdateHeader& header, const v1::TensorBatch& samples,
                                                int64_t timeout_ms) override {
    TESSERA_ASSIGN_OR_RETURN(auto ctx, Begin(timeout_ms));
    v1::RlUpdateResponse resp;
    std::unique_ptr<grpc::ClientWriter<v1::RlUpdateRequest>> out = stub_->RlUpdate(ctx.get(), &resp);
    v1::RlUpdateRequest m;
    *m.mutable_header() = header;
    if (WriteWithChunks(*out, m, samples)) out->WritesDone();  // else the executor ended the call: Finish says why
    const grpc::Status st = out->Finish();
    End(ctx.get());
    if (!st.ok()) return FromGrpc(st);
    return resp;
  }

  // The header and the samples in chunks, then the statistics and the per-token tensor.
  absl::StatusOr<v1::RlForwardStats> RlForward(const v1::RlForwardHeader& header, const v1::TensorBatch& samples,
                                               v1::TensorBatch* out, int64_t timeout_ms) override {
    TESSERA_ASSIGN_OR_RETURN(auto ctx, Begin(timeout_ms));
    std::unique_ptr<grpc::ClientReaderWriter<v1::RlForwardRequest, v1::RlForwardResponse>> io = stub_->RlForward(ctx.get());
    v1::RlForwardRequest m;
    *m.mutable_header() = header;
    if (WriteWithChunks(*io, m, samples)) io->WritesDone();  // else the executor ended the call: Finish says why
    StatsThenBatch<v1::RlForwardResponse> got("RlForward");
    for (v1::RlForwardResponse r; io->Read(&r);) got.Take(r);
    const grpc::Status st = io->Finish();
    End(ctx.get());
    if (!st.ok()) return FromGrpc(st);
    return std::move(got).Done(out);
  }

  void Cancel() override {
    std::lock_guard<std::mutex> l(mu_);
    cancelled_ = true;
    for (auto* c : active_) c->TryCancel();
  }

 private:
  std::unique_ptr<v1::ExecutorService::Stub> stub_;
  std::string secret_;
  std::string executor_;
  std::string where_;
  std::mutex mu_;
  bool cancelled_ = false;
  std::set<grpc::ClientContext*> active_;
};

absl::Status MakeTokensFile(const std::string& path) {
  return WriteFileAtomic(path, absl::StrCat("# ROLE NAME TOKEN (roles: admin, submit, read)\nadmin admin ", RandomHex(24), "\n"),
                         0600);
}

}  // namespace

absl::Status InitSecrets(const std::string& dir) {
  for (const char* f : kSecretFiles)
    if (access(absl::StrCat(dir, "/", f).c_str(), F_OK) == 0)
      return absl::AlreadyExistsError(absl::StrCat(dir, "/", f, " exists; init-secrets makes new secrets only"));
  TESSERA_RETURN_IF_ERROR(MakeDirs(dir, 0700));
  TESSERA_RETURN_IF_ERROR(LoadOrMakeCa(dir, false).status());
  TESSERA_RETURN_IF_ERROR(LoadOrMakeSecret(dir + "/join-token", false).status());
  return MakeTokensFile(dir + "/tokens");
}

ExecutorConnector GrpcExecutorConnector(std::string ca_pem, bool insecure, int64_t connect_timeout_ms) {
  return [ca_pem, insecure, connect_timeout_ms](const ExecutorTarget& t) -> absl::StatusOr<std::shared_ptr<ExecutorClient>> {
    ChannelOptions o;
    o.address = t.address;
    o.ca_pem = ca_pem;
    o.insecure = insecure;
    o.tls_name_override = kExecutorTlsName;
    o.max_message_bytes = kControlMaxMessageBytes;
    TESSERA_ASSIGN_OR_RETURN(auto ch, MakeChannel(o));
    // The calls wait for the connection (wait_for_ready), so an address the controller
    // cannot reach would only show as a call's deadline minutes later: the first
    // connection must come up within connect_timeout_ms.
    if (!ch->WaitForConnected(std::chrono::system_clock::now() + std::chrono::milliseconds(connect_timeout_ms)))
      return absl::UnavailableError(absl::StrCat(
          "cannot reach executor ", t.executor, " on node ", t.node_id, " at ", t.address, " within ",
          connect_timeout_ms / 1000.0, " s (the address it registered: is the agent's --listen-host reachable from the "
          "controller, and does TLS verify?)"));
    return std::shared_ptr<ExecutorClient>(std::make_shared<GrpcExecutorClient>(ch, t));
  };
}

absl::StatusOr<std::unique_ptr<Controller>> Controller::Start(const ControllerOptions& opts) {
  std::unique_ptr<Controller> c(new Controller());
  c->opts_ = opts;
  const std::string& dir = opts.state_dir;
  TESSERA_RETURN_IF_ERROR(MakeDirs(dir, 0700));
  TESSERA_ASSIGN_OR_RETURN(const bool tightened, TightenPrivateDir(dir, "--state-dir"));
  if (tightened) spdlog::warn("--state-dir {} was open to other users; its mode is now 0700", dir);
  const bool mounted = !opts.secrets_dir.empty();
  const std::string& sdir = mounted ? opts.secrets_dir : dir;
  TESSERA_ASSIGN_OR_RETURN(c->ca_, LoadOrMakeCa(sdir, mounted));
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::vector<std::string> dns = {"localhost", host}, ips = {"127.0.0.1", "::1"};
  for (const auto& n : opts.tls_names) {
    bool ip = !n.empty() && (isdigit(static_cast<unsigned char>(n[0])) || n.find(':') != std::string::npos);
    (ip ? ips : dns).push_back(n);
  }
  TESSERA_ASSIGN_OR_RETURN(c->server_, IssueCert(c->ca_, "tessera-controller", dns, ips, 365));
  TESSERA_ASSIGN_OR_RETURN(c->join_token_, LoadOrMakeSecret(sdir + "/join-token", mounted));
  if (!ReadFile(sdir + "/tokens").ok()) {
    if (mounted) return absl::FailedPreconditionError(absl::StrCat("--secrets-dir: ", sdir, "/tokens is missing"));
    TESSERA_RETURN_IF_ERROR(MakeTokensFile(dir + "/tokens"));
  }
  TESSERA_RETURN_IF_ERROR(c->tokens_.LoadFile(sdir + "/tokens"));
  {
    auto t = ReadFile(sdir + "/tokens");
    for (absl::string_view line : absl::StrSplit(*t, '\n')) {
      std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (f.size() == 3 && f[0] == "admin") { c->admin_token_ = f[2]; break; }
    }
  }
  TESSERA_ASSIGN_OR_RETURN(c->store_, Store::Open(dir + "/state.db"));
  c->rdv_ = std::make_unique<Rendezvous>();
  c->logs_ = std::make_unique<LogStore>(dir + "/logs");
  c->metrics_ = std::make_unique<Metrics>();

  auto creds = MakeServerCredentials({opts.insecure_loopback, c->server_}, opts.listen);
  if (!creds.ok()) return creds.status();
  EnableHealthAndReflection();
  grpc::ServerBuilder b;
  ExclusivePort(b);
  b.AddListeningPort(opts.listen, *creds, &c->port_);
  b.SetMaxReceiveMessageSize(kControlMaxMessageBytes);
  b.SetMaxSendMessageSize(kControlMaxMessageBytes);
  grpc::ResourceQuota quota("controller");
  quota.SetMaxThreads(2048);
  b.SetResourceQuota(quota);
  b.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);

  JobManagerConfig jc;
  jc.lease_ttl_ms = opts.lease_ttl_ms;
  jc.heartbeat_interval_ms = opts.heartbeat_interval_ms;
  jc.stop_grace_ms = opts.stop_grace_ms;
  jc.version = kVersion;
  jc.stop_unfinished_on_recover = opts.stop_unfinished_jobs;
  jc.path_roots = opts.path_roots;
  // The port is known only after BuildAndStart; the JobManager reads the address
  // when it starts executors, which is after Start() returns.
  c->jobs_ = std::make_unique<JobManager>(jc, c->store_.get(), c->rdv_.get(), c->logs_.get(), c->metrics_.get(),
                                          BuiltinDriver, GrpcExecutorConnector(c->ca_.cert_pem, opts.insecure_loopback));
  ServiceDeps d{c->jobs_.get(), c->rdv_.get(), c->logs_.get(), c->metrics_.get(), &c->tokens_, c->join_token_, c->ca_, jc,
                opts.path_roots};
  c->services_.push_back(MakeJobService(d));
  c->services_.push_back(MakeClusterService(d));
  c->services_.push_back(MakeNodeService(d));
  c->services_.push_back(MakeRendezvousService(d));
  for (auto& s : c->services_) b.RegisterService(s.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(MakeRpcMetricsInterceptors(c->metrics_.get()));
  b.experimental().SetInterceptorCreators(std::move(interceptors));
  c->server_impl_ = b.BuildAndStart();
  if (!c->server_impl_ || c->port_ == 0)
    return absl::UnavailableError(absl::StrCat("cannot listen on ", opts.listen, " (--listen): is the port in use?"));
  // gRPC health: the server as a whole ("") and each service by its full name are
  // NOT_SERVING until the state is recovered, and again from the start of a shutdown.
  c->SetServing(c->server_impl_.get(), false);
  c->jobs_->SetControllerAddress(c->address());
  TESSERA_RETURN_IF_ERROR(c->jobs_->Recover());
  c->jobs_->Start();
  c->SetServing(c->server_impl_.get(), true);
  if (!opts.metrics_listen.empty()) {
    try {
      c->exposer_ = std::make_unique<prometheus::Exposer>(opts.metrics_listen);
      c->exposer_->RegisterCollectable(c->metrics_->registry());
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", opts.metrics_listen, ": ", e.what()));
    }
  }
  nlohmann::json conf = {{"address", c->address()}, {"token", c->admin_token_}, {"ca_cert", sdir + "/ca.crt"},
                         {"insecure", opts.insecure_loopback}};
  if (c->exposer_) {
    // Port 0 asks the kernel for one; the port actually bound is published here.
    const auto ports = c->exposer_->GetListeningPorts();
    if (ports.empty()) return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", opts.metrics_listen));
    conf["metrics_address"] = WithPort(opts.metrics_listen, ports.front());
    spdlog::info("controller serving /metrics on {}", conf["metrics_address"].get<std::string>());
  }
  if (!opts.dashboard_listen.empty()) {
    TESSERA_ASSIGN_OR_RETURN(c->dashboard_, Dashboard::Start(opts.dashboard_listen, c->jobs_.get(), &c->tokens_, c->logs_.get()));
    conf["dashboard_address"] = WithPort(opts.dashboard_listen, c->dashboard_->port());
    spdlog::info("controller serving the dashboard on http://{}/", conf["dashboard_address"].get<std::string>());
  }
  if (!opts.health_listen.empty()) {  // last: SERVING means the state is loaded and the server listens
    int hport = 0;
    TESSERA_ASSIGN_OR_RETURN(c->health_, StartHealthServer(opts.health_listen, &hport));
    c->SetServing(c->health_.get(), true);
    conf["health_address"] = WithPort(opts.health_listen, hport);
    spdlog::info("controller serving health on {}", conf["health_address"].get<std::string>());
  }
  TESSERA_RETURN_IF_ERROR(WriteFileAtomic(dir + "/admin.conf", conf.dump(2) + "\n", 0600));
  spdlog::info("controller listening on {} (port {}, {}), state in {}", opts.listen, c->port_,
               opts.insecure_loopback ? "plaintext loopback" : "TLS", dir);
  return c;
}

std::string Controller::address() const {
  if (!opts_.advertise.empty()) return opts_.advertise;
  std::string host = HostOf(opts_.listen);
  if (host == "0.0.0.0" || host == "::" || host.empty()) {
    char h[256] = {0};
    gethostname(h, sizeof(h) - 1);
    host = h;
  }
  return JoinHostPort(host, port_);
}

Controller::~Controller() { Shutdown(); }

void Controller::SetServing(grpc::Server* server, bool serving) {
  auto* health = server ? server->GetHealthCheckService() : nullptr;
  if (health == nullptr) return;
  health->SetServingStatus("", serving);
  for (const char* name : {v1::JobService::service_full_name(), v1::ClusterService::service_full_name(),
                           v1::NodeService::service_full_name(), v1::RendezvousService::service_full_name()})
    health->SetServingStatus(name, serving);
}

void Controller::Shutdown() {
  if (shut_) return;
  shut_ = true;
  SetServing(health_.get(), false);
  SetServing(server_impl_.get(), false);
  if (health_) health_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  dashboard_.reset();
  if (jobs_) jobs_->Shutdown();
  if (server_impl_) server_impl_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

void Controller::Wait() {
  if (server_impl_) server_impl_->Wait();
}

}  // namespace tessera::controller
