#include "controller/driver/worker_group.h"

#include <atomic>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/rpc/tensor_stream.h"
#include "common/status.h"

namespace tessera::controller {

namespace {
absl::Status Unimplemented(const char* rpc) {
  return absl::UnimplementedError(absl::StrCat(rpc, " is not implemented by this executor client"));
}
}  // namespace

absl::StatusOr<v1::InitGroupResponse> ExecutorClient::InitGroup(const v1::InitGroupRequest&, int64_t) {
  return Unimplemented("InitGroup");
}
absl::StatusOr<v1::CommCheckResponse> ExecutorClient::CommCheck(const v1::CommCheckRequest&, int64_t) {
  return Unimplemented("CommCheck");
}
absl::StatusOr<v1::TrainInitResponse> ExecutorClient::TrainInit(const v1::TrainInitRequest&, int64_t) {
  return Unimplemented("TrainInit");
}
absl::StatusOr<v1::TrainStepResponse> ExecutorClient::TrainStep(const v1::TrainStepRequest&, int64_t) {
  return Unimplemented("TrainStep");
}
absl::StatusOr<v1::RolloutInitResponse> ExecutorClient::RolloutInit(const v1::RolloutInitRequest&, int64_t) {
  return Unimplemented("RolloutInit");
}
absl::StatusOr<v1::RolloutStats> ExecutorClient::RolloutGenerate(const v1::RolloutGenerateRequest&, v1::TensorBatch*, int64_t) {
  return Unimplemented("RolloutGenerate");
}
absl::StatusOr<v1::RlUpdateResponse> ExecutorClient::RlUpdate(const v1::RlUpdateHeader&, const v1::TensorBatch&, int64_t) {
  return Unimplemented("RlUpdate");
}
absl::StatusOr<v1::RlForwardStats> ExecutorClient::RlForward(const v1::RlForwardHeader&, const v1::TensorBatch&,
                                                             v1::TensorBatch*, int64_t) {
  return Unimplemented("RlForward");
}
absl::StatusOr<v1::RlEvalResponse> ExecutorClient::RlEval(const v1::RlEvalRequest&, int64_t) { return Unimplemented("RlEval"); }
absl::StatusOr<v1::BridgeInitResponse> ExecutorClient::BridgeInit(const v1::BridgeInitRequest&, int64_t) {
  return Unimplemented("BridgeInit");
}
absl::StatusOr<v1::SyncWeightsResponse> ExecutorClient::SyncWeights(const v1::SyncWeightsRequest&, int64_t) {
  return Unimplemented("SyncWeights");
}
absl::StatusOr<v1::WeightsDigestResponse> ExecutorClient::WeightsDigest(const v1::WeightsDigestRequest&, int64_t) {
  return Unimplemented("WeightsDigest");
}
absl::StatusOr<v1::GenerateResponse> ExecutorClient::Generate(const v1::GenerateRequest&, int64_t) {
  return Unimplemented("Generate");
}

WorkerGroup::WorkerGroup(std::string name, parallel::Layout layout,
                         std::vector<std::shared_ptr<ExecutorClient>> by_rank, int64_t timeout_ms)
    : name_(std::move(name)), layout_(layout), ranks_(std::move(by_rank)), timeout_ms_(timeout_ms) {}

std::string WorkerGroup::OperationName(absl::string_view request_type) {
  absl::ConsumeSuffix(&request_type, "Request");
  return std::string(request_type);
}

absl::Status WorkerGroup::OnEveryRank(const std::function<absl::Status(size_t)>& call, const std::string& what) {
  std::vector<absl::Status> res(ranks_.size(), absl::UnknownError("not run"));
  std::atomic<int> first_own{-1};  // the rank whose own failure came first
  std::vector<std::thread> ts;
  for (size_t r = 0; r < ranks_.size(); ++r)
    ts.emplace_back([&, r] {
      res[r] = call(r);
      // A failed rank leaves its peers stuck in collectives (or waiting for its
      // rendezvous keys): cancel them. ABORTED means "failed because a peer did" (the
      // peer reports why, and returns on its own): it cancels nothing, so that the peer's
      // own error is not cut off by the cancellation.
      const absl::StatusCode c = res[r].code();
      if (!res[r].ok() && c != absl::StatusCode::kAborted && c != absl::StatusCode::kCancelled) {
        int none = -1;
        first_own.compare_exchange_strong(none, static_cast<int>(r));
        CancelAll();
      }
    });
  for (auto& t : ts) t.join();
  // Report the rank whose own failure came first (its peers' failures, a timeout waiting
  // for it or a cancellation, are consequences); else one that failed because of a peer
  // (ABORTED); else a cancellation.
  int first = first_own.load();
  const auto order = [&](size_t r) {
    const absl::StatusCode c = res[r].code();
    return c == absl::StatusCode::kCancelled ? 2 : c == absl::StatusCode::kAborted ? 1 : 0;
  };
  if (first < 0)
    for (size_t r = 0; r < res.size(); ++r)
      if (!res[r].ok() && (first < 0 || order(r) < order(static_cast<size_t>(first)))) first = static_cast<int>(r);
  if (first < 0) return absl::OkStatus();
  int others = 0;
  for (size_t r = 0; r < res.size(); ++r) others += !res[r].ok() && static_cast<int>(r) != first;
  return Annotate(res[first],
                  absl::StrCat("group '", name_, "' rank ", first,
                               ranks_[first]->where().empty() ? "" : absl::StrCat(" (", ranks_[first]->where(), ")"), ": ",
                               what, others ? absl::StrCat(" (first of ", others + 1, " ranks to fail)") : ""));
}

absl::StatusOr<std::vector<v1::InitGroupResponse>> WorkerGroup::InitAll() {
  return OneToAll(&ExecutorClient::InitGroup, v1::InitGroupRequest{});
}

absl::StatusOr<std::vector<RankSamples>> WorkerGroup::RolloutGenerate(int64_t step, int refill) {
  v1::RolloutGenerateRequest req;
  req.set_group(name_);
  req.set_step(step);
  req.set_refill(refill);
  std::vector<RankSamples> out(ranks_.size());
  TESSERA_RETURN_IF_ERROR(OnEveryRank(
      [&](size_t r) -> absl::Status {
        TESSERA_ASSIGN_OR_RETURN(out[r].stats, ranks_[r]->RolloutGenerate(req, &out[r].samples, timeout_ms_));
        return absl::OkStatus();
      },
      "RolloutGenerate"));
  return out;
}

absl::StatusOr<std::vector<v1::RlUpdateResponse>> WorkerGroup::RlUpdateDpSplit(v1::RlUpdateHeader header,
                                                                              const v1::TensorBatch& samples) {
  header.set_group(name_);
  TESSERA_ASSIGN_OR_RETURN(auto shards, SplitBatch(samples, layout_.dp));
  std::vector<v1::RlUpdateResponse> out(ranks_.size());
  TESSERA_RETURN_IF_ERROR(OnEveryRank(
      [&](size_t r) -> absl::Status {
        const auto c = parallel::CoordsOf(layout_, static_cast<int>(r));
        TESSERA_ASSIGN_OR_RETURN(out[r], ranks_[r]->RlUpdate(header, shards[c.dp], timeout_ms_));
        return absl::OkStatus();
      },
      "RlUpdate"));
  return out;
}

absl::StatusOr<WorkerGroup::Forward> WorkerGroup::RlForwardDpSplit(v1::RlForwardHeader header, const v1::TensorBatch& samples) {
  header.set_group(name_);
  TESSERA_ASSIGN_OR_RETURN(auto shards, SplitBatch(samples, layout_.dp));
  Forward f;
  f.stats.resize(ranks_.size());
  std::vector<v1::TensorBatch> outs(ranks_.size());
  TESSERA_RETURN_IF_ERROR(OnEveryRank(
      [&](size_t r) -> absl::Status {
        const auto c = parallel::CoordsOf(layout_, static_cast<int>(r));
        TESSERA_ASSIGN_OR_RETURN(f.stats[r], ranks_[r]->RlForward(header, shards[c.dp], &outs[r], timeout_ms_));
        return absl::OkStatus();
      },
      "RlForward"));
  std::vector<v1::TensorBatch> by_dp(layout_.dp);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const auto c = parallel::CoordsOf(layout_, static_cast<int>(r));
    if (c.tp == 0 && c.cp == 0 && c.pp == 0) by_dp[c.dp] = std::move(outs[r]);
  }
  TESSERA_ASSIGN_OR_RETURN(f.out, ConcatBatches(by_dp));
  return f;
}

void WorkerGroup::CancelAll() {
  for (auto& e : ranks_) e->Cancel();
}

absl::StatusOr<std::vector<v1::TensorBatch>> SplitBatch(const v1::TensorBatch& batch, int parts) {
  std::vector<v1::TensorBatch> out(parts);
  for (const auto& t : batch.tensors()) {
    if (t.shape_size() == 0)
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "' is a scalar and cannot be split by dp"));
    int64_t rows = t.shape(0);
    if (rows % parts != 0)
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "' has ", rows,
                                                     " rows, not divisible by dp=", parts));
    int64_t row_elems = 1;
    for (int i = 1; i < t.shape_size(); ++i) row_elems *= t.shape(i);
    int64_t row_bytes = row_elems * TensorDTypeBytes(t.dtype());
    if (static_cast<int64_t>(t.data().size()) != rows * row_bytes)
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name(), "' has ", t.data().size(),
                                                     " bytes, expected ", rows * row_bytes, " for its shape"));
    int64_t per = rows / parts;
    for (int p = 0; p < parts; ++p) {
      auto* s = out[p].add_tensors();
      s->set_name(t.name());
      s->set_dtype(t.dtype());
      s->add_shape(per);
      for (int i = 1; i < t.shape_size(); ++i) s->add_shape(t.shape(i));
      s->set_data(t.data().substr(p * per * row_bytes, per * row_bytes));
    }
  }
  return out;
}

absl::StatusOr<v1::TensorBatch> ConcatBatches(const std::vector<v1::TensorBatch>& shards) {
  v1::TensorBatch out;
  if (shards.empty()) return out;
  for (int i = 0; i < shards[0].tensors_size(); ++i) {
    const auto& first = shards[0].tensors(i);
    auto* t = out.add_tensors();
    *t = first;
    for (size_t s = 1; s < shards.size(); ++s) {
      const v1::NamedTensor* m = nullptr;
      for (const auto& c : shards[s].tensors()) if (c.name() == first.name()) m = &c;
      if (!m) return absl::InternalError(absl::StrCat("shard ", s, " lacks tensor '", first.name(), "'"));
      if (m->dtype() != first.dtype() || m->shape_size() != first.shape_size())
        return absl::InternalError(absl::StrCat("shard ", s, " tensor '", first.name(), "' differs in dtype or rank"));
      t->set_shape(0, t->shape(0) + m->shape(0));
      t->mutable_data()->append(m->data());
    }
  }
  return out;
}

}  // namespace tessera::controller
