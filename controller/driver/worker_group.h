// WorkerGroup: the driver's handle on one worker group of a running job. Its
// methods fan a call out to every executor of the group (in parallel) and gather
// the results (docs/design.md §2, The driver):
//  - ONE_TO_ALL: the same request to every rank.
//  - DP_SPLIT: the batch is split along dim 0 into dp shards; every TP/CP/PP peer
//    of a DP rank gets that rank's shard; outputs are taken from each DP rank's
//    output rank (tp=0, cp=0, last pipeline stage) and concatenated in DP order.
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
#include "tessera/v1/executor_service.pb.h"
#include "common/parallel/layout.h"

namespace tessera::controller {

// One executor as the driver sees it.
class ExecutorClient {
 public:
  virtual ~ExecutorClient() = default;
  virtual absl::StatusOr<v1::InitGroupResponse> InitGroup(const v1::InitGroupRequest& req, int64_t timeout_ms) = 0;
  virtual absl::StatusOr<v1::CallResponse> Call(const v1::CallRequest& req, int64_t timeout_ms) = 0;
  virtual absl::Status Shutdown(int64_t timeout_ms) = 0;
  virtual void Cancel() = 0;  // fails in-flight calls
  virtual std::string where() const { return ""; }  // "executor 3 on node n1", for errors
};

class WorkerGroup {
 public:
  WorkerGroup(std::string name, parallel::Layout layout, std::vector<std::shared_ptr<ExecutorClient>> by_rank,
              int64_t call_timeout_ms);
  const std::string& name() const { return name_; }
  const parallel::Layout& layout() const { return layout_; }
  int size() const { return static_cast<int>(ranks_.size()); }

  absl::StatusOr<std::vector<v1::InitGroupResponse>> InitAll();
  absl::StatusOr<std::vector<v1::CallResponse>> CallOneToAll(const std::string& method, const std::string& args_json,
                                                             const v1::TensorBatch& batch = {});
  absl::StatusOr<v1::TensorBatch> CallDpSplit(const std::string& method, const std::string& args_json,
                                              const v1::TensorBatch& batch);
  // DP_SPLIT's requests, every rank's response (in rank order).
  absl::StatusOr<std::vector<v1::CallResponse>> CallDpSplitEach(const std::string& method, const std::string& args_json,
                                                                const v1::TensorBatch& batch);
  void CancelAll();

 private:
  // Calls every rank at once (InitAll and every Call* go through it). A rank's failure
  // cancels the others (they would wait in a collective, or for its rendezvous keys),
  // except ABORTED, the executors' code for "failed because a peer did": that peer
  // returns its own error. The error reported is the rank whose own failure came first in
  // time (the others' timeouts and cancellations follow from it), else ABORTED, else
  // CANCELLED; it says how many ranks failed.
  template <typename Resp>
  absl::StatusOr<std::vector<Resp>> OnEveryRank(const std::function<absl::StatusOr<Resp>(size_t)>& call,
                                                const std::function<std::string(size_t)>& what);
  absl::StatusOr<std::vector<v1::CallResponse>> CallEach(const std::vector<v1::CallRequest>& reqs);
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
int DTypeSize(v1::DType t);

}  // namespace tessera::controller
