// The generator's forward over a paged KV cache (generator.h): the rollout engine's
// prefill and decode steps, through the model's own layers.
#include "worker/model/generator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/model/llama_internal.h"

namespace tessera::model {
using internal::Linear;
using internal::New;
using runtime::Backend;
using runtime::Tensor;

int64_t Generator::CacheBytesPerBlock(const Llama& m, int64_t block_size) {
  return 2 * m.config_.layers * block_size * m.config_.LocalKvHeads(m.tp_size()) * m.config_.HeadDim() *
         static_cast<int64_t>(tessera::DTypeSize(m.act_));
}

absl::StatusOr<std::unique_ptr<Generator>> Generator::Create(Llama* model, int64_t blocks, int64_t block_size) {
  if (blocks < 1 || block_size < 1)
    return absl::InvalidArgumentError(absl::StrCat("kv cache: blocks (", blocks, ") and block_size (", block_size,
                                                   ") must be positive"));
  Llama& m = *model;
  if (m.stage_.pp > 1 || m.cp_ != nullptr || m.sp_)
    return absl::FailedPreconditionError("generation runs on a model without pipeline, context or sequence parallelism");
  if (m.lm_head_ == nullptr) return absl::FailedPreconditionError("generation needs an LM head; this model is a critic");
  KvCache c;
  c.blocks = blocks, c.block_size = block_size;
  const int64_t hkv = m.config_.LocalKvHeads(m.tp_size()), d = m.config_.HeadDim();
  for (int64_t l = 0; l < m.config_.layers; ++l) {
    TESSERA_ASSIGN_OR_RETURN(Tensor k, New(*m.backend_, {blocks, block_size, hkv, d}, m.act_));
    TESSERA_ASSIGN_OR_RETURN(Tensor v, New(*m.backend_, {blocks, block_size, hkv, d}, m.act_));
    c.k.push_back(std::move(k));
    c.v.push_back(std::move(v));
  }
  return std::unique_ptr<Generator>(new Generator(model, std::move(c)));
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

// What may change between the cache's creation and a forward: the model's layers (a
// checkpoint load keeps them; nothing else resizes a model).
absl::Status Generator::Check() const {
  if (cache_.k.size() != static_cast<size_t>(model_->config_.layers))
    return absl::InvalidArgumentError(absl::StrCat("kv cache: ", cache_.k.size(), " layers, the model has ",
                                                   model_->config_.layers));
  return absl::OkStatus();
}

absl::Status Generator::CopySlots(const std::vector<int32_t>& from, const std::vector<int32_t>& to) {
  const int64_t n = static_cast<int64_t>(from.size()), slots = cache_.blocks * cache_.block_size;
  if (to.size() != from.size()) return absl::InvalidArgumentError("kv cache: CopySlots needs as many targets as sources");
  if (n == 0) return absl::OkStatus();
  for (int32_t x : from)
    if (x < 0 || x >= slots) return absl::InvalidArgumentError(absl::StrCat("kv cache: slot ", x, " outside [0, ", slots, ")"));
  TESSERA_RETURN_IF_ERROR(Backend::CheckCacheSlots(cache_.k[0], to.data(), n));  // in range and distinct
  Backend& be = model_->backend();
  TESSERA_ASSIGN_OR_RETURN(Tensor src, be.Empty({n}, DType::kI32));
  TESSERA_ASSIGN_OR_RETURN(Tensor dst, be.Empty({n}, DType::kI32));
  TESSERA_RETURN_IF_ERROR(be.CopyFromHost(from.data(), src));
  TESSERA_RETURN_IF_ERROR(be.CopyFromHost(to.data(), dst));
  const int64_t hkv = cache_.k[0].dim(2), d = cache_.k[0].dim(3);
  TESSERA_ASSIGN_OR_RETURN(Tensor k, be.Empty({n, hkv * d}, cache_.k[0].dtype()));
  TESSERA_ASSIGN_OR_RETURN(Tensor v, be.Empty({n, hkv * d}, cache_.k[0].dtype()));
  TESSERA_ASSIGN_OR_RETURN(Tensor k3, k.Reshape({n, hkv, d}));
  TESSERA_ASSIGN_OR_RETURN(Tensor v3, v.Reshape({n, hkv, d}));
  TrustIndices trust(be);  // checked above, uploaded once
  for (size_t l = 0; l < cache_.k.size(); ++l) {
    TESSERA_ASSIGN_OR_RETURN(Tensor kt, cache_.k[l].Reshape({slots, hkv * d}));
    TESSERA_ASSIGN_OR_RETURN(Tensor vt, cache_.v[l].Reshape({slots, hkv * d}));
    TESSERA_RETURN_IF_ERROR(be.EmbeddingForward(src, kt, 0, k));  // a gather of rows
    TESSERA_RETURN_IF_ERROR(be.EmbeddingForward(src, vt, 0, v));
    TESSERA_RETURN_IF_ERROR(be.KvCacheWrite(k3, v3, dst, cache_.k[l], cache_.v[l]));
  }
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Generator::ForwardLocal(const TokenBatch& batch, const std::vector<int32_t>& slots,
                                               const DecodeView* decode) {
  Llama& m = *model_;
  TESSERA_RETURN_IF_ERROR(Check());
  TESSERA_RETURN_IF_ERROR(m.CheckBatch(batch));
  const int64_t t = batch.size(), n = static_cast<int64_t>(batch.cu_seqlens.size()) - 1;
  if (static_cast<int64_t>(slots.size()) != t)
    return absl::InvalidArgumentError(absl::StrCat("kv cache: ", slots.size(), " slots for ", t, " tokens"));
  if (decode != nullptr && t != n)
    return absl::InvalidArgumentError(absl::StrCat("decode: one new token per sequence, got ", t, " tokens in ", n, " sequences"));
  Backend& b = *m.backend_;
  TESSERA_ASSIGN_OR_RETURN(Llama::Inputs in, m.Upload(batch));
  TESSERA_ASSIGN_OR_RETURN(Tensor slot_t, m.host_->Empty({t}, DType::kI32));
  std::copy(slots.begin(), slots.end(), slot_t.data_as<int32_t>());
  std::vector<int64_t> last;  // each sequence's last token (prefill)
  if (decode == nullptr && t != n)
    for (int64_t s = 0; s < n; ++s) last.push_back(batch.cu_seqlens[s + 1] - 1);
  if (b.device().kind == runtime::DeviceKind::kCpu)  // the ops check the host indices themselves
    return CacheForward(in, n, last, slot_t, decode);
  // On a device: the indices checked here once and uploaded once, not per layer.
  TESSERA_RETURN_IF_ERROR(Backend::CheckCacheSlots(cache_.k[0], slots.data(), t));
  DecodeView on_device;
  if (decode != nullptr) {
    if (decode->tables.device().kind != runtime::DeviceKind::kCpu || decode->lens.device().kind != runtime::DeviceKind::kCpu ||
        decode->tables.rank() != 2 || decode->tables.dim(0) != n || decode->lens.numel() != n)
      return absl::InvalidArgumentError(absl::StrCat("decode: block tables [", n, ", max_blocks] and lengths [", n,
                                                     "] must be host i32 tensors"));
    TESSERA_RETURN_IF_ERROR(Backend::CheckPagedIndices(cache_.k[0], decode->tables.data_as<int32_t>(), n,
                                                       decode->tables.dim(1), decode->lens.data_as<int32_t>()));
    TESSERA_ASSIGN_OR_RETURN(on_device.tables, Device(b, decode->tables));
    TESSERA_ASSIGN_OR_RETURN(on_device.lens, Device(b, decode->lens));
  }
  TESSERA_ASSIGN_OR_RETURN(Tensor slots_d, Device(b, slot_t));
  TrustIndices trust(b);
  return CacheForward(in, n, last, slots_d, decode != nullptr ? &on_device : nullptr);
}

bool Generator::DecodeOnDeviceSupported(const Llama& model) {
  // The captured step bakes in its RoPE frequencies: none that change with the length.
  return !model.has_param_hooks() && !model.tensor_parallel() && !RopeDependsOnLength(model.config_);
}

absl::Status Generator::ReserveDecodeRows(int64_t rows) {
  Llama& m = *model_;
  if (!m.config_.qkv_bias || (ones_.defined() && ones_.dim(0) >= rows)) return absl::OkStatus();
  if (rows < 1) return absl::InvalidArgumentError(absl::StrCat("decode rows ", rows));
  TESSERA_ASSIGN_OR_RETURN(ones_, internal::Ones(*m.backend_, rows, m.act_));
  return m.backend_->Synchronize();
}

absl::StatusOr<Tensor> Generator::DecodeStep(const DeviceDecode& d) {
  Llama& m = *model_;
  TESSERA_RETURN_IF_ERROR(Check());
  if (!DecodeOnDeviceSupported(m))
    return absl::FailedPreconditionError("decode on device inputs: a model without parameter hooks or TP");
  const int64_t n = d.tokens.numel();
  if (m.config_.qkv_bias && (!ones_.defined() || ones_.dim(0) < n))
    return absl::FailedPreconditionError(absl::StrCat("decode on device inputs: ", n, " rows of a QKV-bias model; ReserveDecodeRows made ",
                                                      ones_.defined() ? ones_.dim(0) : 0));
  for (const Tensor* x : {&d.tokens, &d.positions, &d.slots, &d.lens})
    if (x->numel() != n || x->dtype() != DType::kI32 || !(x->device() == m.backend_->device()))
      return absl::InvalidArgumentError(absl::StrCat("decode on device inputs: tokens, positions, slots and lens must be i32 [",
                                                     n, "] on ", m.backend_->device().ToString()));
  if (d.tables.rank() != 2 || d.tables.dim(0) != n || d.tables.dtype() != DType::kI32 || !(d.tables.device() == m.backend_->device()))
    return absl::InvalidArgumentError(absl::StrCat("decode on device inputs: tables must be i32 [", n, ", max_blocks] on the device"));
  Llama::Inputs in;
  in.tokens = d.tokens, in.positions = d.positions;
  in.rope = m.rope_;  // not length-dependent (DecodeOnDeviceSupported)
  if (m.config_.qkv_bias) {
    TESSERA_ASSIGN_OR_RETURN(in.ones, ones_.Slice(0, 0, n));
  }
  TESSERA_ASSIGN_OR_RETURN(in.cu, m.host_->Empty({n + 1}, DType::kI32));
  for (int64_t i = 0; i <= n; ++i) in.cu.data_as<int32_t>()[i] = static_cast<int32_t>(i);
  const DecodeView view{d.tables, d.lens};
  TrustIndices trust(*m.backend_);
  return CacheForward(in, n, {}, d.slots, &view);
}

absl::StatusOr<Tensor> Generator::CacheForward(const Llama::Inputs& in, int64_t n, const std::vector<int64_t>& last,
                                               const Tensor& slots, const DecodeView* decode) {
  using Phase = ParamHooks::Phase;
  Llama& m = *model_;
  auto acquire = [&](int block) { return m.hooks_ ? m.hooks_->Acquire(block, Phase::kForward) : absl::OkStatus(); };
  auto release = [&](int block) { return m.hooks_ ? m.hooks_->Release(block, Phase::kForward) : absl::OkStatus(); };
  Backend& b = *m.backend_;
  const LlamaConfig& c = m.config_;
  const int64_t t = in.tokens.numel(), vocab = c.vocab / m.tp_size(), vocab_start = m.tp_rank() * vocab;
  TESSERA_ASSIGN_OR_RETURN(Tensor emb, New(b, {t, c.hidden}, m.act_));
  TESSERA_RETURN_IF_ERROR(acquire(0));
  TESSERA_RETURN_IF_ERROR(b.EmbeddingForward(in.tokens, m.embed_->weight(), vocab_start, emb));
  TESSERA_RETURN_IF_ERROR(release(0));
  TESSERA_ASSIGN_OR_RETURN(Tensor x, m.LeaveTp(emb));
  for (size_t i = 0; i < m.layers_.size(); ++i) {
    const int block = static_cast<int>(i) + 1;
    Llama::LayerActs a;
    Tensor out;
    const Llama::CacheStep kv{&cache_, static_cast<int64_t>(i), slots, decode};
    TESSERA_RETURN_IF_ERROR(acquire(block));
    TESSERA_RETURN_IF_ERROR(m.LayerForward(m.layers_[i], in, x, a, out, &kv));
    TESSERA_RETURN_IF_ERROR(release(block));
    x = out;
  }
  Tensor lastx = x;
  if (!last.empty()) {
    TESSERA_ASSIGN_OR_RETURN(lastx, New(b, {n, c.hidden}, m.act_));
    for (int64_t s = 0; s < n; ++s) {
      TESSERA_ASSIGN_OR_RETURN(Tensor src, x.Slice(0, last[s], 1));
      TESSERA_ASSIGN_OR_RETURN(Tensor dst, lastx.Slice(0, s, 1));
      TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, src, 0.f, dst));
    }
  }
  const int head_block = m.num_blocks() - 1;
  TESSERA_RETURN_IF_ERROR(acquire(head_block));
  TESSERA_ASSIGN_OR_RETURN(Tensor xn, New(b, {n, c.hidden}, m.act_));
  TESSERA_ASSIGN_OR_RETURN(Tensor rstd, New(b, {n}));
  TESSERA_RETURN_IF_ERROR(b.RmsNormForward(lastx, m.final_norm_->weight(), c.norm_eps, xn, rstd));
  TESSERA_ASSIGN_OR_RETURN(Tensor logits, New(b, {n, vocab}, m.act_));
  TESSERA_RETURN_IF_ERROR(Linear(b, xn, m.lm_head_->weight(), logits));
  TESSERA_RETURN_IF_ERROR(release(head_block));
  return logits;
}

absl::StatusOr<std::vector<float>> Generator::Forward(const TokenBatch& batch, const std::vector<int32_t>& slots,
                                                      const DecodeView* decode) {
  TESSERA_ASSIGN_OR_RETURN(Tensor local, ForwardLocal(batch, slots, decode));
  TESSERA_ASSIGN_OR_RETURN(Tensor logits, GatherVocab(local));
  Backend& b = *model_->backend_;
  TESSERA_ASSIGN_OR_RETURN(Tensor f32, New(b, logits.shape()));
  TESSERA_RETURN_IF_ERROR(b.Cast(logits, f32));
  std::vector<float> full(f32.numel());
  TESSERA_RETURN_IF_ERROR(b.CopyToHost(f32, full.data()));
  return full;
}

absl::StatusOr<Tensor> Generator::GatherVocab(const Tensor& local) {
  Llama& m = *model_;
  if (m.tp_size() == 1) return local;
  TESSERA_ASSIGN_OR_RETURN(Tensor full, New(*m.backend_, {local.dim(0), m.tp_size() * local.dim(1)}, local.dtype()));
  TESSERA_RETURN_IF_ERROR(m.GatherColumns(local, full));
  return full;
}

}  // namespace tessera::model
