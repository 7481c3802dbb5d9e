// WorkerGroup: the driver's handle on one worker group of a running job. Its
// methods fan a call out to every executor of the group (in parallel) and gather
// the results (docs/design.md §2, The driver):
//  - ONE_TO_ALL: the same request to every rank.
//  - DP_SPLIT: the batch is split along dim 0 into dp shards; every TP/CP/PP peer
//    of a DP rank gets that rank's shard.
//
// Threading: a WorkerGroup is used by one driver thread; each call spawns one
// thread per rank and joins them before returning.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/parallel/layout.h"
#include "common/status.h"
#include "tessera/v1/executor_service.pb.h"

namespace tessera::controller {

// One executor as the driver sees it: one method per ExecutorService RPC
// (proto/tessera/v1/executor_service.proto), each with a deadline. The streamed RPCs take
// and give whole batches (the client chunks them). Methods a test's fake leaves out
// answer UNIMPLEMENTED.
class ExecutorClient {
 public:
  virtual ~ExecutorClient() = default;
  virtual absl::StatusOr<v1::InitGroupResponse> InitGroup(const v1::InitGroupRequest& req, int64_t timeout_ms);
  virtual absl::StatusOr<v1::CommCheckResponse> CommCheck(const v1::CommCheckRequest& req, int64_t timeout_ms);
  virtual absl::StatusOr<v1::TrainInitResponse> TrainInit(const v1::TrainInitRequest& req, int64_t timeout_ms);
  virtual absl::StatusOr<v1::TrainStepResponse> TrainStep(const v1::TrainStepRequest& req, int64_t timeout_ms);
  virtual absl::StatusOr<v1::RolloutInitResponse> RolloutInit(const v1::RolloutInitRequest& req, int64_t timeout_ms);
  virtual absl::StatusOr<v1::RolloutStats> RolloutGenerate(const v1::RolloutGenerateRequest& req, v1::TensorBatch* samples,
                                                           int64_t timeout_ms);
  virtual absl::StatusOr<v1::RlUpdateResponse> RlUpdate(const v1::RlUpdateHeader& req, const v1::TensorBatch& samples,
                                                        int64_t timeout_ms);
  virtual absl::StatusOr<v1::RlForwardStats> RlForward(const v1::RlForwardHeader& req, const v1::TensorBatch& samples,
                                                       v1::TensorBatch* out, int64_t timeout_ms);
  virtual absl::StatusOr<v1::RlEvalResponse> RlEval(const v1::RlEvalRequest& req, int64_t timeout_ms);
  virtual absl::StatusOr<v1::BridgeInitResponse> BridgeInit(const v1::BridgeInitRequest& req, int64_t timeout_ms);
  virtual absl::StatusOr<v1::SyncWeightsResponse> SyncWeights(const v1::SyncWeightsRequest& req, int64_t timeout_ms);
  virtual absl::StatusOr<v1::WeightsDigestResponse> WeightsDigest(const v1::WeightsDigestRequest& req, int64_t timeout_ms);
  virtual absl::StatusOr<v1::GenerateResponse> Generate(const v1::GenerateRequest& req, int64_t timeout_ms);
  virtual absl::Status Shutdown(int64_t timeout_ms) = 0;
  virtual void Cancel() = 0;  // fails in-flight calls
  virtual std::string where() const { return ""; }  // "executor 3 on node n1", for errors
};

// One rank's RolloutGenerate.
struct RankSamples {
  v1::RolloutStats stats;
  v1::TensorBatch samples;
};

class WorkerGroup {
 public:
  WorkerGroup(std::string name, parallel::Layout layout, std::vector<std::shared_ptr<ExecutorClient>> by_rank,
              int64_t call_timeout_ms);
  const std::string& name() const { return name_; }
  const parallel::Layout& layout() const { return layout_; }
  int size() const { return static_cast<int>(ranks_.size()); }

  absl::StatusOr<std::vector<v1::InitGroupResponse>> InitAll();
  // ONE_TO_ALL: `req`, its group set to this group's name, to every rank over `rpc`
  // (e.g. &ExecutorClient::TrainStep); the responses in rank order.
  template <typename Req, typename Resp>
  absl::StatusOr<std::vector<Resp>> OneToAll(absl::StatusOr<Resp> (ExecutorClient::*rpc)(const Req&, int64_t), Req req) {
    req.set_group(name_);
    std::vector<Resp> out(ranks_.size());
    TESSERA_RETURN_IF_ERROR(OnEveryRank(
        [&](size_t r) -> absl::Status {
          TESSERA_ASSIGN_OR_RETURN(out[r], (ranks_[r].get()->*rpc)(req, timeout_ms_));
          return absl::OkStatus();
        },
        OperationName(Req::descriptor()->name())));
    return out;
  }
  // ONE_TO_ALL RolloutGenerate of `step` (and dynamic sampling's `refill`): every rank's
  // statistics and samples.
  absl::StatusOr<std::vector<RankSamples>> RolloutGenerate(int64_t step, int refill = 0);
  // DP_SPLIT RlUpdate: `samples` split along dim 0 over the DP ranks (INVALID_ARGUMENT
  // naming the tensor when a dim 0 does not divide); every rank's response.
  absl::StatusOr<std::vector<v1::RlUpdateResponse>> RlUpdateDpSplit(v1::RlUpdateHeader header, const v1::TensorBatch& samples);
  // DP_SPLIT RlForward: every rank's statistics, and the per-token tensors of TP rank 0
  // of each DP rank concatenated in DP order (the whole batch's, in its order).
  struct Forward {
    std::vector<v1::RlForwardStats> stats;
    v1::TensorBatch out;
  };
  absl::StatusOr<Forward> RlForwardDpSplit(v1::RlForwardHeader header, const v1::TensorBatch& samples);
  void CancelAll();

 private:
  // "TrainStep" of "TrainStepRequest": the operation, for errors.
  static std::string OperationName(absl::string_view request_type);
  // Runs call(r) for every rank at once (every fan-out goes through it). A rank's failure
  // cancels the others (they would wait in a collective, or for its rendezvous keys),
  // except ABORTED, the executors' code for "failed because a peer did": that peer
  // returns its own error. The error reported is the rank whose own failure came first in
  // time (the others' timeouts and cancellations follow from it), else ABORTED, else
  // CANCELLED, annotated with the group, the rank, its executor and `what`; it says how
  // many ranks failed.
  absl::Status OnEveryRank(const std::function<absl::Status(size_t)>& call, const std::string& what);
  std::string name_;
  parallel::Layout layout_;
  std::vector<std::shared_ptr<ExecutorClient>> ranks_;
  int64_t timeout_ms_;
};

// Splits every tensor of `batch` along dim 0 into `parts` equal shards
// (INVALID_ARGUMENT naming the tensor when dim 0 does not divide).
absl::StatusOr<std::vector<v1::TensorBatch>> SplitBatch(const v1::TensorBatch& batch, int parts);
// Concatenates shards along dim 0; tensors are matched by name.
absl::StatusOr<v1::TensorBatch> ConcatBatches(const std::vector<v1::TensorBatch>& shards);

}  // namespace tessera::controller
