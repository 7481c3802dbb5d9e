// Llama's forward over a paged KV cache: the rollout engine's prefill and decode steps
// (see Llama::ForwardWithCache in llama.h).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/model/llama.h"
#include "worker/model/llama_internal.h"

namespace tessera::model {
using internal::Linear;
using internal::New;
using runtime::Backend;
using runtime::DType;
using runtime::Tensor;

absl::StatusOr<Llama::KvCache> Llama::NewKvCache(int64_t blocks, int64_t block_size) {
  if (blocks < 1 || block_size < 1)
    return absl::InvalidArgumentError(absl::StrCat("kv cache: blocks (", blocks, ") and block_size (", block_size,
                                                   ") must be positive"));
  if (stage_.pp > 1 || cp_ != nullptr || sp_)
    return absl::FailedPreconditionError("kv cache: generation runs on a model without pipeline, context or sequence "
                                         "parallelism");
  KvCache c;
  c.blocks = blocks, c.block_size = block_size;
  const int64_t hkv = config_.kv_heads / tp_size(), d = config_.HeadDim();
  for (int64_t l = 0; l < config_.layers; ++l) {
    TESSERA_ASSIGN_OR_RETURN(Tensor k, New(*backend_, {blocks, block_size, hkv, d}, act_));
    TESSERA_ASSIGN_OR_RETURN(Tensor v, New(*backend_, {blocks, block_size, hkv, d}, act_));
    c.k.push_back(std::move(k));
    c.v.push_back(std::move(v));
  }
  return c;
}

absl::StatusOr<Tensor> Llama::ForwardWithCacheLocal(const TokenBatch& batch, const std::vector<int32_t>& slots,
                                                     KvCache& cache, const DecodeView* decode) {
  using Phase = ParamHooks::Phase;
  if (stage_.pp > 1 || cp_ != nullptr || sp_)
    return absl::FailedPreconditionError("generation runs on a model without pipeline, context or sequence parallelism");
  if (cache.k.size() != static_cast<size_t>(config_.layers))
    return absl::InvalidArgumentError(absl::StrCat("kv cache: ", cache.k.size(), " layers, the model has ", config_.layers));
  TESSERA_RETURN_IF_ERROR(CheckBatch(batch));
  const int64_t t = batch.size(), n = static_cast<int64_t>(batch.cu_seqlens.size()) - 1;
  if (static_cast<int64_t>(slots.size()) != t)
    return absl::InvalidArgumentError(absl::StrCat("kv cache: ", slots.size(), " slots for ", t, " tokens"));
  if (decode != nullptr && t != n)
    return absl::InvalidArgumentError(absl::StrCat("decode: one new token per sequence, got ", t, " tokens in ", n, " sequences"));
  auto acquire = [&](int block) { return hooks_ ? hooks_->Acquire(block, Phase::kForward) : absl::OkStatus(); };
  auto release = [&](int block) { return hooks_ ? hooks_->Release(block, Phase::kForward) : absl::OkStatus(); };
  Backend& b = *backend_;
  const LlamaConfig& c = config_;
  const int64_t vocab = c.vocab / tp_size(), vocab_start = tp_rank() * vocab;
  TESSERA_ASSIGN_OR_RETURN(Inputs in, Upload(batch));
  TESSERA_ASSIGN_OR_RETURN(Tensor slot_t, host_->Empty({t}, DType::kI32));
  std::copy(slots.begin(), slots.end(), slot_t.data_as<int32_t>());
  // Embedding (vocab-parallel), the layers over the cache, then the last token of each
  // sequence through the final norm and the LM head.
  TESSERA_ASSIGN_OR_RETURN(Tensor emb, New(b, {t, c.hidden}, act_));
  TESSERA_RETURN_IF_ERROR(acquire(0));
  TESSERA_RETURN_IF_ERROR(b.EmbeddingForward(in.tokens, embed_->weight(), vocab_start, emb));
  TESSERA_RETURN_IF_ERROR(release(0));
  TESSERA_ASSIGN_OR_RETURN(Tensor x, LeaveTp(emb));
  for (size_t i = 0; i < layers_.size(); ++i) {
    const int block = static_cast<int>(i) + 1;
    LayerActs a;
    Tensor out;
    const CacheStep kv{&cache, static_cast<int64_t>(i), slot_t, decode};
    TESSERA_RETURN_IF_ERROR(acquire(block));
    TESSERA_RETURN_IF_ERROR(LayerForward(layers_[i], in, x, a, out, &kv));
    TESSERA_RETURN_IF_ERROR(release(block));
    x = out;
  }
  Tensor last = x;
  if (t != n) {  // prefill: each sequence's last token
    TESSERA_ASSIGN_OR_RETURN(last, New(b, {n, c.hidden}, act_));
    for (int64_t s = 0; s < n; ++s) {
      TESSERA_ASSIGN_OR_RETURN(Tensor src, x.Slice(0, batch.cu_seqlens[s + 1] - 1, 1));
      TESSERA_ASSIGN_OR_RETURN(Tensor dst, last.Slice(0, s, 1));
      TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, src, 0.f, dst));
    }
  }
  const int head_block = num_blocks() - 1;
  TESSERA_RETURN_IF_ERROR(acquire(head_block));
  TESSERA_ASSIGN_OR_RETURN(Tensor xn, New(b, {n, c.hidden}, act_));
  TESSERA_ASSIGN_OR_RETURN(Tensor rstd, New(b, {n}));
  TESSERA_RETURN_IF_ERROR(b.RmsNormForward(last, final_norm_->weight(), c.norm_eps, xn, rstd));
  TESSERA_ASSIGN_OR_RETURN(Tensor logits, New(b, {n, vocab}, act_));
  TESSERA_RETURN_IF_ERROR(Linear(b, xn, lm_head_->weight(), logits));
  TESSERA_RETURN_IF_ERROR(release(head_block));
  return logits;
}

absl::StatusOr<std::vector<float>> Llama::ForwardWithCache(const TokenBatch& batch, const std::vector<int32_t>& slots,
                                                           KvCache& cache, const DecodeView* decode) {
  TESSERA_ASSIGN_OR_RETURN(Tensor logits, ForwardWithCacheLocal(batch, slots, cache, decode));
  Backend& b = *backend_;
  const LlamaConfig& c = config_;
  const int64_t n = logits.shape()[0], vocab = logits.shape()[1];
  TESSERA_ASSIGN_OR_RETURN(Tensor local, New(b, {n, vocab}));
  TESSERA_RETURN_IF_ERROR(b.Cast(logits, local));
  std::vector<float> full(n * c.vocab);
  if (tp_ == nullptr) {
    TESSERA_RETURN_IF_ERROR(b.CopyToHost(local, full.data()));
    return full;
  }
  // TP: the shards [tp][n][vocab / tp] gathered, then each row's shards side by side.
  TESSERA_ASSIGN_OR_RETURN(Tensor gathered, New(b, {tp_size() * n * vocab}));
  TESSERA_RETURN_IF_ERROR(tp_->AllGather(local.data(), gathered.data(), n * vocab, DType::kF32));
  TESSERA_RETURN_IF_ERROR(tp_->Synchronize());  // under the watchdog, before the host waits
  std::vector<float> shards(tp_size() * n * vocab);
  TESSERA_RETURN_IF_ERROR(b.CopyToHost(gathered, shards.data()));
  for (int r = 0; r < tp_size(); ++r)
    for (int64_t s = 0; s < n; ++s)
      std::copy_n(shards.begin() + (r * n + s) * vocab, vocab, full.begin() + s * c.vocab + r * vocab);
  return full;
}

}  // namespace tessera::model
