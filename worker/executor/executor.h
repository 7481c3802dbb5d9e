// The executor process: one per device per job attempt, spawned by the node agent. It
// serves ExecutorService (proto/tessera/v1/executor_service.proto) for the job's driver:
// the service checks each call's credentials and hands it to an Executor, which builds
// the communicators of every parallel group of each worker group it hosts and runs the
// operations on the groups' sessions (training, rollout, generation).
#pragma once

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "tessera/v1/executor_service.grpc.pb.h"
#include "tessera/v1/node_service.pb.h"
#include "worker/comm/communicator.h"
#include "worker/comm/rendezvous_client.h"
#include "common/parallel/layout.h"

namespace tessera::runtime {
class HostOffload;  // worker/runtime/offload.h
}

namespace tessera::executor {

struct ExecutorOptions {
  std::string config_path;   // serialized v1::ExecutorConfig
  std::string ca_cert_path;  // controller CA
  std::string cert_path;     // node certificate the executor serves with
  std::string key_path;
  bool insecure = false;     // loopback plaintext (tests / local mode without TLS)
  std::string listen_host = "127.0.0.1";
};

// Runs the executor until Shutdown is called or the process is signalled.
// Returns the process exit code.
int RunExecutor(const ExecutorOptions& opts);

class TrainSession;        // train_session.h
class RlActorSession;      // rl_actor_session.h
class RolloutPoolSession;  // rollout_pool.h
class GenerateSession;     // generate.h
struct GroupComms;

// The executor's operations, one per ExecutorService RPC (whose comments say what each
// does), without gRPC: RunExecutor's service authenticates a call and forwards it here.
// Every operation first checks the spec's paths against the controller's roots again,
// symbolic links resolved (a link under a root may lead out of it on this host), then
// finds the request's group: NOT_FOUND when this executor hosts no rank of it,
// FAILED_PRECONDITION before InitGroup and for operations out of order.
// Sessions per group: TrainInit makes the TrainSession of the job's kind (a
// PretrainSession for pretrain and sft, which TrainStep drives; an RlActorSession for the
// actor of grpo / ppo, which RlForward and RlUpdate drive and which generates its own
// samples when the job has no rollout group) or of the group's role in an RL job (an
// RlReferenceSession, RlForward's; an RlCriticSession, RlForward's and RlUpdate's); an
// operation for another kind's session is FAILED_PRECONDITION naming both;
// RolloutInit a RolloutPoolSession (a rollout group); Generate a GenerateSession.
// Groups sharing the executor's device take turns when they offload (groups[].offload):
// before a call on an offloading group (its TrainInit or RolloutInit included), every
// other offloading group here parks its states in host memory (runtime::HostOffload) and
// the called group's come back — for the actor's weight sync into a colocated rollout
// group, both groups'. A call on a group that stays moves nothing: it runs beside the
// offloading group whose turn it was. Each RL call's response says what its turn cost
// (swap_s, swap_bytes).
//
// Threading: any thread may call; InitGroup runs beside other groups' calls, and the
// operations on sessions run one at a time (the driver calls one at a time per group).
class Executor {
 public:
  // `rdv`: the job's rendezvous (outlives the executor).
  Executor(v1::ExecutorConfig cfg, comm::KvStore* rdv, std::string listen_host);
  ~Executor();
  const v1::ExecutorConfig& config() const { return cfg_; }

  absl::StatusOr<v1::InitGroupResponse> InitGroup(const v1::InitGroupRequest& req);
  absl::StatusOr<v1::CommCheckResponse> CommCheck(const v1::CommCheckRequest& req);
  absl::StatusOr<v1::TrainInitResponse> TrainInit(const v1::TrainInitRequest& req);
  absl::StatusOr<v1::TrainStepResponse> TrainStep(const v1::TrainStepRequest& req);
  absl::StatusOr<v1::RolloutInitResponse> RolloutInit(const v1::RolloutInitRequest& req);
  // The samples go to `samples`.
  absl::StatusOr<v1::RolloutStats> RolloutGenerate(const v1::RolloutGenerateRequest& req, v1::TensorBatch* samples);
  // The per-token tensor goes to `out`.
  absl::StatusOr<v1::RlForwardStats> RlForward(const v1::RlForwardHeader& req, const v1::TensorBatch& samples, v1::TensorBatch* out);
  absl::StatusOr<v1::RlUpdateResponse> RlUpdate(const v1::RlUpdateHeader& req, const v1::TensorBatch& samples);
  absl::StatusOr<v1::RlEvalResponse> RlEval(const v1::RlEvalRequest& req);
  absl::StatusOr<v1::BridgeInitResponse> BridgeInit(const v1::BridgeInitRequest& req);
  absl::StatusOr<v1::SyncWeightsResponse> SyncWeights(const v1::SyncWeightsRequest& req);
  absl::StatusOr<v1::WeightsDigestResponse> WeightsDigest(const v1::WeightsDigestRequest& req);
  absl::StatusOr<v1::GenerateResponse> Generate(const v1::GenerateRequest& req);

 private:
  absl::Status CheckPaths() const;
  absl::StatusOr<std::shared_ptr<GroupComms>> Group(const std::string& group);
  TrainSession* SessionOf(const std::string& group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_mu_);
  RolloutPoolSession* PoolOf(const std::string& group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_mu_);
  // The group's training session or rollout pool (one of them is set); FAILED_PRECONDITION
  // when it has neither.
  struct GroupSession {
    TrainSession* train;
    RolloutPoolSession* pool;
  };
  absl::StatusOr<GroupSession> AnySessionOf(const std::string& group) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_mu_);
  // The group's RL actor session; FAILED_PRECONDITION naming `op` when the group has no
  // training session or trains another kind.
  absl::StatusOr<RlActorSession*> RlActorOf(const std::string& group, const char* op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_mu_);
  // The turn of the groups in `active` on this device (see above), when one of them
  // offloads: the other offloading groups parked first (their memory is what the active
  // ones come back into), then the active ones restored. What it moved, summed over the
  // groups.
  struct Swap {
    double seconds = 0;
    int64_t bytes = 0;
  };
  absl::StatusOr<Swap> TakeTurn(std::initializer_list<std::string> active) ABSL_EXCLUSIVE_LOCKS_REQUIRED(ops_mu_);

  const v1::ExecutorConfig cfg_;
  comm::KvStore* const rdv_;
  const std::string listen_host_;
  std::mutex groups_mu_;
  std::map<std::string, std::shared_ptr<GroupComms>> groups_ ABSL_GUARDED_BY(groups_mu_);
  std::mutex ops_mu_;  // one session operation at a time
  std::map<std::string, std::unique_ptr<TrainSession>> sessions_ ABSL_GUARDED_BY(ops_mu_);
  std::map<std::string, std::unique_ptr<RolloutPoolSession>> pools_ ABSL_GUARDED_BY(ops_mu_);
  std::unique_ptr<comm::Communicator> bridge_ ABSL_GUARDED_BY(ops_mu_);  // a rollout group's own devices: actor + rollout ranks
  // Per offloading group, its parked states (declared after the sessions: gone first).
  std::map<std::string, std::unique_ptr<runtime::HostOffload>> parked_ ABSL_GUARDED_BY(ops_mu_);
};

// The gRPC service over `ex` (which outlives it): every call must carry the attempt's
// secret (UNAUTHENTICATED otherwise) and name this executor (FAILED_PRECONDITION
// otherwise); RolloutGenerate and RlUpdate move their samples in TensorChunks
// (common/rpc/tensor_stream.h); Shutdown ends RunExecutor's loop.
std::unique_ptr<v1::ExecutorService::Service> MakeExecutorService(Executor* ex);

// Communicators of one worker group on this executor, by parallel-group kind.
struct GroupComms {
  parallel::Layout layout;
  int rank = 0;
  std::map<parallel::GroupKind, std::unique_ptr<comm::Communicator>> comms;
  std::map<parallel::GroupKind, int> group_index;
};

// The group's communicator of kind `k` (null if the layout has none).
comm::Communicator* CommOf(GroupComms& gc, parallel::GroupKind k);
// On GPUs, orders every communicator of the group after the backend's compute stream
// (OrderWith); nothing on CPU slots.
absl::Status OrderCommsWith(GroupComms& gc, v1::DeviceType device, void* stream);

// Builds every communicator kind of `layout` for `rank`, through the rendezvous.
// Backend: Gloo for CPU devices, NCCL for GPU devices.
absl::StatusOr<GroupComms> BuildGroupComms(const std::string& group, const parallel::Layout& layout, int rank,
                                           v1::DeviceType device, int device_index, comm::KvStore* rdv,
                                           const std::string& listen_host, int64_t timeout_ms);

}  // namespace tessera::executor
