// The trainer's early embedding reduction (trainer.h, EmbeddingRows): ZeRO-0 with DP and
// no pipeline. The embedding's gradient — the head's contribution too when tied — is
// all-reduced right after the last micro-batch's LM head backward; that micro-batch's
// embedding rows travel compacted instead of in the full table.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/train/trainer.h"

namespace tessera::engine {

using runtime::Tensor;

model::Param* Trainer::EarlyEmbedding() const {
  return rows_ != nullptr && reduce_in_backward_ ? rows_->embed : nullptr;
}

// At the step's start: every DP rank's token ids of its last micro-batch, gathered on
// the host (their counts, then the ids padded to the longest; host collectives, so the
// host does not wait for the last step's optimizer and this work hides under it), give
// the rows touched in this TP rank's share of the vocabulary and each local token's
// place among them.
absl::Status Trainer::PlanEmbeddingRows(const model::TokenBatch& last) {
  rows_.reset();
  model::Param* e = model_->Find("model.embed_tokens.weight");
  if (dp_ == nullptr || hooks_ == nullptr || e == nullptr || !e->grad.defined() || e->grad.rank() != 2)
    return absl::OkStatus();
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
absl::StatusOr<bool> Trainer::TakeEmbeddingRows(const Tensor& ids, const Tensor& dout) {
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

// After the join: the rows into the (already reduced) embedding gradient, each row once.
absl::Status Trainer::AddEmbeddingRows() {
  if (rows_ == nullptr || rows_->count == 0 || !rows_->sums.defined()) return absl::OkStatus();
  TESSERA_RETURN_IF_ERROR(model_->FreshenGrad(*rows_->embed));
  return backend_->EmbeddingBackward(rows_->rows, rows_->sums, rows_->vocab_start, rows_->embed->grad);
}

}  // namespace tessera::engine
