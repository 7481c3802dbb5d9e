#include "worker/train/grad_sync.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/train/grouped.h"

namespace tessera::engine {
using runtime::Tensor;

GradSync::GradSync(int zero, model::Llama* model, runtime::Backend* backend, comm::Communicator* dp,
                   comm::Communicator* tp, comm::Communicator* pp)
    : zero_(zero), model_(model), backend_(backend), dp_(dp), tp_(tp), pp_(pp) {
  sliced_ = zero == 3 || (zero >= 1 && model->config().dtype != DType::kF32);
}
GradSync::~GradSync() = default;

absl::StatusOr<std::unique_ptr<GradSync>> GradSync::Create(int zero, model::Llama* model, runtime::Backend* backend,
                                                           comm::Communicator* dp, comm::Communicator* tp,
                                                           comm::Communicator* pp) {
  if (zero < 0 || zero > 3) return absl::InvalidArgumentError(absl::StrCat("trainer: zero must be 0, 1, 2 or 3, got ", zero));
  if (dp == nullptr) zero = 0;  // one DP rank: nothing to shard
  std::unique_ptr<GradSync> s;
  if (zero == 0) s = std::make_unique<DataParallelSync>(model, backend, dp, tp, pp);
  else if (zero < 3) s = std::make_unique<DistributedOptimizer>(zero, model, backend, dp, tp, pp);
  else s = std::make_unique<FullyShardedSync>(model, backend, dp, tp, pp);
  TESSERA_RETURN_IF_ERROR(s->Allocate());
  return s;
}

absl::Status GradSync::Allocate() {
  runtime::Backend& b = *backend_;
  const int dp = dp_ ? dp_->size() : 1;
  for (auto& p : model_->params()) {
    ParamState s;
    s.param = &p;
    s.shape = p.value.shape();
    s.n = p.value.numel();
    s.decay = p.spec.shape.size() > 1;
    const model::TpSplit split = model_->SplitOf(p);
    s.tp_sharded = tp_ != nullptr && split.dim >= 0;
    // Counted on another rank: the last stage's copy of a tied embedding (the first
    // stage's counts), a replicated KV head's copies but the first.
    s.norm_elsewhere = (pp_ != nullptr && pp_->rank() != 0 && p.name() == "model.embed_tokens.weight") ||
                       (split.dim >= 0 && split.replica != 0);
    s.shard = zero_ > 0 ? (s.n + dp - 1) / dp : s.n;
    TESSERA_ASSIGN_OR_RETURN(s.m, b.Empty({s.shard}, DType::kF32));
    TESSERA_ASSIGN_OR_RETURN(s.v, b.Empty({s.shard}, DType::kF32));
    TESSERA_RETURN_IF_ERROR(b.Fill(s.m, 0));
    TESSERA_RETURN_IF_ERROR(b.Fill(s.v, 0));
    TESSERA_RETURN_IF_ERROR(AllocateParam(s));
    states_.push_back(std::move(s));
  }
  return absl::OkStatus();
}

void GradSync::SliceOf(const ParamState& s, int64_t* begin, int64_t* len) const {
  const int rank = dp_ ? dp_->rank() : 0;
  *begin = std::min<int64_t>(s.n, rank * s.shard);
  *len = std::min<int64_t>(s.shard, s.n - *begin);
}

ParamState& GradSync::StateOf(const model::Param* p) {
  return states_[static_cast<size_t>(p - model_->params().data())];
}

int GradSync::NextBlock(int block, Phase phase) const {
  const int next = phase == Phase::kForward ? block + 1 : block - 1;
  return next >= 0 && next < model_->num_blocks() ? next : -1;
}

absl::Status GradSync::BeginStep() { return absl::OkStatus(); }

absl::Status GradSync::SliceValue(ParamState& s) {
  runtime::Backend& b = *backend_;
  TESSERA_ASSIGN_OR_RETURN(s.value_shard, b.Empty({s.shard}, DType::kF32));
  TESSERA_RETURN_IF_ERROR(b.Fill(s.value_shard, 0));
  int64_t begin, len;
  SliceOf(s, &begin, &len);
  if (len > 0) {
    TESSERA_ASSIGN_OR_RETURN(Tensor flat, s.param->value.Reshape({s.n}));
    TESSERA_ASSIGN_OR_RETURN(Tensor mine, flat.Slice(0, begin, len));
    TESSERA_ASSIGN_OR_RETURN(Tensor dst, s.value_shard.Slice(0, 0, len));
    TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, mine, 0.f, dst));
  }
  s.param->value = Tensor();
  return absl::OkStatus();
}

absl::Status GradSync::UpdateSlice(ParamState& s, Tensor& p, int64_t len, const runtime::AdamWParams& hp, Tensor* lowp) {
  TESSERA_ASSIGN_OR_RETURN(Tensor g, s.grad_shard.Slice(0, 0, len));
  TESSERA_ASSIGN_OR_RETURN(Tensor m, s.m.Slice(0, 0, len));
  TESSERA_ASSIGN_OR_RETURN(Tensor v, s.v.Slice(0, 0, len));
  return backend_->AdamW(p, g, m, v, hp, lowp);
}

absl::Status GradSync::GatherValue(ParamState& s, bool refresh_compute) {
  if (s.param->value.defined()) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(Tensor full, backend_->Empty({s.shard * dp_->size()}, DType::kF32));
  TESSERA_RETURN_IF_ERROR(dp_->AllGather(s.value_shard.data(), full.data(), s.shard, DType::kF32));
  TESSERA_ASSIGN_OR_RETURN(Tensor head, full.Slice(0, 0, s.n));
  TESSERA_ASSIGN_OR_RETURN(s.param->value, head.Reshape(s.shape));
  return refresh_compute ? model_->RefreshCompute(*s.param) : absl::OkStatus();
}

// The padding is zeroed (the reduce-scatter reads it); the gradient itself starts stale,
// so the micro-batch's first write overwrites it (Param::grad_stale) — no fill of every
// gradient per micro-batch.
absl::Status GradSync::EnsureGrad(ParamState& s) {
  if (s.param->grad.defined()) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(s.grad_full, backend_->Empty({s.shard * dp_->size()}, DType::kF32));
  if (const int64_t tail = s.grad_full.numel() - s.n; tail > 0) {
    TESSERA_ASSIGN_OR_RETURN(Tensor rest, s.grad_full.Slice(0, s.n, tail));
    TESSERA_RETURN_IF_ERROR(backend_->Fill(rest, 0));
  }
  TESSERA_ASSIGN_OR_RETURN(Tensor head, s.grad_full.Slice(0, 0, s.n));
  TESSERA_ASSIGN_OR_RETURN(s.param->grad, head.Reshape(s.shape));
  return model_->MarkGradStale(*s.param);
}

absl::Status GradSync::ReduceBlockGrads(int block) {
  std::vector<ParamState*> bucket;
  std::vector<Tensor> mine;  // each buffer's chunk of this rank, where its reduced slice lands
  for (model::Param* p : model_->BlockOwns(block)) {
    ParamState& s = StateOf(p);
    if (!s.grad_full.defined())
      return absl::InternalError(absl::StrCat("trainer: no gradient buffer for ", p->name()));
    TESSERA_RETURN_IF_ERROR(model_->FreshenGrad(*p));  // one this micro-batch did not reach
    TESSERA_ASSIGN_OR_RETURN(Tensor chunk, s.grad_full.Slice(0, dp_->rank() * s.shard, s.shard));
    bucket.push_back(&s);
    mine.push_back(chunk);
  }
  TESSERA_RETURN_IF_ERROR(Grouped(*dp_, bucket.size() > 1, [&] {
    for (size_t k = 0; k < bucket.size(); ++k)
      TESSERA_RETURN_IF_ERROR(dp_->ReduceScatter(bucket[k]->grad_full.data(), mine[k].data(), bucket[k]->shard,
                                                 DType::kF32, comm::ReduceOp::kSum));
    return absl::OkStatus();
  }));
  for (size_t k = 0; k < bucket.size(); ++k) {
    ParamState* s = bucket[k];
    TESSERA_RETURN_IF_ERROR(backend_->Axpby(1.f, mine[k], 1.f, s->grad_shard));
    s->param->grad = Tensor();
    s->grad_full = Tensor();
  }
  return absl::OkStatus();
}

absl::Status GradSync::ReduceEarly(const std::vector<ParamState*>& bucket) {
  if (bucket.empty()) return absl::OkStatus();
  for (ParamState* s : bucket) TESSERA_RETURN_IF_ERROR(model_->FreshenGrad(*s->param));
  TESSERA_RETURN_IF_ERROR(Grouped(*dp_, bucket.size() > 1, [&] {
    for (ParamState* s : bucket) TESSERA_RETURN_IF_ERROR(IssueReduce(*s));
    return absl::OkStatus();
  }));
  for (ParamState* s : bucket) s->reduced = true;
  return absl::OkStatus();
}

absl::StatusOr<ParamPiece> GradSync::ReadPiece(size_t i) {
  if (i >= states_.size()) return absl::OutOfRangeError(absl::StrCat("trainer: no parameter ", i));
  ParamState& s = states_[i];
  int64_t begin, len;
  SliceOf(s, &begin, &len);
  ParamPiece p;
  auto read = [&](const Tensor& t, int64_t count, std::vector<float>& out) -> absl::Status {
    out.resize(count);
    if (count == 0) return absl::OkStatus();
    TESSERA_ASSIGN_OR_RETURN(Tensor flat, t.Reshape({t.numel()}));
    TESSERA_ASSIGN_OR_RETURN(Tensor head, flat.Slice(0, 0, count));
    return backend_->CopyToHost(head, out.data());
  };
  if (sliced_) {
    p.value_begin = begin;
    TESSERA_RETURN_IF_ERROR(read(s.value_shard, len, p.value));
  } else {
    TESSERA_RETURN_IF_ERROR(read(s.param->value, s.n, p.value));
  }
  p.state_begin = zero_ > 0 ? begin : 0;
  const int64_t state_len = zero_ > 0 ? len : s.n;
  TESSERA_RETURN_IF_ERROR(read(s.m, state_len, p.m));
  TESSERA_RETURN_IF_ERROR(read(s.v, state_len, p.v));
  return p;
}

PieceSlices GradSync::SlicesOf(size_t i) const {
  const ParamState& s = states_[i];
  int64_t begin, len;
  SliceOf(s, &begin, &len);
  PieceSlices r;
  r.n = s.n;
  if (sliced_) r.value_begin = begin, r.value_len = len;
  else r.value_len = s.n;
  if (zero_ > 0) r.state_begin = begin, r.state_len = len;
  else r.state_len = s.n;
  return r;
}

absl::Status GradSync::WriteHead(const std::vector<float>& src, Tensor& t) {
  TESSERA_RETURN_IF_ERROR(backend_->Fill(t, 0));  // the padding past n stays zero
  if (src.empty()) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(Tensor flat, t.Reshape({t.numel()}));
  TESSERA_ASSIGN_OR_RETURN(Tensor head, flat.Slice(0, 0, static_cast<int64_t>(src.size())));
  return backend_->CopyFromHost(src.data(), head);
}

absl::Status GradSync::LoadValue(ParamState& s, const ParamPiece& p) {
  TESSERA_RETURN_IF_ERROR(WriteHead(p.value, s.param->value));
  return model_->RefreshCompute(*s.param);
}

absl::Status GradSync::LoadPiece(size_t i, const ParamPiece& p) {
  if (i >= states_.size()) return absl::OutOfRangeError(absl::StrCat("trainer: no parameter ", i));
  ParamState& s = states_[i];
  const PieceSlices sl = SlicesOf(i);
  if (p.value_begin != sl.value_begin || static_cast<int64_t>(p.value.size()) != sl.value_len ||
      p.state_begin != sl.state_begin || static_cast<int64_t>(p.m.size()) != sl.state_len ||
      static_cast<int64_t>(p.v.size()) != sl.state_len)
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer: ", s.param->name(), " holds value elements [", sl.value_begin, ", +", sl.value_len, ") and moments [",
        sl.state_begin, ", +", sl.state_len, "); got [", p.value_begin, ", +", p.value.size(), ") and [", p.state_begin,
        ", +", p.m.size(), " / ", p.v.size(), ")"));
  TESSERA_RETURN_IF_ERROR(LoadValue(s, p));
  TESSERA_RETURN_IF_ERROR(WriteHead(p.m, s.m));
  return WriteHead(p.v, s.v);
}

absl::Status GradSync::ResetOptimizerState() {
  for (ParamState& s : states_) {
    TESSERA_RETURN_IF_ERROR(backend_->Fill(s.m, 0));
    TESSERA_RETURN_IF_ERROR(backend_->Fill(s.v, 0));
  }
  return absl::OkStatus();
}

}  // namespace tessera::engine
