#include "worker/executor/executor.h"

#include <spdlog/spdlog.h>

#include "absl/base/thread_annotations.h"
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_util.h"
#include "common/spec/job_spec.h"
#include "common/status.h"
#include "common/util.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/executor/comm_check.h"
#include "worker/executor/generate.h"
#include "worker/executor/train.h"
#include "worker/executor/cuda_buffer_space.h"
#include "worker/executor/rollout_pool.h"
#include "worker/rollout/weight_sync.h"

namespace tessera::executor {
namespace {

std::atomic<bool> g_stop{false};
constexpr int64_t kAttemptCheckMs = 5000;  // how often an idle executor asks whether its attempt is live
void OnSignal(int) { g_stop = true; }

absl::StatusOr<tessera::DType> ParseDType(const std::string& s) {
  if (s == "f32") return tessera::DType::kF32;
  if (s == "bf16") return tessera::DType::kBF16;
  if (s == "i32") return tessera::DType::kI32;
  return absl::InvalidArgumentError(absl::StrCat("dtype: unsupported '", s, "'"));
}

class ExecutorServiceImpl final : public v1::ExecutorService::Service {
 public:
  ExecutorServiceImpl(v1::ExecutorConfig cfg, comm::RendezvousClient* rdv, std::string listen_host)
      : cfg_(std::move(cfg)), rdv_(rdv), listen_host_(std::move(listen_host)) {}

  // A call must carry this attempt's secret and name this executor: anything else was
  // meant for another process (logged, so that a misrouted call shows on the side that
  // got it, not only as a peer's timeout).
  grpc::Status Auth(grpc::ServerContext* ctx) {
    if (!ConstantTimeEquals(BearerToken(ctx), cfg_.secret())) {
      spdlog::error("executor {}: refused a call from {}: wrong or missing attempt secret", cfg_.executor(), ctx->peer());
      return grpc::Status(grpc::UNAUTHENTICATED, "wrong or missing attempt secret");
    }
    const auto& md = ctx->client_metadata();
    auto it = md.find(kExecutorMetadata);
    const std::string to = it == md.end() ? "" : std::string(it->second.data(), it->second.size());
    if (to != std::to_string(cfg_.executor())) {
      std::string why = absl::StrCat("this is executor ", cfg_.executor(), " of job ", cfg_.job_id(), " attempt ",
                                     cfg_.attempt(), "; the call was meant for executor '", to, "'");
      spdlog::error("executor {}: refused a call from {}: {}", cfg_.executor(), ctx->peer(), why);
      return grpc::Status(grpc::FAILED_PRECONDITION, why);
    }
    return grpc::Status::OK;
  }

  absl::StatusOr<std::pair<const v1::GroupSpec*, int>> Find(const std::string& group) {
    for (const auto& gr : cfg_.ranks())
      if (gr.group() == group)
        for (const auto& g : cfg_.spec().groups())
          if (g.name() == group) return std::make_pair(&g, gr.rank());
    return absl::NotFoundError(absl::StrCat("this executor hosts no rank of group '", group, "'"));
  }

  // The spec's paths lie under the controller's roots as the controller checked them at
  // submit, but on this host a symbolic link under a root may lead out of it: checked
  // again here, links resolved, before every call that may open one.
  grpc::Status CheckPaths() {
    auto st = CheckJobPathsResolved(cfg_.spec(), std::vector<std::string>(cfg_.path_roots().begin(), cfg_.path_roots().end()));
    if (!st.ok()) spdlog::error("executor {}: {}", cfg_.executor(), std::string(st.message()));
    return ToGrpc(st);
  }

  grpc::Status InitGroup(grpc::ServerContext* ctx, const v1::InitGroupRequest* req, v1::InitGroupResponse* resp) override {
    if (auto s = Auth(ctx); !s.ok()) return s;
    if (auto s = CheckPaths(); !s.ok()) return s;
    auto found = Find(req->group());
    if (!found.ok()) return ToGrpc(found.status());
    auto [g, rank] = *found;
    const auto& l = g->layout();
    parallel::Layout layout = LayoutOf(l);
    auto t0 = std::chrono::steady_clock::now();
    spdlog::info("group '{}' rank {}: InitGroup: building communicators", g->name(), rank);
    auto built = BuildGroupComms(g->name(), layout, rank, cfg_.device_type(), cfg_.device_index(), rdv_, listen_host_,
                                 cfg_.spec().collective_timeout_ms());
    if (!built.ok()) {
      spdlog::error("group '{}' rank {}: InitGroup failed: {}", g->name(), rank, std::string(built.status().message()));
      return ToGrpc(built.status());
    }
    resp->set_init_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    for (auto& [k, c] : built->comms) resp->add_communicators(c->name());
    std::lock_guard<std::mutex> lk(mu_);
    groups_[g->name()] = std::make_shared<GroupComms>(std::move(*built));
    spdlog::info("group '{}' rank {}: {} communicators ready in {:.2f} s", g->name(), rank, resp->communicators_size(),
                 resp->init_seconds());
    return grpc::Status::OK;
  }

  grpc::Status Call(grpc::ServerContext* ctx, const v1::CallRequest* req, v1::CallResponse* resp) override {
    if (auto s = Auth(ctx); !s.ok()) return s;
    if (auto s = CheckPaths(); !s.ok()) return s;
    std::shared_ptr<GroupComms> gc;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = groups_.find(req->group());
      if (it == groups_.end())
        return grpc::Status(grpc::FAILED_PRECONDITION, absl::StrCat("group '", req->group(), "' is not initialized; call InitGroup first"));
      gc = it->second;
    }
    if (req->method() == "comm_check") return ToGrpc(CommCheck(*gc, req->args_json(), resp));
    if (req->method() == "generate") return ToGrpc(Generate(req->group(), *gc, resp));
    if (req->method() == "rollout_init" || req->method() == "rollout_generate" || req->method() == "rl_update" ||
        req->method() == "bridge_init" || req->method() == "sync_weights" || req->method() == "weights_digest" ||
        (req->method() == "rl_eval" && HasPool(req->group())))
      return ToGrpc(Split(req->group(), req->method(), *gc, *req, resp));
    if (req->method() == "train_init" || req->method() == "train_step" || req->method() == "rl_step" ||
        req->method() == "rl_eval")
      return ToGrpc(Train(req->group(), req->method(), *gc, req->args_json(), resp));
    return grpc::Status(grpc::UNIMPLEMENTED, absl::StrCat("method '", req->method(), "' is not implemented"));
  }

  grpc::Status Shutdown(grpc::ServerContext* ctx, const v1::ShutdownRequest*, v1::ShutdownResponse*) override {
    if (auto s = Auth(ctx); !s.ok()) return s;
    g_stop = true;
    return grpc::Status::OK;
  }

 private:
  absl::Status CommCheck(GroupComms& gc, const std::string& args_json, v1::CallResponse* resp) {
    nlohmann::json a;
    try {
      a = nlohmann::json::parse(args_json);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat("args_json: ", e.what()));
    }
    TESSERA_ASSIGN_OR_RETURN(auto kind, parallel::ParseGroupKind(a.value("group_kind", "")));
    CommCheckArgs args;
    args.sizes = a.value("sizes", std::vector<int64_t>{});
    args.collectives = a.value("collectives", std::vector<std::string>{});
    args.iters = a.value("iters", 5);
    args.warmup = a.value("warmup", 1);
    TESSERA_ASSIGN_OR_RETURN(args.dtype, ParseDType(a.value("dtype", "f32")));
    nlohmann::json rows = nlohmann::json::array();
    auto it = gc.comms.find(kind);
    if (it != gc.comms.end() && it->second->size() > 1) {
      std::unique_ptr<BufferSpace> space = cfg_.device_type() == v1::DEVICE_TYPE_GPU ? MakeCudaBufferSpace(cfg_.device_index())
                                                                         : MakeHostBufferSpace();
      if (!space) return absl::UnimplementedError("GPU buffers are not available in this build (built without CUDA)");
      TESSERA_ASSIGN_OR_RETURN(rows, RunCommCheck(*it->second, *space, args, gc.group_index[kind]));
      spdlog::info("comm_check {} ({} ranks): {} checks done", it->second->name(), it->second->size(), rows.size());
    }
    resp->set_result_json(nlohmann::json{{"results", rows}}.dump());
    return absl::OkStatus();
  }

  // train_init builds the group's training session (resuming from a checkpoint: its
  // result is {"start_step": N}); train_step {"step": s} runs step s (with "save": true,
  // a checkpoint after it whatever save_every says); rl_step {"step": s[, "save"]}
  // runs GRPO step s of a grpo session; rl_eval {"problems": n} its held-out accuracy.
  absl::Status Train(const std::string& group, const std::string& method, GroupComms& gc, const std::string& args_json,
                     v1::CallResponse* resp) {
    std::lock_guard<std::mutex> lk(train_mu_);
    if (method == "train_init") {
      TESSERA_ASSIGN_OR_RETURN(auto session, TrainSession::Create(cfg_.spec(), gc, cfg_.device_type(), cfg_.device_index()));
      resp->set_result_json(nlohmann::json{{"start_step", session->start_step()}}.dump());
      sessions_[group] = std::move(session);
      return absl::OkStatus();
    }
    auto it = sessions_.find(group);
    if (it == sessions_.end())
      return absl::FailedPreconditionError(absl::StrCat("group '", group, "' has no training session; call train_init first"));
    const char* key = method == "rl_eval" ? "problems" : "step";
    int64_t n = 0;
    bool save = false;
    try {
      const auto args = nlohmann::json::parse(args_json);
      n = args.at(key).get<int64_t>();
      save = args.value("save", false);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(method, " args_json: expected {\"", key, "\": N}: ", e.what()));
    }
    if (save) it->second->RequestSave();  // a node of the job is leaving: save after this step
    TESSERA_ASSIGN_OR_RETURN(std::string out, method == "rl_step"   ? it->second->RlStep(n)
                                              : method == "rl_eval" ? it->second->RlEval(n)
                                                                    : it->second->Step(n));
    resp->set_result_json(out);
    return absl::OkStatus();
  }

  bool HasPool(const std::string& group) {
    std::lock_guard<std::mutex> lk(train_mu_);
    return pools_.count(group) > 0;
  }

  // Split pools (worker/executor/rollout_pool.h): rollout_init builds a rollout pool's
  // session; rollout_generate {"step"} its samples; rl_eval {"problems"} its held-out
  // accuracy; rl_update {"step"} + samples the actor's update; bridge_init the bridge
  // communicator (every rank of both groups at once); sync_weights the actor's weights
  // to the pool over it ({"bytes", "seconds"}); weights_digest a digest of the model's
  // global weights.
  absl::Status Split(const std::string& group, const std::string& method, GroupComms& gc, const v1::CallRequest& req,
                     v1::CallResponse* resp) {
    std::lock_guard<std::mutex> lk(train_mu_);
    auto arg = [&](const char* key) -> absl::StatusOr<int64_t> {
      try {
        return nlohmann::json::parse(req.args_json()).at(key).get<int64_t>();
      } catch (const std::exception& e) {
        return absl::InvalidArgumentError(absl::StrCat(method, " args_json: expected {\"", key, "\": N}: ", e.what()));
      }
    };
    auto session = sessions_.find(group);
    auto pool = pools_.find(group);
    if (method == "rollout_init") {
      TESSERA_ASSIGN_OR_RETURN(auto p, RolloutPoolSession::Create(cfg_.spec(), gc, cfg_.device_type(), cfg_.device_index()));
      pools_[group] = std::move(p);
      resp->set_result_json("{}");
      return absl::OkStatus();
    }
    if (method == "bridge_init") {
      TESSERA_ASSIGN_OR_RETURN(bridge_, MakeBridge(cfg_, rdv_, listen_host_));
      if (cfg_.device_type() == v1::DEVICE_TYPE_GPU) {
        runtime::Backend& b = session != sessions_.end() ? session->second->backend() : pool->second->backend();
        TESSERA_RETURN_IF_ERROR(bridge_->OrderWith(b.stream()));
      }
      resp->set_result_json(nlohmann::json{{"size", bridge_->size()}, {"rank", bridge_->rank()}}.dump());
      return absl::OkStatus();
    }
    const bool actor = session != sessions_.end();
    if (!actor && pool == pools_.end())
      return absl::FailedPreconditionError(absl::StrCat("group '", group, "' has no session; call train_init or rollout_init first"));
    model::Llama& model = actor ? session->second->model() : pool->second->model();
    runtime::Backend& backend = actor ? session->second->backend() : pool->second->backend();
    if (actor && (method == "sync_weights" || method == "weights_digest"))  // every actor rank calls them
      TESSERA_RETURN_IF_ERROR(session->second->GatherValues());  // ZeRO-1: the values, not only this rank's slices
    if (method == "sync_weights" && actor && !pools_.empty()) {
      // The rollout shares this executor (colocated, another layout): every tensor
      // gathered over the actor's TP group and re-sliced into the rollout's model.
      const auto t0 = std::chrono::steady_clock::now();
      TESSERA_RETURN_IF_ERROR(engine::SyncColocated(model, pools_.begin()->second->model()));
      int64_t bytes = 0;  // the model in f32, as a split sync counts it
      for (model::Param& p : model.params()) {
        int64_t n = 4;
        for (int64_t d : p.spec.shape) n *= d;
        bytes += n;
      }
      resp->set_result_json(nlohmann::json{{"bytes", bytes},
                                           {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}}
                                .dump());
      return absl::OkStatus();
    }
    if (method == "sync_weights") {
      if (bridge_ == nullptr) return absl::FailedPreconditionError("sync_weights: call bridge_init first");
      const auto t0 = std::chrono::steady_clock::now();
      TESSERA_ASSIGN_OR_RETURN(const int64_t bytes, engine::SyncSplit(actor ? &model : nullptr, actor ? nullptr : &model,
                                                                      *bridge_, /*source=*/0, backend));
      resp->set_result_json(nlohmann::json{{"bytes", bytes},
                                           {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}}
                                .dump());
      return absl::OkStatus();
    }
    if (method == "weights_digest") {
      TESSERA_ASSIGN_OR_RETURN(std::string digest, WeightsDigest(model));
      resp->set_result_json(nlohmann::json{{"digest", digest}}.dump());
      return absl::OkStatus();
    }
    if (method == "rl_update") {
      if (!actor) return absl::FailedPreconditionError(absl::StrCat("rl_update: group '", group, "' is not the actor"));
      TESSERA_ASSIGN_OR_RETURN(const int64_t step, arg("step"));
      const auto args = nlohmann::json::parse(req.args_json(), nullptr, false);
      if (args.is_object() && args.value("save", false)) session->second->RequestSave();
      TESSERA_ASSIGN_OR_RETURN(std::string out, session->second->RlUpdate(step, req.batch()));
      resp->set_result_json(out);
      return absl::OkStatus();
    }
    if (actor) return absl::FailedPreconditionError(absl::StrCat(method, ": group '", group, "' is not a rollout pool"));
    if (method == "rl_eval") {
      TESSERA_ASSIGN_OR_RETURN(const int64_t problems, arg("problems"));
      TESSERA_ASSIGN_OR_RETURN(std::string out, pool->second->Eval(problems));
      resp->set_result_json(out);
      return absl::OkStatus();
    }
    TESSERA_ASSIGN_OR_RETURN(const int64_t step, arg("step"));  // rollout_generate
    TESSERA_ASSIGN_OR_RETURN(std::string out, pool->second->Generate(step, resp->mutable_batch()));
    resp->set_result_json(out);
    return absl::OkStatus();
  }

  // generate: builds the group's generate session (model, weights) and runs it over this
  // rank's share of the input file (worker/executor/generate.h).
  absl::Status Generate(const std::string& group, GroupComms& gc, v1::CallResponse* resp) {
    std::lock_guard<std::mutex> lk(train_mu_);
    TESSERA_ASSIGN_OR_RETURN(auto session, GenerateSession::Create(cfg_.spec(), gc, cfg_.device_type(), cfg_.device_index()));
    TESSERA_ASSIGN_OR_RETURN(std::string out, session->Run());
    resp->set_result_json(out);
    return absl::OkStatus();
  }

  v1::ExecutorConfig cfg_;
  comm::RendezvousClient* rdv_;
  std::mutex train_mu_;  // one training call at a time
  std::map<std::string, std::unique_ptr<TrainSession>> sessions_ ABSL_GUARDED_BY(train_mu_);
  std::map<std::string, std::unique_ptr<RolloutPoolSession>> pools_ ABSL_GUARDED_BY(train_mu_);
  std::unique_ptr<comm::Communicator> bridge_ ABSL_GUARDED_BY(train_mu_);  // split pools: actor + rollout ranks
  std::string listen_host_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<GroupComms>> groups_;
};

}  // namespace

comm::Communicator* CommOf(GroupComms& gc, parallel::GroupKind k) {
  auto it = gc.comms.find(k);
  return it == gc.comms.end() ? nullptr : it->second.get();
}

absl::Status OrderCommsWith(GroupComms& gc, v1::DeviceType device, void* stream) {
  if (device != v1::DEVICE_TYPE_GPU) return absl::OkStatus();
  for (auto& [kind, c] : gc.comms)
    if (c != nullptr) TESSERA_RETURN_IF_ERROR(c->OrderWith(stream));
  return absl::OkStatus();
}

absl::StatusOr<GroupComms> BuildGroupComms(const std::string& group, const parallel::Layout& layout, int rank,
                                           v1::DeviceType device, int device_index, comm::KvStore* rdv,
                                           const std::string& listen_host, int64_t timeout_ms) {
  GroupComms gc;
  gc.layout = layout;
  gc.rank = rank;
  for (auto kind : parallel::kAllGroupKinds) {
    auto m = parallel::GroupOf(layout, kind, rank);
    if (m.ranks.empty()) continue;  // e.g. a middle pipeline stage has no embedding group
    std::string name = absl::StrCat(group, "/", parallel::GroupKindName(kind), "/", m.index);
    std::unique_ptr<comm::Communicator> c;
    if (m.ranks.size() == 1) {
      c = comm::MakeSelfCommunicator(name);
    } else if (device == v1::DEVICE_TYPE_GPU) {
      comm::NcclOptions o;
      o.device = device_index;
      o.timeout_ms = timeout_ms;
      TESSERA_ASSIGN_OR_RETURN(c, comm::MakeNcclCommunicator(name, name, m.rank_in_group, m.ranks.size(), rdv, o));
    } else {
      comm::GlooOptions o;
      o.listen_host = listen_host;
      o.timeout_ms = timeout_ms;
      TESSERA_ASSIGN_OR_RETURN(c, comm::MakeGlooCommunicator(name, name, m.rank_in_group, m.ranks.size(), rdv, o));
    }
    if (m.ranks.size() > 1) spdlog::info("communicator {} ready (rank {} of {})", name, m.rank_in_group, m.ranks.size());
    gc.group_index[kind] = m.index;
    gc.comms[kind] = std::move(c);
  }
  return gc;
}

int RunExecutor(const ExecutorOptions& opts) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);  // die with the agent that spawned us
  std::signal(SIGTERM, OnSignal);
  std::signal(SIGINT, OnSignal);
  auto raw = ReadFile(opts.config_path);
  if (!raw.ok()) {
    spdlog::error("executor config: {}", std::string(raw.status().message()));
    return 2;
  }
  v1::ExecutorConfig cfg;
  if (!cfg.ParseFromString(*raw)) {
    spdlog::error("executor config {} is corrupt", opts.config_path);
    return 2;
  }
  spdlog::info("executor {} of job {} attempt {} on node {} ({} {}), pid {}", cfg.executor(), cfg.job_id(), cfg.attempt(),
               cfg.node_id(), cfg.device_type() == v1::DEVICE_TYPE_GPU ? "gpu" : "cpu", cfg.device_index(), getpid());
  std::string ca, cert, key;
  if (!opts.insecure) {
    auto c = ReadFile(opts.ca_cert_path), ce = ReadFile(opts.cert_path), k = ReadFile(opts.key_path);
    if (!c.ok() || !ce.ok() || !k.ok()) {
      spdlog::error("executor TLS material is missing ({}, {}, {})", opts.ca_cert_path, opts.cert_path, opts.key_path);
      return 2;
    }
    ca = *c, cert = *ce, key = *k;
  }
  ChannelOptions co;
  co.address = cfg.controller_address();
  co.ca_pem = ca;
  co.insecure = opts.insecure;
  auto ch = MakeChannel(co);
  if (!ch.ok()) {
    spdlog::error("{}", std::string(ch.status().message()));
    return 2;
  }
  comm::RendezvousClient rdv(*ch, cfg.job_id(), cfg.attempt(), cfg.secret());

  EnableHealthAndReflection();
  ExecutorServiceImpl svc(cfg, &rdv, opts.listen_host);
  std::string listen = absl::StrCat(opts.listen_host.find(':') != std::string::npos ? "[" + opts.listen_host + "]" : opts.listen_host, ":0");
  auto creds = MakeServerCredentials({opts.insecure, {cert, key}}, listen);
  if (!creds.ok()) {
    spdlog::error("{}", std::string(creds.status().message()));
    return 2;
  }
  int port = 0;
  grpc::ServerBuilder b;
  ExclusivePort(b);
  b.AddListeningPort(listen, *creds, &port);
  b.SetMaxReceiveMessageSize(kDataMaxMessageBytes);
  b.SetMaxSendMessageSize(kDataMaxMessageBytes);
  b.RegisterService(&svc);
  auto server = b.BuildAndStart();
  if (!server || port == 0) {
    spdlog::error("cannot listen on {}", listen);
    return 2;
  }
  std::string addr = absl::StrCat(listen.substr(0, listen.size() - 1), port);
  auto st = rdv.RegisterExecutor(cfg.executor(), addr);
  if (!st.ok()) {
    spdlog::error("cannot register with the controller: {}", st.ToString());
    return 3;
  }
  spdlog::info("serving ExecutorService on {}", addr);
  // Self-fencing: every few seconds, is this attempt still the job's live one? Once the
  // controller has torn it down (its node was declared lost: an agent stalled or cut off
  // longer than the lease, while the job moved on), this executor stops by itself rather
  // than holding its device beside the attempt that replaced it. An unreachable
  // controller changes nothing: the executor keeps serving its driver.
  int64_t next_check = MonoMs() + kAttemptCheckMs;
  while (!g_stop) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (MonoMs() < next_check) continue;
    const absl::Status live = rdv.CheckAttempt(5000);
    next_check = MonoMs() + kAttemptCheckMs;
    if (live.code() == absl::StatusCode::kFailedPrecondition || live.code() == absl::StatusCode::kNotFound) {
      spdlog::warn("executor {}: {}; this attempt was torn down: exiting", cfg.executor(), std::string(live.message()));
      break;
    }
  }
  spdlog::info("executor {} shutting down", cfg.executor());
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  // Communicators (Gloo threads, NCCL comms) are torn down by process exit.
  std::fflush(nullptr);
  _exit(0);
}

}  // namespace tessera::executor
