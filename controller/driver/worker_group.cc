#include "controller/driver/worker_group.h"

#include <atomic>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"

namespace tessera::controller {

int DTypeSize(v1::DType t) {
  switch (t) {
    case v1::DTYPE_F32: case v1::DTYPE_I32: return 4;
    case v1::DTYPE_BF16: case v1::DTYPE_F16: return 2;
    case v1::DTYPE_I64: return 8;
    case v1::DTYPE_U8: return 1;
    default: return 0;
  }
}

WorkerGroup::WorkerGroup(std::string name, parallel::Layout layout,
                         std::vector<std::shared_ptr<ExecutorClient>> by_rank, int64_t timeout_ms)
    : name_(std::move(name)), layout_(layout), ranks_(std::move(by_rank)), timeout_ms_(timeout_ms) {}

template <typename Resp>
absl::StatusOr<std::vector<Resp>> WorkerGroup::OnEveryRank(const std::function<absl::StatusOr<Resp>(size_t)>& call,
                                                          const std::function<std::string(size_t)>& what) {
  std::vector<absl::StatusOr<Resp>> res(ranks_.size(), absl::UnknownError("not run"));
  std::atomic<int> first_own{-1};  // the rank whose own failure came first
  std::vector<std::thread> ts;
  for (size_t r = 0; r < ranks_.size(); ++r)
    ts.emplace_back([&, r] {
      res[r] = call(r);
      // A failed rank leaves its peers stuck in collectives (or waiting for its
      // rendezvous keys): cancel them. ABORTED means "failed because a peer did" (the
      // peer reports why, and returns on its own): it cancels nothing, so that the peer's
      // own error is not cut off by the cancellation.
      const absl::StatusCode c = res[r].status().code();
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
    const absl::StatusCode c = res[r].status().code();
    return c == absl::StatusCode::kCancelled ? 2 : c == absl::StatusCode::kAborted ? 1 : 0;
  };
  if (first < 0)
    for (size_t r = 0; r < res.size(); ++r)
      if (!res[r].ok() && (first < 0 || order(r) < order(static_cast<size_t>(first)))) first = static_cast<int>(r);
  if (first >= 0) {
    int others = 0;
    for (size_t r = 0; r < res.size(); ++r) others += !res[r].ok() && static_cast<int>(r) != first;
    return Annotate(res[first].status(),
                    absl::StrCat("group '", name_, "' rank ", first,
                                 ranks_[first]->where().empty() ? "" : absl::StrCat(" (", ranks_[first]->where(), ")"),
                                 ": ", what(first),
                                 others ? absl::StrCat(" (first of ", others + 1, " ranks to fail)") : ""));
  }
  std::vector<Resp> out;
  for (auto& r : res) out.push_back(std::move(*r));
  return out;
}

absl::StatusOr<std::vector<v1::InitGroupResponse>> WorkerGroup::InitAll() {
  v1::InitGroupRequest req;
  req.set_group(name_);
  return OnEveryRank<v1::InitGroupResponse>([&](size_t r) { return ranks_[r]->InitGroup(req, timeout_ms_); },
                                            [](size_t) { return std::string("InitGroup"); });
}

absl::StatusOr<std::vector<v1::CallResponse>> WorkerGroup::CallEach(const std::vector<v1::CallRequest>& reqs) {
  return OnEveryRank<v1::CallResponse>([&](size_t r) { return ranks_[r]->Call(reqs[r], timeout_ms_); },
                                       [&](size_t r) { return reqs[r].method(); });
}

absl::StatusOr<std::vector<v1::CallResponse>> WorkerGroup::CallOneToAll(const std::string& method,
                                                                        const std::string& args_json,
                                                                        const v1::TensorBatch& batch) {
  v1::CallRequest req;
  req.set_group(name_);
  req.set_method(method);
  req.set_args_json(args_json);
  *req.mutable_batch() = batch;
  return CallEach(std::vector<v1::CallRequest>(ranks_.size(), req));
}

absl::StatusOr<std::vector<v1::CallResponse>> WorkerGroup::CallDpSplitEach(const std::string& method,
                                                                             const std::string& args_json,
                                                                             const v1::TensorBatch& batch) {
  TESSERA_ASSIGN_OR_RETURN(auto shards, SplitBatch(batch, layout_.dp));
  std::vector<v1::CallRequest> reqs(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    auto c = parallel::CoordsOf(layout_, static_cast<int>(r));
    reqs[r].set_group(name_);
    reqs[r].set_method(method);
    reqs[r].set_args_json(args_json);
    *reqs[r].mutable_batch() = shards[c.dp];
  }
  return CallEach(reqs);
}

absl::StatusOr<v1::TensorBatch> WorkerGroup::CallDpSplit(const std::string& method, const std::string& args_json,
                                                         const v1::TensorBatch& batch) {
  TESSERA_ASSIGN_OR_RETURN(auto res, CallDpSplitEach(method, args_json, batch));
  std::vector<v1::TensorBatch> outs(layout_.dp);
  for (size_t r = 0; r < ranks_.size(); ++r) {
    auto c = parallel::CoordsOf(layout_, static_cast<int>(r));
    if (c.tp == 0 && c.cp == 0 && c.pp == layout_.pp - 1) outs[c.dp] = res[r].batch();
  }
  return ConcatBatches(outs);
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
    int64_t row_bytes = row_elems * DTypeSize(t.dtype());
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
