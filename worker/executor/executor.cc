#include "worker/executor/executor.h"

#include <spdlog/spdlog.h>

#include "absl/base/thread_annotations.h"
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc_util.h"
#include "common/rpc/tensor_stream.h"
#include "tessera/v1/executor_service.grpc.pb.h"
#include "common/spec/job_spec.h"
#include "common/status.h"
#include "common/util.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/executor/comm_check.h"
#include "worker/executor/generate.h"
#include "worker/executor/pretrain_session.h"
#include "worker/executor/rl_actor_session.h"
#include "worker/executor/rl_role_sessions.h"
#include "worker/executor/cuda_buffer_space.h"
#include "worker/executor/rollout_pool.h"
#include "worker/rollout/weight_sync.h"
#include "worker/runtime/offload.h"

namespace tessera::executor {
namespace {

std::atomic<bool> g_stop{false};
constexpr int64_t kAttemptCheckMs = 5000;  // how often an idle executor asks whether its attempt is live
void OnSignal(int) { g_stop = true; }

absl::StatusOr<tessera::DType> DTypeOf(v1::DType t) {
  switch (t) {
    case v1::DTYPE_F32: return tessera::DType::kF32;
    case v1::DTYPE_BF16: return tessera::DType::kBF16;
    case v1::DTYPE_I32: return tessera::DType::kI32;
    default: return absl::InvalidArgumentError(absl::StrCat("dtype: ", v1::DType_Name(t), " is not one of DTYPE_F32, DTYPE_BF16, DTYPE_I32"));
  }
}

}  // namespace

Executor::Executor(v1::ExecutorConfig cfg, comm::KvStore* rdv, std::string listen_host)
    : cfg_(std::move(cfg)), rdv_(rdv), listen_host_(std::move(listen_host)) {}

Executor::~Executor() = default;

absl::Status Executor::CheckPaths() const {
  auto st = CheckJobPathsResolved(cfg_.spec(), std::vector<std::string>(cfg_.path_roots().begin(), cfg_.path_roots().end()));
  if (!st.ok()) spdlog::error("executor {}: {}", cfg_.executor(), std::string(st.message()));
  return st;
}

absl::StatusOr<std::shared_ptr<GroupComms>> Executor::Group(const std::string& group) {
  TESSERA_RETURN_IF_ERROR(CheckPaths());
  std::lock_guard<std::mutex> lk(groups_mu_);
  auto it = groups_.find(group);
  if (it != groups_.end()) return it->second;
  for (const auto& gr : cfg_.ranks())
    if (gr.group() == group)
      return absl::FailedPreconditionError(absl::StrCat("group '", group, "' is not initialized; call InitGroup first"));
  return absl::NotFoundError(absl::StrCat("this executor hosts no rank of group '", group, "'"));
}

TrainSession* Executor::SessionOf(const std::string& group) {
  auto it = sessions_.find(group);
  return it == sessions_.end() ? nullptr : it->second.get();
}

absl::StatusOr<Executor::GroupSession> Executor::AnySessionOf(const std::string& group) {
  GroupSession g{SessionOf(group), PoolOf(group)};
  if (g.train == nullptr && g.pool == nullptr)
    return absl::FailedPreconditionError(absl::StrCat("group '", group, "' has no session; call TrainInit or RolloutInit first"));
  return g;
}

absl::StatusOr<RlActorSession*> Executor::RlActorOf(const std::string& group, const char* op) {
  TrainSession* s = SessionOf(group);
  if (s == nullptr)
    return absl::FailedPreconditionError(absl::StrCat(op, ": group '", group, "' has no training session (not the actor, or no TrainInit yet)"));
  auto* rl = dynamic_cast<RlActorSession*>(s);
  if (rl == nullptr)
    return absl::FailedPreconditionError(absl::StrCat(op, ": group '", group, "' trains a ", s->kind(),
                                                      " job; ", op, " is an RL actor's (grpo, ppo)"));
  return rl;
}

RolloutPoolSession* Executor::PoolOf(const std::string& group) {
  auto it = pools_.find(group);
  return it == pools_.end() ? nullptr : it->second.get();
}

absl::StatusOr<Executor::Swap> Executor::TakeTurn(std::initializer_list<std::string> active) {
  const auto t0 = std::chrono::steady_clock::now();
  auto is_active = [&](const std::string& g) { return std::find(active.begin(), active.end(), g) != active.end(); };
  auto offloads = [&](const std::string& g) {
    for (const v1::GroupSpec& s : cfg_.spec().groups())
      if (s.name() == g) return s.offload();
    return false;
  };
  Swap swap;
  // Groups that stay run beside whichever offloading group had the last turn.
  if (std::none_of(active.begin(), active.end(), offloads)) return swap;
  auto park = [&](const std::string& g, runtime::Backend& backend, const std::function<void(std::vector<runtime::Tensor>*)>& release) -> absl::Status {
    if (is_active(g) || !offloads(g)) return absl::OkStatus();
    std::unique_ptr<runtime::HostOffload>& p = parked_[g];
    if (p == nullptr) p = std::make_unique<runtime::HostOffload>(&backend);
    if (p->offloaded()) return absl::OkStatus();
    std::vector<runtime::Tensor> states;
    release(&states);
    absl::Status st = p->Offload(states);
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat("offloading group '", g, "' to host memory: ", st.message()));
    swap.bytes += p->bytes();
    return absl::OkStatus();
  };
  for (auto& [g, s] : sessions_)
    TESSERA_RETURN_IF_ERROR(park(g, s->backend(), [&](std::vector<runtime::Tensor>* t) { s->ReleaseForOffload(t); }));
  for (auto& [g, s] : pools_)
    TESSERA_RETURN_IF_ERROR(park(g, s->backend(), [&](std::vector<runtime::Tensor>* t) { s->ReleaseForOffload(t); }));
  for (const std::string& g : active) {
    auto it = parked_.find(g);
    if (it == parked_.end() || !it->second->offloaded()) continue;
    absl::Status st = it->second->Restore();
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat("group '", g, "' back from host memory: ", st.message()));
    swap.bytes += it->second->bytes();
  }
  swap.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return swap;
}

absl::StatusOr<v1::InitGroupResponse> Executor::InitGroup(const v1::InitGroupRequest& req) {
  TESSERA_RETURN_IF_ERROR(CheckPaths());
  const v1::GroupSpec* g = nullptr;
  int rank = 0;
  for (const auto& gr : cfg_.ranks())
    if (gr.group() == req.group())
      for (const auto& spec_group : cfg_.spec().groups())
        if (spec_group.name() == req.group()) g = &spec_group, rank = gr.rank();
  if (g == nullptr) return absl::NotFoundError(absl::StrCat("this executor hosts no rank of group '", req.group(), "'"));
  const parallel::Layout layout = LayoutOf(g->layout());
  const auto t0 = std::chrono::steady_clock::now();
  spdlog::info("group '{}' rank {}: InitGroup: building communicators", g->name(), rank);
  auto built = BuildGroupComms(g->name(), layout, rank, cfg_.device_type(), cfg_.device_index(), rdv_, listen_host_,
                               cfg_.spec().collective_timeout_ms());
  if (!built.ok()) {
    spdlog::error("group '{}' rank {}: InitGroup failed: {}", g->name(), rank, std::string(built.status().message()));
    return built.status();
  }
  v1::InitGroupResponse resp;
  resp.set_init_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  for (auto& [k, c] : built->comms) resp.add_communicators(c->name());
  std::lock_guard<std::mutex> lk(groups_mu_);
  groups_[g->name()] = std::make_shared<GroupComms>(std::move(*built));
  spdlog::info("group '{}' rank {}: {} communicators ready in {:.2f} s", g->name(), rank, resp.communicators_size(),
               resp.init_seconds());
  return resp;
}

absl::StatusOr<v1::CommCheckResponse> Executor::CommCheck(const v1::CommCheckRequest& req) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<GroupComms> gc, Group(req.group()));
  TESSERA_ASSIGN_OR_RETURN(auto kind, parallel::ParseGroupKind(req.group_kind()));
  CommCheckArgs args;
  args.sizes.assign(req.sizes_bytes().begin(), req.sizes_bytes().end());
  args.collectives.assign(req.collectives().begin(), req.collectives().end());
  if (req.iters() < 1) return absl::InvalidArgumentError(absl::StrCat("iters: ", req.iters(), "; expected at least 1"));
  if (req.warmup() < 0) return absl::InvalidArgumentError(absl::StrCat("warmup: ", req.warmup(), "; expected at least 0"));
  args.iters = req.iters();
  args.warmup = req.warmup();
  TESSERA_ASSIGN_OR_RETURN(args.dtype, DTypeOf(req.dtype()));
  std::lock_guard<std::mutex> lk(ops_mu_);
  v1::CommCheckResponse resp;
  auto it = gc->comms.find(kind);
  if (it != gc->comms.end() && it->second->size() > 1) {
    std::unique_ptr<BufferSpace> space = cfg_.device_type() == v1::DEVICE_TYPE_GPU ? MakeCudaBufferSpace(cfg_.device_index())
                                                                                   : MakeHostBufferSpace();
    if (!space) return absl::UnimplementedError("GPU buffers are not available in this build (built without CUDA)");
    TESSERA_RETURN_IF_ERROR(RunCommCheck(*it->second, *space, args, gc->group_index[kind], &resp));
    spdlog::info("comm_check {} ({} ranks): {} checks done", it->second->name(), it->second->size(), resp.results_size());
  }
  return resp;
}

absl::StatusOr<v1::TrainInitResponse> Executor::TrainInit(const v1::TrainInitRequest& req) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<GroupComms> gc, Group(req.group()));
  std::lock_guard<std::mutex> lk(ops_mu_);
  std::string role;
  for (const auto& g : cfg_.spec().groups())
    if (g.name() == req.group()) role = g.role();
  const bool rl = cfg_.spec().kind() == "grpo" || cfg_.spec().kind() == "ppo";
  if (req.resume_step() != 0 && !(rl && role == "critic"))
    return absl::InvalidArgumentError(absl::StrCat("TrainInit: resume_step is a critic group's; group '", req.group(), "' is the ",
                                                   role, " of a ", cfg_.spec().kind(), " job"));
  TESSERA_RETURN_IF_ERROR(TakeTurn({req.group()}).status());  // the other groups make room
  parked_.erase(req.group());  // a session made again: nothing of the old one is parked
  std::unique_ptr<TrainSession> session;
  if (rl && role == "reference") {
    TESSERA_ASSIGN_OR_RETURN(session, RlReferenceSession::Create(cfg_.spec(), *gc, cfg_.device_type(), cfg_.device_index()));
  } else if (rl && role == "reward") {
    TESSERA_ASSIGN_OR_RETURN(session, RlRewardSession::Create(cfg_.spec(), *gc, cfg_.device_type(), cfg_.device_index()));
  } else if (rl && role == "critic") {
    TESSERA_ASSIGN_OR_RETURN(session, RlCriticSession::Create(cfg_.spec(), *gc, cfg_.device_type(), cfg_.device_index(),
                                                              req.resume_step()));
  } else {
    TESSERA_ASSIGN_OR_RETURN(session, TrainSession::Create(cfg_.spec(), *gc, cfg_.device_type(), cfg_.device_index()));
  }
  v1::TrainInitResponse resp;
  resp.set_start_step(session->start_step());
  sessions_[req.group()] = std::move(session);
  return resp;
}

absl::StatusOr<v1::TrainStepResponse> Executor::TrainStep(const v1::TrainStepRequest& req) {
  TESSERA_RETURN_IF_ERROR(Group(req.group()).status());
  std::lock_guard<std::mutex> lk(ops_mu_);
  TrainSession* s = SessionOf(req.group());
  if (s == nullptr)
    return absl::FailedPreconditionError(absl::StrCat("group '", req.group(), "' has no training session; call TrainInit first"));
  auto* pretrain = dynamic_cast<PretrainSession*>(s);
  if (pretrain == nullptr)
    return absl::FailedPreconditionError(absl::StrCat("TrainStep: group '", req.group(), "' is the actor of a ", s->kind(),
                                                      " job, which RlUpdate trains; TrainStep is pretrain's and sft's"));
  if (req.save()) pretrain->RequestSave();  // a node of the job is leaving: save after this step
  return pretrain->Step(req.step());
}

absl::StatusOr<v1::RolloutInitResponse> Executor::RolloutInit(const v1::RolloutInitRequest& req) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<GroupComms> gc, Group(req.group()));
  std::lock_guard<std::mutex> lk(ops_mu_);
  TESSERA_RETURN_IF_ERROR(TakeTurn({req.group()}).status());
  parked_.erase(req.group());
  TESSERA_ASSIGN_OR_RETURN(auto pool, RolloutPoolSession::Create(cfg_.spec(), *gc, cfg_.device_type(), cfg_.device_index()));
  pools_[req.group()] = std::move(pool);
  return v1::RolloutInitResponse{};
}

absl::StatusOr<v1::RolloutStats> Executor::RolloutGenerate(const v1::RolloutGenerateRequest& req, v1::TensorBatch* samples) {
  TESSERA_RETURN_IF_ERROR(Group(req.group()).status());
  std::lock_guard<std::mutex> lk(ops_mu_);
  TESSERA_ASSIGN_OR_RETURN(GroupSession g, AnySessionOf(req.group()));
  RlActorSession* actor = nullptr;
  if (g.pool == nullptr) {
    TESSERA_ASSIGN_OR_RETURN(actor, RlActorOf(req.group(), "RolloutGenerate"));
  }
  TESSERA_ASSIGN_OR_RETURN(const Swap swap, TakeTurn({req.group()}));
  TESSERA_ASSIGN_OR_RETURN(v1::RolloutStats st, g.pool != nullptr ? g.pool->Generate(req.step(), req.refill(), samples)
                                                                   : actor->RolloutGenerate(req.step(), req.refill(), samples));
  st.set_swap_s(swap.seconds), st.set_swap_bytes(swap.bytes);
  return st;
}

absl::StatusOr<v1::RlForwardStats> Executor::RlForward(const v1::RlForwardHeader& req, const v1::TensorBatch& samples,
                                                       v1::TensorBatch* out) {
  TESSERA_RETURN_IF_ERROR(Group(req.group()).status());
  std::lock_guard<std::mutex> lk(ops_mu_);
  TrainSession* s = SessionOf(req.group());
  auto* ref = dynamic_cast<RlReferenceSession*>(s);
  auto* critic = dynamic_cast<RlCriticSession*>(s);
  auto* reward = dynamic_cast<RlRewardSession*>(s);
  RlActorSession* actor = nullptr;
  if (ref == nullptr && critic == nullptr && reward == nullptr) {
    TESSERA_ASSIGN_OR_RETURN(actor, RlActorOf(req.group(), "RlForward"));
  }
  TESSERA_ASSIGN_OR_RETURN(const Swap swap, TakeTurn({req.group()}));
  TESSERA_ASSIGN_OR_RETURN(v1::RlForwardStats st, ref != nullptr      ? ref->Forward(req.step(), samples, out)
                                                  : critic != nullptr ? critic->Forward(req.step(), samples, out)
                                                  : reward != nullptr ? reward->Forward(req.step(), samples, out)
                                                                      : actor->Forward(req.step(), samples, out));
  st.set_swap_s(swap.seconds), st.set_swap_bytes(swap.bytes);
  return st;
}

absl::StatusOr<v1::RlUpdateResponse> Executor::RlUpdate(const v1::RlUpdateHeader& req, const v1::TensorBatch& samples) {
  TESSERA_RETURN_IF_ERROR(Group(req.group()).status());
  std::lock_guard<std::mutex> lk(ops_mu_);
  auto* critic = dynamic_cast<RlCriticSession*>(SessionOf(req.group()));
  RlActorSession* actor = nullptr;
  if (critic == nullptr) {
    TESSERA_ASSIGN_OR_RETURN(actor, RlActorOf(req.group(), "RlUpdate"));
  }
  TESSERA_ASSIGN_OR_RETURN(const Swap swap, TakeTurn({req.group()}));
  if (req.save()) critic != nullptr ? critic->RequestSave() : actor->RequestSave();
  TESSERA_ASSIGN_OR_RETURN(v1::RlUpdateResponse r, critic != nullptr ? critic->Update(req.step(), samples)
                                                                     : actor->RlUpdate(req.step(), samples));
  r.set_swap_s(swap.seconds), r.set_swap_bytes(swap.bytes);
  return r;
}

absl::StatusOr<v1::RlEvalResponse> Executor::RlEval(const v1::RlEvalRequest& req) {
  TESSERA_RETURN_IF_ERROR(Group(req.group()).status());
  std::lock_guard<std::mutex> lk(ops_mu_);
  TESSERA_ASSIGN_OR_RETURN(GroupSession g, AnySessionOf(req.group()));
  RlActorSession* actor = nullptr;
  if (g.pool == nullptr) {
    TESSERA_ASSIGN_OR_RETURN(actor, RlActorOf(req.group(), "RlEval"));
  }
  TESSERA_RETURN_IF_ERROR(TakeTurn({req.group()}).status());
  return g.pool != nullptr ? g.pool->Eval(req.problems()) : actor->RlEval(req.problems());
}

absl::StatusOr<v1::BridgeInitResponse> Executor::BridgeInit(const v1::BridgeInitRequest& req) {
  TESSERA_RETURN_IF_ERROR(Group(req.group()).status());
  std::lock_guard<std::mutex> lk(ops_mu_);
  TESSERA_ASSIGN_OR_RETURN(GroupSession g, AnySessionOf(req.group()));
  TrainSession* s = g.train;
  RolloutPoolSession* pool = g.pool;
  TESSERA_ASSIGN_OR_RETURN(bridge_, MakeBridge(cfg_, rdv_, listen_host_));
  if (cfg_.device_type() == v1::DEVICE_TYPE_GPU)
    TESSERA_RETURN_IF_ERROR(bridge_->OrderWith(s != nullptr ? s->backend().stream() : pool->backend().stream()));
  v1::BridgeInitResponse resp;
  resp.set_size(bridge_->size());
  resp.set_rank(bridge_->rank());
  return resp;
}

absl::StatusOr<v1::SyncWeightsResponse> Executor::SyncWeights(const v1::SyncWeightsRequest& req) {
  TESSERA_RETURN_IF_ERROR(Group(req.group()).status());
  std::lock_guard<std::mutex> lk(ops_mu_);
  TESSERA_ASSIGN_OR_RETURN(GroupSession g, AnySessionOf(req.group()));
  TrainSession* s = g.train;
  RolloutPoolSession* pool = g.pool;
  // The actor's weights into a colocated rollout group's model: both on the device.
  const bool colocated = s != nullptr && !pools_.empty() && pools_.begin()->first != req.group();
  TESSERA_ASSIGN_OR_RETURN(const Swap swap, colocated ? TakeTurn({req.group(), pools_.begin()->first}) : TakeTurn({req.group()}));
  const auto t0 = std::chrono::steady_clock::now();
  v1::SyncWeightsResponse resp;
  resp.set_swap_s(swap.seconds), resp.set_swap_bytes(swap.bytes);
  if (s != nullptr) TESSERA_RETURN_IF_ERROR(s->GatherParams());  // sliced values: the whole values, not only this rank's
  if (colocated) {
    // The rollout group shares this executor (colocated, another layout): every tensor
    // gathered over the actor's TP group and re-sliced into the rollout's model.
    TESSERA_RETURN_IF_ERROR(engine::SyncColocated(s->model(), pools_.begin()->second->model()));
    int64_t bytes = 0;  // the model in f32, as a sync over the bridge counts it
    for (model::Param& p : s->model().params()) {
      int64_t n = 4;
      for (int64_t d : p.spec.shape) n *= d;
      bytes += n;
    }
    resp.set_bytes(bytes);
  } else {
    if (bridge_ == nullptr) return absl::FailedPreconditionError("SyncWeights: call BridgeInit first");
    model::Llama& model = s != nullptr ? s->model() : pool->model();
    runtime::Backend& backend = s != nullptr ? s->backend() : pool->backend();
    TESSERA_ASSIGN_OR_RETURN(const int64_t bytes, engine::SyncSplit(s != nullptr ? &model : nullptr, s != nullptr ? nullptr : &model,
                                                                    *bridge_, /*source=*/0, backend));
    resp.set_bytes(bytes);
  }
  resp.set_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  return resp;
}

absl::StatusOr<v1::WeightsDigestResponse> Executor::WeightsDigest(const v1::WeightsDigestRequest& req) {
  TESSERA_RETURN_IF_ERROR(Group(req.group()).status());
  std::lock_guard<std::mutex> lk(ops_mu_);
  TESSERA_ASSIGN_OR_RETURN(GroupSession g, AnySessionOf(req.group()));
  TrainSession* s = g.train;
  RolloutPoolSession* pool = g.pool;
  TESSERA_RETURN_IF_ERROR(TakeTurn({req.group()}).status());
  if (s != nullptr) TESSERA_RETURN_IF_ERROR(s->GatherParams());  // every actor rank calls it
  TESSERA_ASSIGN_OR_RETURN(std::string digest, executor::WeightsDigest(s != nullptr ? s->model() : pool->model()));
  v1::WeightsDigestResponse resp;
  resp.set_digest(std::move(digest));
  return resp;
}

absl::StatusOr<v1::GenerateResponse> Executor::Generate(const v1::GenerateRequest& req) {
  TESSERA_ASSIGN_OR_RETURN(std::shared_ptr<GroupComms> gc, Group(req.group()));
  std::lock_guard<std::mutex> lk(ops_mu_);
  TESSERA_ASSIGN_OR_RETURN(auto session, GenerateSession::Create(cfg_.spec(), *gc, cfg_.device_type(), cfg_.device_index()));
  return session->Run();
}

namespace {

// A driver's request stream of Req: a header first, then the samples in chunks.
// INVALID_ARGUMENT naming `op` for any other order or a malformed batch.
template <class Req, class Stream, class Header>
grpc::Status ReadHeaderThenSamples(Stream& in, const char* op, Header* header, v1::TensorBatch* samples) {
  Req m;
  if (!in.Read(&m) || !m.has_header())
    return grpc::Status(grpc::INVALID_ARGUMENT, absl::StrCat(op, ": the stream must start with a header"));
  *header = m.header();
  BatchAssembler got;
  while (in.Read(&m)) {
    if (!m.has_chunk()) return grpc::Status(grpc::INVALID_ARGUMENT, absl::StrCat(op, ": a second header on the stream"));
    if (absl::Status s = got.Add(std::move(*m.mutable_chunk())); !s.ok()) return ToGrpc(Annotate(s, absl::StrCat(op, " samples")));
  }
  absl::StatusOr<v1::TensorBatch> batch = std::move(got).Finish();
  if (!batch.ok()) return ToGrpc(Annotate(batch.status(), absl::StrCat(op, " samples")));
  *samples = std::move(*batch);
  return grpc::Status::OK;
}

// The gRPC face of an Executor: every call must carry this attempt's secret and name this
// executor; anything else was meant for another process (logged, so that a misrouted call
// shows on the side that got it, not only as a peer's timeout).
class ExecutorServiceImpl final : public v1::ExecutorService::Service {
 public:
  explicit ExecutorServiceImpl(Executor* ex) : ex_(ex), cfg_(ex->config()) {}

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

  template <typename Req, typename Resp>
  grpc::Status Unary(grpc::ServerContext* ctx, const Req* req, Resp* resp,
                     absl::StatusOr<Resp> (Executor::*op)(const Req&)) {
    if (auto s = Auth(ctx); !s.ok()) return s;
    absl::StatusOr<Resp> r = (ex_->*op)(*req);
    if (!r.ok()) return ToGrpc(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  }

  grpc::Status InitGroup(grpc::ServerContext* c, const v1::InitGroupRequest* q, v1::InitGroupResponse* r) override {
    return Unary(c, q, r, &Executor::InitGroup);
  }
  grpc::Status CommCheck(grpc::ServerContext* c, const v1::CommCheckRequest* q, v1::CommCheckResponse* r) override {
    return Unary(c, q, r, &Executor::CommCheck);
  }
  grpc::Status TrainInit(grpc::ServerContext* c, const v1::TrainInitRequest* q, v1::TrainInitResponse* r) override {
    return Unary(c, q, r, &Executor::TrainInit);
  }
  grpc::Status TrainStep(grpc::ServerContext* c, const v1::TrainStepRequest* q, v1::TrainStepResponse* r) override {
    return Unary(c, q, r, &Executor::TrainStep);
  }
  grpc::Status RolloutInit(grpc::ServerContext* c, const v1::RolloutInitRequest* q, v1::RolloutInitResponse* r) override {
    return Unary(c, q, r, &Executor::RolloutInit);
  }
  grpc::Status RlEval(grpc::ServerContext* c, const v1::RlEvalRequest* q, v1::RlEvalResponse* r) override {
    return Unary(c, q, r, &Executor::RlEval);
  }
  grpc::Status BridgeInit(grpc::ServerContext* c, const v1::BridgeInitRequest* q, v1::BridgeInitResponse* r) override {
    return Unary(c, q, r, &Executor::BridgeInit);
  }
  grpc::Status SyncWeights(grpc::ServerContext* c, const v1::SyncWeightsRequest* q, v1::SyncWeightsResponse* r) override {
    return Unary(c, q, r, &Executor::SyncWeights);
  }
  grpc::Status WeightsDigest(grpc::ServerContext* c, const v1::WeightsDigestRequest* q, v1::WeightsDigestResponse* r) override {
    return Unary(c, q, r, &Executor::WeightsDigest);
  }
  grpc::Status Generate(grpc::ServerContext* c, const v1::GenerateRequest* q, v1::GenerateResponse* r) override {
    return Unary(c, q, r, &Executor::Generate);
  }

  grpc::Status RolloutGenerate(grpc::ServerContext* ctx, const v1::RolloutGenerateRequest* req,
                               grpc::ServerWriter<v1::RolloutGenerateResponse>* out) override {
    if (auto s = Auth(ctx); !s.ok()) return s;
    v1::TensorBatch samples;
    absl::StatusOr<v1::RolloutStats> st = ex_->RolloutGenerate(*req, &samples);
    if (!st.ok()) return ToGrpc(st.status());
    v1::RolloutGenerateResponse m;
    *m.mutable_stats() = std::move(*st);
    if (!WriteWithChunks(*out, m, samples)) return grpc::Status(grpc::CANCELLED, "the driver closed the stream");
    return grpc::Status::OK;
  }

  grpc::Status RlUpdate(grpc::ServerContext* ctx, grpc::ServerReader<v1::RlUpdateRequest>* in,
                        v1::RlUpdateResponse* resp) override {
    if (auto s = Auth(ctx); !s.ok()) return s;
    v1::RlUpdateHeader header;
    v1::TensorBatch batch;
    if (grpc::Status s = ReadHeaderThenSamples<v1::RlUpdateRequest>(*in, "RlUpdate", &header, &batch); !s.ok()) return s;
    absl::StatusOr<v1::RlUpdateResponse> r = ex_->RlUpdate(header, batch);
    if (!r.ok()) return ToGrpc(r.status());
    *resp = std::move(*r);
    return grpc::Status::OK;
  }

  // The header and the samples in, then the statistics and the per-token tensor out.
  grpc::Status RlForward(grpc::ServerContext* ctx, grpc::ServerReaderWriter<v1::RlForwardResponse, v1::RlForwardRequest>* io) override {
    if (auto s = Auth(ctx); !s.ok()) return s;
    v1::RlForwardHeader header;
    v1::TensorBatch batch;
    if (grpc::Status s = ReadHeaderThenSamples<v1::RlForwardRequest>(*io, "RlForward", &header, &batch); !s.ok()) return s;
    v1::TensorBatch out;
    absl::StatusOr<v1::RlForwardStats> st = ex_->RlForward(header, batch, &out);
    if (!st.ok()) return ToGrpc(st.status());
    v1::RlForwardResponse r;
    *r.mutable_stats() = std::move(*st);
    if (!WriteWithChunks(*io, r, out)) return grpc::Status(grpc::CANCELLED, "the driver closed the stream");
    return grpc::Status::OK;
  }

  grpc::Status Shutdown(grpc::ServerContext* ctx, const v1::ShutdownRequest*, v1::ShutdownResponse*) override {
    if (auto s = Auth(ctx); !s.ok()) return s;
    g_stop = true;
    return grpc::Status::OK;
  }

 private:
  Executor* ex_;
  const v1::ExecutorConfig& cfg_;
};

}  // namespace

std::unique_ptr<v1::ExecutorService::Service> MakeExecutorService(Executor* ex) {
  return std::make_unique<ExecutorServiceImpl>(ex);
}

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
  Executor executor(cfg, &rdv, opts.listen_host);
  std::unique_ptr<v1::ExecutorService::Service> svc = MakeExecutorService(&executor);
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
  b.SetMaxReceiveMessageSize(kControlMaxMessageBytes);
  b.SetMaxSendMessageSize(kControlMaxMessageBytes);
  b.RegisterService(svc.get());
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
