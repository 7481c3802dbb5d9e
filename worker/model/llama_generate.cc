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

namespace {
// Device index tensors are trusted inside (their host copies were checked).
class TrustIndices {
 public:
  explicit TrustIndices(Backend& b) : b_(b) { b_.set_trust_device_indices(true); }
  ~TrustIndices() { b_.set_trust_device_indices(false); }

 private:
  Backend& b_;
};

absl::StatusOr<Tensor> Device(Backend& b, const Tensor& host) {
  TESSERA_ASSIGN_OR_RETURN(Tensor d, b.Empty(host.shape(), host.dtype()));
  TESSERA_RETURN_IF_ERROR(b.CopyFromHost(host.data(), d));
  return d;
}
}  // namespace

absl::Status Llama::CheckGeneration(const KvCache& cache) const {
  if (stage_.pp > 1 || cp_ != nullptr || sp_)
    return absl::FailedPreconditionError("generation runs on a model without pipeline, context or sequence parallelism");
  if (lm_head_ == nullptr) return absl::FailedPreconditionError("generation needs an LM head; this model is a critic");
  if (cache.k.size() != static_cast<size_t>(config_.layers))
    return absl::InvalidArgumentError(absl::StrCat("kv cache: ", cache.k.size(), " layers, the model has ", config_.layers));
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Llama::ForwardWithCacheLocal(const TokenBatch& batch, const std::vector<int32_t>& slots,
                                                     KvCache& cache, const DecodeView* decode) {
  TESSERA_RETURN_IF_ERROR(CheckGeneration(cache));
  TESSERA_RETURN_IF_ERROR(CheckBatch(batch));
  const int64_t t = batch.size(), n = static_cast<int64_t>(batch.cu_seqlens.size()) - 1;
  if (static_cast<int64_t>(slots.size()) != t)
    return absl::InvalidArgumentError(absl::StrCat("kv cache: ", slots.size(), " slots for ", t, " tokens"));
  if (decode != nullptr && t != n)
    return absl::InvalidArgumentError(absl::StrCat("decode: one new token per sequence, got ", t, " tokens in ", n, " sequences"));
  Backend& b = *backend_;
  TESSERA_ASSIGN_OR_RETURN(Inputs in, Upload(batch));
  TESSERA_ASSIGN_OR_RETURN(Tensor slot_t, host_->Empty({t}, DType::kI32));
  std::copy(slots.begin(), slots.end(), slot_t.data_as<int32_t>());
  std::vector<int64_t> last;  // each sequence's last token (prefill)
  if (decode == nullptr && t != n)
    for (int64_t s = 0; s < n; ++s) last.push_back(batch.cu_seqlens[s + 1] - 1);
  if (b.device().kind == runtime::DeviceKind::kCpu)  // the ops check the host indices themselves
    return CacheForward(in, n, last, cache, slot_t, decode);
  // On a device: the indices checked here once and uploaded once, not per layer.
  TESSERA_RETURN_IF_ERROR(Backend::CheckCacheSlots(cache.k[0], slots.data(), t));
  DecodeView on_device;
  if (decode != nullptr) {
    if (decode->tables.device().kind != runtime::DeviceKind::kCpu || decode->lens.device().kind != runtime::DeviceKind::kCpu ||
        decode->tables.rank() != 2 || decode->tables.dim(0) != n || decode->lens.numel() != n)
      return absl::InvalidArgumentError(absl::StrCat("decode: block tables [", n, ", max_blocks] and lengths [", n,
                                                     "] must be host i32 tensors"));
    TESSERA_RETURN_IF_ERROR(Backend::CheckPagedIndices(cache.k[0], decode->tables.data_as<int32_t>(), n,
                                                       decode->tables.dim(1), decode->lens.data_as<int32_t>()));
    TESSERA_ASSIGN_OR_RETURN(on_device.tables, Device(b, decode->tables));
    TESSERA_ASSIGN_OR_RETURN(on_device.lens, Device(b, decode->lens));
  }
  TESSERA_ASSIGN_OR_RETURN(Tensor slots_d, Device(b, slot_t));
  TrustIndices trust(b);
  return CacheForward(in, n, last, cache, slots_d, decode != nullptr ? &on_device : nullptr);
}

absl::StatusOr<Tensor> Llama::DecodeStepOnDevice(const DeviceDecode& d, KvCache& cache) {
  TESSERA_RETURN_IF_ERROR(CheckGeneration(cache));
  if (hooks_ != nullptr || config_.qkv_bias || tp_ != nullptr)
    return absl::FailedPreconditionError("decode on device inputs: a model without parameter hooks, QKV bias or TP");
  const int64_t n = d.tokens.numel();
  for (const Tensor* x : {&d.tokens, &d.positions, &d.slots, &d.lens})
    if (x->numel() != n || x->dtype() != DType::kI32 || !(x->device() == backend_->device()))
      return absl::InvalidArgumentError(absl::StrCat("decode on device inputs: tokens, positions, slots and lens must be i32 [",
                                                     n, "] on ", backend_->device().ToString()));
  if (d.tables.rank() != 2 || d.tables.dim(0) != n || d.tables.dtype() != DType::kI32 || !(d.tables.device() == backend_->device()))
    return absl::InvalidArgumentError(absl::StrCat("decode on device inputs: tables must be i32 [", n, ", max_blocks] on the device"));
  Inputs in;
  in.tokens = d.tokens, in.positions = d.positions;
  TESSERA_ASSIGN_OR_RETURN(in.cu, host_->Empty({n + 1}, DType::kI32));
  for (int64_t i = 0; i <= n; ++i) in.cu.data_as<int32_t>()[i] = static_cast<int32_t>(i);
  const DecodeView view{d.tables, d.lens};
  TrustIndices trust(*backend_);
  return CacheForward(in, n, {}, cache, d.slots, &view);
}

// The shared body: embedding (vocab-parallel), the layers over the cache, then the last
// token of each sequence (`last`: its index; empty: every token is one sequence's last)
// through the final norm and the LM head.
absl::StatusOr<Tensor> Llama::CacheForward(const Inputs& in, int64_t n, const std::vector<int64_t>& last, KvCache& cache,
                                           const Tensor& slots, const DecodeView* decode) {
  using Phase = ParamHooks::Phase;
  auto acquire = [&](int block) { return hooks_ ? hooks_->Acquire(block, Phase::kForward) : absl::OkStatus(); };
  auto release = [&](int block) { return hooks_ ? hooks_->Release(block, Phase::kForward) : absl::OkStatus(); };
  Backend& b = *backend_;
  const LlamaConfig& c = config_;
  const int64_t t = in.tokens.numel(), vocab = c.vocab / tp_size(), vocab_start = tp_rank() * vocab;
  TESSERA_ASSIGN_OR_RETURN(Tensor emb, New(b, {t, c.hidden}, act_));
  TESSERA_RETURN_IF_ERROR(acquire(0));
  TESSERA_RETURN_IF_ERROR(b.EmbeddingForward(in.tokens, embed_->weight(), vocab_start, emb));
  TESSERA_RETURN_IF_ERROR(release(0));
  TESSERA_ASSIGN_OR_RETURN(Tensor x, LeaveTp(emb));
  for (size_t i = 0; i < layers_.size(); ++i) {
    const int block = static_cast<int>(i) + 1;
    LayerActs a;
    Tensor out;
    const CacheStep kv{&cache, static_cast<int64_t>(i), slots, decode};
    TESSERA_RETURN_IF_ERROR(acquire(block));
    TESSERA_RETURN_IF_ERROR(LayerForward(layers_[i], in, x, a, out, &kv));
    TESSERA_RETURN_IF_ERROR(release(block));
    x = out;
  }
  Tensor lastx = x;
  if (!last.empty()) {
    TESSERA_ASSIGN_OR_RETURN(lastx, New(b, {n, c.hidden}, act_));
    for (int64_t s = 0; s < n; ++s) {
      TESSERA_ASSIGN_OR_RETURN(Tensor src, x.Slice(0, last[s], 1));
      TESSERA_ASSIGN_OR_RETURN(Tensor dst, lastx.Slice(0, s, 1));
      TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, src, 0.f, dst));
    }
  }
  const int head_block = num_blocks() - 1;
  TESSERA_RETURN_IF_ERROR(acquire(head_block));
  TESSERA_ASSIGN_OR_RETURN(Tensor xn, New(b, {n, c.hidden}, act_));
  TESSERA_ASSIGN_OR_RETURN(Tensor rstd, New(b, {n}));
  TESSERA_RETURN_IF_ERROR(b.RmsNormForward(lastx, final_norm_->weight(), c.norm_eps, xn, rstd));
  TESSERA_ASSIGN_OR_RETURN(Tensor logits, New(b, {n, vocab}, act_));
  TESSERA_RETURN_IF_ERROR(Linear(b, xn, lm_head_->weight(), logits));
  TESSERA_RETURN_IF_ERROR(release(head_block));
  return logits;
}

absl::StatusOr<std::vector<float>> Llama::ForwardWithCache(const TokenBatch& batch, const std::vector<int32_t>& slots,
                                                           KvCache& cache, const DecodeView* decode) {
  TESSERA_ASSIGN_OR_RETURN(Tensor local, ForwardWithCacheLocal(batch, slots, cache, decode));
  TESSERA_ASSIGN_OR_RETURN(Tensor logits, GatherVocab(local));
  Backend& b = *backend_;
  TESSERA_ASSIGN_OR_RETURN(Tensor f32, New(b, logits.shape()));
  TESSERA_RETURN_IF_ERROR(b.Cast(logits, f32));
  std::vector<float> full(f32.numel());
  TESSERA_RETURN_IF_ERROR(b.CopyToHost(f32, full.data()));
  return full;
}

absl::StatusOr<Tensor> Llama::GatherVocab(const Tensor& local) {
  if (tp_ == nullptr || tp_size() == 1) return local;
  TESSERA_ASSIGN_OR_RETURN(Tensor full, New(*backend_, {local.dim(0), tp_size() * local.dim(1)}, local.dtype()));
  TESSERA_RETURN_IF_ERROR(GatherColumns(local, full));
  return full;
}

}  // namespace tessera::model
