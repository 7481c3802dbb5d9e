// The last virtual stage's head: the LM head's logits in chunks of tokens, the
// vocab-parallel cross-entropy (training's loss on the device; RL's log-probs and
// entropies on the host) and their backward; a critic's value head.
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/model/llama.h"
#include "worker/model/llama_internal.h"

namespace tessera::model {
using runtime::Backend;
using runtime::Tensor;

using internal::Linear;
using internal::LinearBackward;
using internal::New;

int64_t Llama::HeadChunkTokens(int64_t t) const {
  const int64_t vocab = std::max<int64_t>(1, config_.vocab / tp_size());
  const int64_t rows = head_chunk_tokens_ > 0 ? head_chunk_tokens_ : std::max<int64_t>(1, kHeadChunkElements / vocab);
  return std::max<int64_t>(1, std::min(rows, t));
}

absl::Status Llama::HeadForward(Flight& f, const TokenBatch& batch, bool backward, float grad_scale, LossSum* loss,
                                std::vector<float>* logits_out) {
  const int64_t t = batch.size();
  if (score_ != nullptr) return ValueHeadForward(f, t);  // a critic: values instead of logits
  const bool device_loss = backward && f.stats == nullptr && f.logprob_grad == nullptr;  // training's cross-entropy
  f.head_rows = HeadChunkTokens(t);
  Tensor part[4];  // per token: max, sum of exp, sum of exp * z, target logit
  TESSERA_RETURN_IF_ERROR(HeadPartials(f, /*dot=*/f.stats != nullptr, /*keep=*/backward && f.head_rows == t,
                                       logits_out, part));
  if (device_loss) return DeviceLoss(f, batch, grad_scale, loss, part);
  TESSERA_ASSIGN_OR_RETURN(f.lse, CrossEntropyLse(part, f.in, f.stats ? &f.stats->entropy : nullptr));
  if (f.stats != nullptr) {
    f.stats->logprob.assign(t, 0.f);
    for (int64_t i = 0; i < t; ++i)
      if (batch.targets[i] >= 0) f.stats->logprob[i] = f.in.target_logit[i] - f.lse[i];
  }
  std::vector<float> dlogp;  // a caller's dL/dlogprob (the loss is then its, not the cross-entropy)
  if (f.logprob_grad != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(TokenGrads g, (*f.logprob_grad)(*f.stats));
    dlogp = std::move(g.dlogprob);
    if (static_cast<int64_t>(dlogp.size()) != t)
      return absl::InvalidArgumentError(absl::StrCat("dL/dlogprob: ", dlogp.size(), " values for ", t, " tokens"));
    if (!g.dentropy.empty() && static_cast<int64_t>(g.dentropy.size()) != t)
      return absl::InvalidArgumentError(absl::StrCat("dL/dentropy: ", g.dentropy.size(), " values for ", t, " tokens"));
    f.dentropy = std::move(g.dentropy);
    for (int64_t i = 0; i < static_cast<int64_t>(f.dentropy.size()); ++i)
      if (batch.targets[i] < 0) f.dentropy[i] = 0.f;
  }
  f.dloss.assign(t, 0.f);
  for (int64_t i = 0; i < t; ++i) {
    if (batch.targets[i] < 0) continue;
    loss->sum += static_cast<double>(f.lse[i]) - f.in.target_logit[i];
    ++loss->tokens;
    f.dloss[i] = f.logprob_grad != nullptr ? -dlogp[i] : grad_scale;  // cross-entropy = -logprob
  }
  return absl::OkStatus();
}

absl::Status Llama::HeadPartials(Flight& f, bool dot, bool keep, std::vector<float>* logits_out, Tensor (&part)[4]) {
  Backend& b = *backend_;
  const int64_t t = f.xn_full.dim(0), vocab = config_.vocab / tp_size(), rows = f.head_rows;
  for (auto& p : part) {
    TESSERA_ASSIGN_OR_RETURN(p, New(b, {t}));
  }
  if (logits_out != nullptr) logits_out->resize(t * vocab);
  Tensor buf, buf32;  // one chunk's logits (and their f32 copy for the host), reused chunk after chunk
  TESSERA_ASSIGN_OR_RETURN(buf, New(b, {rows, vocab}, act_));
  for (int64_t r0 = 0; r0 < t; r0 += rows) {
    const int64_t n = std::min(rows, t - r0);
    TESSERA_ASSIGN_OR_RETURN(Tensor x, f.xn_full.Slice(0, r0, n));
    TESSERA_ASSIGN_OR_RETURN(Tensor targets, f.in.targets.Slice(0, r0, n));
    TESSERA_ASSIGN_OR_RETURN(Tensor logits, buf.Slice(0, 0, n));
    TESSERA_RETURN_IF_ERROR(Linear(b, x, lm_head_->weight(), logits));
    if (logits_out != nullptr) {  // f32 on the host whatever the compute dtype
      Tensor f32 = logits;
      if (f32.dtype() != DType::kF32) {
        if (!buf32.defined()) {
          TESSERA_ASSIGN_OR_RETURN(buf32, New(b, {rows, vocab}));
        }
        TESSERA_ASSIGN_OR_RETURN(f32, buf32.Slice(0, 0, n));
        TESSERA_RETURN_IF_ERROR(b.Cast(logits, f32));
      }
      TESSERA_RETURN_IF_ERROR(b.CopyToHost(f32, logits_out->data() + r0 * vocab));
    }
    Tensor chunk[4];
    for (int k = 0; k < 4; ++k) {
      TESSERA_ASSIGN_OR_RETURN(chunk[k], part[k].Slice(0, r0, n));
    }
    TESSERA_RETURN_IF_ERROR(CombinedPartials(logits, targets, dot, chunk));
  }
  if (keep) f.logits = buf;  // one chunk: the whole batch's logits, for the backward
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Llama::HeadBackward(Flight& f) {
  Backend& b = *backend_;
  const int64_t t = f.in.tokens.numel(), vocab = config_.vocab / tp_size(), vocab_start = tp_rank() * vocab;
  if (score_ != nullptr) return ValueHeadBackward(f, t);  // a critic: from dL/dvalue
  Tensor lse_t = f.lse_t, dloss_t = f.dloss_t, dh_t, h_t;
  if (!lse_t.defined()) {  // from the host (CrossEntropyLse)
    TESSERA_ASSIGN_OR_RETURN(lse_t, New(b, {t}));
    TESSERA_ASSIGN_OR_RETURN(dloss_t, New(b, {t}));
    TESSERA_RETURN_IF_ERROR(b.CopyFromHost(f.lse.data(), lse_t));
    TESSERA_RETURN_IF_ERROR(b.CopyFromHost(f.dloss.data(), dloss_t));
  }
  if (!f.dentropy.empty()) {  // the entropy bonus: through the softmax of the whole vocabulary (H is combined over TP)
    TESSERA_ASSIGN_OR_RETURN(dh_t, New(b, {t}));
    TESSERA_ASSIGN_OR_RETURN(h_t, New(b, {t}));
    TESSERA_RETURN_IF_ERROR(b.CopyFromHost(f.dentropy.data(), dh_t));
    TESSERA_RETURN_IF_ERROR(b.CopyFromHost(f.stats->entropy.data(), h_t));
  }
  // Chunk by chunk: the chunk's logits (the forward's, or made again), their gradient,
  // and the head's backward into the chunk's rows of dxn_full (dW adds, chunk after chunk).
  const int64_t rows = f.logits.defined() ? t : f.head_rows;
  TESSERA_ASSIGN_OR_RETURN(Tensor dxn_full, New(b, {t, config_.hidden}, act_));
  TESSERA_ASSIGN_OR_RETURN(Tensor dbuf, New(b, {rows, vocab}, act_));
  Tensor buf = f.logits;
  f.logits = Tensor();
  const bool remake = !buf.defined();
  if (remake) {
    TESSERA_ASSIGN_OR_RETURN(buf, New(b, {rows, vocab}, act_));
  }
  for (int64_t r0 = 0; r0 < t; r0 += rows) {
    const int64_t n = std::min(rows, t - r0);
    TESSERA_ASSIGN_OR_RETURN(Tensor x, f.xn_full.Slice(0, r0, n));
    TESSERA_ASSIGN_OR_RETURN(Tensor targets, f.in.targets.Slice(0, r0, n));
    TESSERA_ASSIGN_OR_RETURN(Tensor logits, buf.Slice(0, 0, n));
    TESSERA_ASSIGN_OR_RETURN(Tensor dlogits, dbuf.Slice(0, 0, n));
    TESSERA_ASSIGN_OR_RETURN(Tensor lse, lse_t.Slice(0, r0, n));
    TESSERA_ASSIGN_OR_RETURN(Tensor dloss, dloss_t.Slice(0, r0, n));
    if (remake) TESSERA_RETURN_IF_ERROR(Linear(b, x, lm_head_->weight(), logits));
    if (dh_t.defined()) {
      TESSERA_ASSIGN_OR_RETURN(Tensor dh, dh_t.Slice(0, r0, n));
      TESSERA_ASSIGN_OR_RETURN(Tensor h, h_t.Slice(0, r0, n));
      TESSERA_RETURN_IF_ERROR(b.CrossEntropyBackward(logits, targets, vocab_start, lse, dloss, dlogits, &dh, &h));
    } else {
      TESSERA_RETURN_IF_ERROR(b.CrossEntropyBackward(logits, targets, vocab_start, lse, dloss, dlogits));
    }
    TESSERA_ASSIGN_OR_RETURN(Tensor dx_rows, dxn_full.Slice(0, r0, n));
    TESSERA_RETURN_IF_ERROR(LinearBackward(b, dlogits, x, *lm_head_, dx_rows, 0.f));
  }
  buf = Tensor(), dbuf = Tensor();
  TESSERA_ASSIGN_OR_RETURN(Tensor dxn, LeaveTp(dxn_full));
  TESSERA_ASSIGN_OR_RETURN(Tensor dx, New(b, f.x_last.shape(), act_));
  TESSERA_RETURN_IF_ERROR(NormBackward(dxn, f.x_last, *final_norm_, f.rstd, dx));
  return dx;
}

// A critic's head (after the final norm): values [T] = xn · score^T, on the host in f32;
// with a ValueGrad, dL/dvalue for the backward.
absl::Status Llama::ValueHeadForward(Flight& f, int64_t t) {
  Backend& b = *backend_;
  TESSERA_ASSIGN_OR_RETURN(Tensor v, New(b, {t, 1}, act_));
  TESSERA_RETURN_IF_ERROR(Linear(b, f.xn_full, score_->weight(), v));
  Tensor v32 = v;
  if (act_ != DType::kF32) {
    TESSERA_ASSIGN_OR_RETURN(v32, New(b, {t, 1}));
    TESSERA_RETURN_IF_ERROR(b.Cast(v, v32));
  }
  f.values->resize(t);
  TESSERA_RETURN_IF_ERROR(b.CopyToHost(v32, f.values->data()));
  if (f.value_grad == nullptr) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(f.dvalues, (*f.value_grad)(*f.values));
  if (static_cast<int64_t>(f.dvalues.size()) != t)
    return absl::InvalidArgumentError(absl::StrCat("dL/dvalue: ", f.dvalues.size(), " values for ", t, " tokens"));
  return absl::OkStatus();
}

// Back through the value head and the final norm. The head is replicated over TP and
// sees every token (no SP), so each rank's gradient of the norm's output is already the
// whole one: nothing to reduce.
absl::StatusOr<Tensor> Llama::ValueHeadBackward(Flight& f, int64_t t) {
  Backend& b = *backend_;
  TESSERA_ASSIGN_OR_RETURN(Tensor dv32, New(b, {t, 1}));
  TESSERA_RETURN_IF_ERROR(b.CopyFromHost(f.dvalues.data(), dv32));
  Tensor dv = dv32;
  if (act_ != DType::kF32) {
    TESSERA_ASSIGN_OR_RETURN(dv, New(b, {t, 1}, act_));
    TESSERA_RETURN_IF_ERROR(b.Cast(dv32, dv));
  }
  TESSERA_ASSIGN_OR_RETURN(Tensor dxn, New(b, {t, config_.hidden}, act_));
  TESSERA_RETURN_IF_ERROR(LinearBackward(b, dv, f.xn_full, *score_, dxn, 0.f));
  TESSERA_ASSIGN_OR_RETURN(Tensor dx, New(b, f.x_last.shape(), act_));
  TESSERA_RETURN_IF_ERROR(NormBackward(dxn, f.x_last, *final_norm_, f.rstd, dx));
  return dx;
}

absl::Status Llama::DeviceLoss(Flight& f, const TokenBatch& batch, float grad_scale, LossSum* loss,
                               const Tensor (&part)[4]) {
  Backend& b = *backend_;
  const int64_t t = batch.size();
  if (!loss_sum_.defined()) {
    TESSERA_ASSIGN_OR_RETURN(loss_sum_, b.Empty({1}, DType::kF32));
  }
  if (!loss_pending_) TESSERA_RETURN_IF_ERROR(b.Fill(loss_sum_, 0));
  TESSERA_ASSIGN_OR_RETURN(f.lse_t, New(b, {t}));
  TESSERA_ASSIGN_OR_RETURN(f.dloss_t, New(b, {t}));
  TESSERA_RETURN_IF_ERROR(b.CrossEntropyLoss(part[0], part[1], part[3], f.in.targets, grad_scale, f.lse_t, f.dloss_t, loss_sum_));
  loss_pending_ = true;
  for (int32_t target : batch.targets) loss->tokens += target >= 0 ? 1 : 0;
  return absl::OkStatus();
}

absl::StatusOr<double> Llama::TakePendingLoss() {
  if (!loss_pending_) return 0.0;
  float sum = 0.f;
  TESSERA_RETURN_IF_ERROR(backend_->CopyToHost(loss_sum_, &sum));
  loss_pending_ = false;
  return static_cast<double>(sum);
}

// This rank's cross-entropy partials of logits [n, V/tp] (max, sum of exp, sum of exp * z
// when `dot`, target logit), combined over the TP group on the device: M = max_k max_k,
// S = sum_k sum_k exp(max_k - M) (D likewise), z_t = sum_k tgt_k (zero off-shard).
absl::Status Llama::CombinedPartials(const Tensor& logits, const Tensor& targets, bool dot, Tensor (&part)[4]) {
  Backend& b = *backend_;
  const int64_t n = logits.dim(0), vocab_start = tp_rank() * (config_.vocab / tp_size());
  TESSERA_RETURN_IF_ERROR(b.CrossEntropyPartials(logits, targets, vocab_start, part[0], part[1], part[2], part[3]));
  if (tp_ == nullptr) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(Tensor global_max, New(b, {n}));
  TESSERA_RETURN_IF_ERROR(tp_->AllReduce(part[0].data(), global_max.data(), n, DType::kF32, comm::ReduceOp::kMax));
  for (int k : {1, 2}) {
    if (k == 2 && !dot) continue;
    TESSERA_RETURN_IF_ERROR(b.CrossEntropyRescale(part[0], global_max, part[k]));
    TESSERA_RETURN_IF_ERROR(AllReduce(part[k]));
  }
  TESSERA_RETURN_IF_ERROR(AllReduce(part[3]));
  return b.Copy(global_max, part[0]);
}

// Per-token log-sum-exp over the whole vocabulary, on the host (the partials read back);
// leaves the target logits in in.target_logit and, if asked, the entropies.
absl::StatusOr<std::vector<float>> Llama::CrossEntropyLse(const Tensor (&part)[4], Inputs& in,
                                                           std::vector<float>* entropy) {
  Backend& b = *backend_;
  const int64_t t = part[0].dim(0);
  if (tp_ != nullptr) TESSERA_RETURN_IF_ERROR(tp_->Synchronize());  // under the watchdog, before the host waits
  std::vector<float> mx(t), sum(t), dot(entropy != nullptr ? t : 0), lse(t);
  in.target_logit.assign(t, 0.f);
  TESSERA_RETURN_IF_ERROR(b.CopyToHost(part[0], mx.data()));
  TESSERA_RETURN_IF_ERROR(b.CopyToHost(part[1], sum.data()));
  if (entropy != nullptr) TESSERA_RETURN_IF_ERROR(b.CopyToHost(part[2], dot.data()));
  TESSERA_RETURN_IF_ERROR(b.CopyToHost(part[3], in.target_logit.data()));
  for (int64_t i = 0; i < t; ++i) lse[i] = mx[i] + std::log(sum[i]);
  if (entropy != nullptr) {  // H = lse - sum_j p_j z_j, and sum_j p_j z_j = dot / sum
    entropy->resize(t);
    for (int64_t i = 0; i < t; ++i) (*entropy)[i] = lse[i] - dot[i] / sum[i];
  }
  return lse;
}

}  // namespace tessera::model
