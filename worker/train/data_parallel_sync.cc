// ZeRO-0 (grad_sync.h): gradients all-reduced, state replicated. With DP and no pipeline
// the last micro-batch's backward all-reduces each block's gradients as it goes, and the
// embedding's gradient — the head's contribution too when tied — right after that
// micro-batch's LM head backward; its embedding rows travel compacted instead of in the
// full table (EmbeddingRows).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/train/grad_sync.h"

namespace tessera::engine {

using runtime::Tensor;

// The embedding's gradient is all-reduced as soon as the last micro-batch's LM head
// backward is done — under every layer's backward — instead of after the embedding's
// backward, the last thing in the step (1 GiB exposed for a 128k x 2048 f32 table). That
// micro-batch's embedding rows go round instead, compacted to the rows any DP rank's
// tokens touch ([rows, hidden] f32, all-reduced), and are added after the join, each row
// once (the same result on every rank). Planned at the step's start (the ranks' last
// token ids, gathered on the host); taken by the model's embedding backward
// (TakeEmbeddingRows); added after the join (FinishLastBackward).
struct DataParallelSync::EmbeddingRows {
  model::Param* embed = nullptr;
  int64_t vocab_start = 0;  // this TP rank's first vocabulary row
  int64_t count = 0;        // rows any DP rank's tokens touch in this rank's vocabulary
  Tensor rows;  // i32 [count]: those rows' vocabulary ids, ascending
  Tensor pos;   // i32 [tokens]: each local token's index in `rows` (-1: another TP rank's)
  Tensor sums;  // f32 [count, hidden]: the rows' gradients, all-reduced over DP
};

DataParallelSync::DataParallelSync(model::Llama* model, runtime::Backend* backend, comm::Communicator* dp,
                                   comm::Communicator* tp, comm::Communicator* pp)
    : GradSync(0, model, backend, dp, tp, pp) {}
DataParallelSync::~DataParallelSync() = default;

absl::Status DataParallelSync::IssueReduce(ParamState& s) {
  Tensor& g = s.param->grad;
  return dp_->AllReduce(g.data(), g.data(), s.n, DType::kF32, comm::ReduceOp::kSum);
}

absl::StatusOr<Tensor*> DataParallelSync::ReduceGrad(ParamState& s) {
  const bool reduced = s.reduced;  // during the backward (ReduceEarly)
  s.reduced = false;
  if (dp_ != nullptr && !reduced) TESSERA_RETURN_IF_ERROR(IssueReduce(s));
  return &s.param->grad;
}

absl::Status DataParallelSync::Update(ParamState& s, const runtime::AdamWParams& hp) {
  model::Param& p = *s.param;
  TESSERA_ASSIGN_OR_RETURN(Tensor m, s.m.Reshape(p.value.shape()));
  TESSERA_ASSIGN_OR_RETURN(Tensor v, s.v.Reshape(p.value.shape()));
  // Mixed precision: AdamW writes the bf16 compute copy in the same pass.
  Tensor* lowp = p.compute.defined() ? &p.compute : nullptr;
  return backend_->AdamW(p.value, p.grad, m, v, hp, lowp);
}

absl::Status DataParallelSync::GradsReady(int block) {
  if (!reducing_) return absl::OkStatus();
  model::Param* early = EarlyEmbedding();  // reduced after the LM head's backward instead
  std::vector<ParamState*> bucket;  // the block's gradients: one bucket
  for (model::Param* p : model_->BlockOwns(block))
    if (p != early) bucket.push_back(&StateOf(p));
  if (early != nullptr && block == model_->num_blocks() - 1) bucket.push_back(&StateOf(early));
  return ReduceEarly(bucket);
}

absl::Status DataParallelSync::FinishLastBackward(bool joined) {
  absl::Status st;
  if (joined && rows_ != nullptr && rows_->count > 0 && rows_->sums.defined()) {
    // The rows into the (already reduced) embedding gradient, each row once.
    st = model_->FreshenGrad(*rows_->embed);
    if (st.ok()) st = backend_->EmbeddingBackward(rows_->rows, rows_->sums, rows_->vocab_start, rows_->embed->grad);
  }
  rows_.reset();
  return st;
}

model::Param* DataParallelSync::EarlyEmbedding() const {
  return rows_ != nullptr && reducing_ ? rows_->embed : nullptr;
}

// At the step's start: every DP rank's token ids of its last micro-batch, gathered on
// the host (their counts, then the ids padded to the longest; host collectives, so the
// host does not wait for the last step's optimizer and this work hides under it), give
// the rows touched in this TP rank's share of the vocabulary and each local token's
// place among them.
absl::Status DataParallelSync::PlanStep(const std::vector<model::TokenBatch>& micro_batches) {
  rows_.reset();
  model::Param* e = model_->Find("model.embed_tokens.weight");
  if (!uses_hooks() || micro_batches.empty() || e == nullptr || !e->grad.defined() || e->grad.rank() != 2)
    return absl::OkStatus();
  const model::TokenBatch& last = micro_batches.back();
  runtime::Backend& b = *backend_;
  const int dps = dp_->size();
  auto gather = [&](const std::vector<int32_t>& mine) -> absl::StatusOr<std::vector<int32_t>> {
    std::vector<int32_t> all(mine.size() * dps);  // on the host: not behind the device's work
    TESSERA_RETURN_IF_ERROR(dp_->AllGatherHost(mine.data(), all.data(), mine.size(), DType::kI32));
    return all;
  };
  TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> counts, gather({static_cast<int32_t>(last.tokens.size())}));
  std::vector<int32_t> mine(last.tokens.begin(), last.tokens.end());
  mine.resize(std::max<size_t>(1, *std::max_element(counts.begin(), counts.end())), -1);
  TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> all, gather(mine));
  auto r = std::make_unique<EmbeddingRows>();
  r->embed = e;
  const int64_t vocab = e->grad.dim(0);
  r->vocab_start = tp_ != nullptr ? tp_->rank() * vocab : 0;
  std::vector<int32_t> rows;
  for (int32_t id : all)
    if (id >= r->vocab_start && id < r->vocab_start + vocab) rows.push_back(id);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  std::vector<int32_t> pos(last.tokens.size(), -1);
  for (size_t i = 0; i < pos.size(); ++i) {
    auto it = std::lower_bound(rows.begin(), rows.end(), last.tokens[i]);
    if (it != rows.end() && *it == last.tokens[i]) pos[i] = static_cast<int32_t>(it - rows.begin());
  }
  r->count = static_cast<int64_t>(rows.size());
  TESSERA_ASSIGN_OR_RETURN(r->pos, b.Empty({static_cast<int64_t>(pos.size())}, DType::kI32));
  TESSERA_RETURN_IF_ERROR(b.CopyFromHost(pos.data(), r->pos));
  if (r->count > 0) {
    TESSERA_ASSIGN_OR_RETURN(r->rows, b.Empty({r->count}, DType::kI32));
    TESSERA_RETURN_IF_ERROR(b.CopyFromHost(rows.data(), r->rows));
  }
  rows_ = std::move(r);  // (uploads from pageable host memory are staged before CopyFromHost returns)
  return absl::OkStatus();
}

// The model's embedding backward of the last micro-batch: the local rows summed into
// their compact places, then all-reduced over DP (overlapped, joined before the norm).
absl::StatusOr<bool> DataParallelSync::TakeEmbeddingRows(const Tensor& ids, const Tensor& dout, int64_t /*vocab_start*/) {
  if (EarlyEmbedding() == nullptr) return false;  // only the last micro-batch's rows
  EmbeddingRows& r = *rows_;
  if (ids.numel() != r.pos.numel())
    return absl::InternalError(absl::StrCat("trainer: the embedding's backward has ", ids.numel(), " tokens, planned for ",
                                            r.pos.numel()));
  if (r.count == 0) return true;
  runtime::Backend& b = *backend_;
  TESSERA_ASSIGN_OR_RETURN(r.sums, b.Empty({r.count, dout.dim(1)}, DType::kF32));
  TESSERA_RETURN_IF_ERROR(b.Fill(r.sums, 0));
  TESSERA_RETURN_IF_ERROR(b.EmbeddingBackward(r.pos, dout, 0, r.sums));
  TESSERA_RETURN_IF_ERROR(dp_->AllReduce(r.sums.data(), r.sums.data(), r.sums.numel(), DType::kF32, comm::ReduceOp::kSum));
  return true;
}

}  // namespace tessera::engine
