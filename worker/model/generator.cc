// The generator's forward over a paged KV cache (generator.h): the rollout engine's
// prefill and decode steps, through the model's own layers.
#include "worker/model/generator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/model/llama_internal.h"

namespace tessera::model {
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

absl::StatusOr<Tensor> Generator::Step(const StepRows& r) {
  Llama& m = *model_;
  TESSERA_RETURN_IF_ERROR(Check());
  Backend& b = *m.backend_;
  const int64_t t = r.tokens.numel();
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError(absl::StrCat("generation step: ", what)); };
  if (t < 1 || r.tokens.dtype() != DType::kI32 || !(r.tokens.device() == b.device()))
    return bad(absl::StrCat("tokens must be i32 [T >= 1] on ", b.device().ToString()));
  if (static_cast<int64_t>(r.positions.size()) != t || static_cast<int64_t>(r.slots.size()) != t)
    return bad(absl::StrCat(r.positions.size(), " positions and ", r.slots.size(), " slots for ", t, " tokens"));
  const int64_t fresh = r.cu_seqlens.empty() ? 0 : r.cu_seqlens.back(), paged = t - fresh;
  if (!r.cu_seqlens.empty()) {
    if (r.cu_seqlens.size() < 2 || r.cu_seqlens[0] != 0 || fresh > t)
      return bad(absl::StrCat("cu_seqlens must run from 0 to at most ", t));
    for (size_t i = 1; i < r.cu_seqlens.size(); ++i)
      if (r.cu_seqlens[i] <= r.cu_seqlens[i - 1]) return bad("cu_seqlens must increase");
  }
  if (static_cast<int64_t>(r.lens.size()) != paged || (paged > 0 && r.max_blocks < 1) ||
      static_cast<int64_t>(r.tables.size()) != paged * r.max_blocks)
    return bad(absl::StrCat(paged, " rows after the fresh ones need ", paged, " lengths and [", paged,
                            ", max_blocks] tables; got ", r.lens.size(), " and ", r.tables.size()));
  for (int64_t row : r.logits_of)
    if (row < 0 || row >= t) return bad(absl::StrCat("logits of row ", row, " of ", t));
  for (int32_t p : r.positions)
    if (p < 0) return bad(absl::StrCat("position ", p));
  TESSERA_RETURN_IF_ERROR(Backend::CheckCacheSlots(cache_.k[0], r.slots.data(), t));
  if (paged > 0) TESSERA_RETURN_IF_ERROR(Backend::CheckPagedIndices(cache_.k[0], r.tables.data(), paged, r.max_blocks, r.lens.data()));
  if (r.decode_only) TESSERA_RETURN_IF_ERROR(CheckDecodeOnly(r, cache_.block_size));
  const bool on_device = b.device().kind != runtime::DeviceKind::kCpu;
  // Host vectors as host tensors, uploaded once when the model is on a device.
  auto tensor = [&](const std::vector<int32_t>& v, std::vector<int64_t> shape, bool upload) -> absl::StatusOr<Tensor> {
    TESSERA_ASSIGN_OR_RETURN(Tensor h, m.host_->Empty(std::move(shape), DType::kI32));
    std::copy(v.begin(), v.end(), h.data_as<int32_t>());
    return upload && on_device ? Device(b, h) : absl::StatusOr<Tensor>(h);
  };
  Llama::Inputs in;
  in.tokens = r.tokens;
  TESSERA_ASSIGN_OR_RETURN(in.positions, tensor(r.positions, {t}, true));
  const std::vector<int32_t> no_fresh = {0};
  const std::vector<int32_t>& cu = r.cu_seqlens.empty() ? no_fresh : r.cu_seqlens;
  TESSERA_ASSIGN_OR_RETURN(in.cu, tensor(cu, {static_cast<int64_t>(cu.size())}, false));
  in.rope = m.RopeFor(r.positions);
  if (m.config_.qkv_bias) {
    TESSERA_ASSIGN_OR_RETURN(in.ones, internal::Ones(b, t, m.act_));
  }
  TESSERA_ASSIGN_OR_RETURN(Tensor slots, tensor(r.slots, {t}, true));
  DecodeView view;
  if (paged > 0) {
    TESSERA_ASSIGN_OR_RETURN(view.tables, tensor(r.tables, {paged, r.max_blocks}, true));
    TESSERA_ASSIGN_OR_RETURN(view.lens, tensor(r.lens, {paged}, true));
  }
  std::vector<int64_t> last = r.logits_of;
  bool every_row = static_cast<int64_t>(last.size()) == t;  // (no rows: no logits, the head skipped)
  for (int64_t i = 0; every_row && i < t; ++i) every_row = last[i] == i;
  if (every_row) last.clear();
  TrustIndices trust(b);  // checked above
  return CacheForward(in, static_cast<int64_t>(r.logits_of.size()), last, slots, paged > 0 ? &view : nullptr, fresh,
                      r.decode_only);
}

absl::Status Generator::CheckDecodeOnly(const StepRows& r, int64_t bs) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError(absl::StrCat("decode-only step: ", what)); };
  if (!r.cu_seqlens.empty()) return bad("has fresh rows");
  const int64_t t = static_cast<int64_t>(r.slots.size());
  std::vector<std::pair<int32_t, int64_t>> fresh_blocks;  // each row's new slot's block, and the row
  for (int64_t i = 0; i < t; ++i) {
    const int64_t last = r.lens[i] - 1, slot = int64_t(r.tables[i * r.max_blocks + last / bs]) * bs + last % bs;
    if (r.slots[i] != slot)
      return bad(absl::StrCat("row ", i, "'s slot ", r.slots[i], " is not the last of its context (slot ", slot, ")"));
    fresh_blocks.push_back({static_cast<int32_t>(r.slots[i] / bs), i});
  }
  std::sort(fresh_blocks.begin(), fresh_blocks.end());
  for (int64_t i = 0; i < t; ++i)
    for (int64_t j = 0; j <= (r.lens[i] - 1) / bs; ++j) {
      const int32_t blk = r.tables[i * r.max_blocks + j];
      auto it = std::lower_bound(fresh_blocks.begin(), fresh_blocks.end(), std::pair<int32_t, int64_t>{blk, 0});
      for (; it != fresh_blocks.end() && it->first == blk; ++it)
        if (it->second != i) return bad(absl::StrCat("row ", i, "'s context holds block ", blk, ", where row ", it->second, " writes"));
    }
  return absl::OkStatus();
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
  return CacheForward(in, n, {}, d.slots, &view, 0, /*decode_only=*/true);
}

absl::StatusOr<Tensor> Generator::CacheForward(const Llama::Inputs& in, int64_t n, const std::vector<int64_t>& last,
                                               const Tensor& slots, const DecodeView* decode, int64_t fresh,
                                               bool decode_only) {
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
    Tensor out;
    const Llama::CacheStep kv{&cache_, static_cast<int64_t>(i), slots, decode, fresh, decode_only};
    TESSERA_RETURN_IF_ERROR(acquire(block));
    TESSERA_RETURN_IF_ERROR(m.CacheLayerForward(m.layers_[i], in, x, out, kv));
    TESSERA_RETURN_IF_ERROR(release(block));
    x = out;
  }
  Tensor lastx = x;
  if (!last.empty()) {  // each sequence's last token: one gather of rows
    TESSERA_ASSIGN_OR_RETURN(Tensor rows, m.host_->Empty({n}, DType::kI32));
    std::transform(last.begin(), last.end(), rows.data_as<int32_t>(), [](int64_t r) { return static_cast<int32_t>(r); });
    if (b.device().kind != runtime::DeviceKind::kCpu) {
      TESSERA_ASSIGN_OR_RETURN(rows, Device(b, rows));
    }
    TESSERA_ASSIGN_OR_RETURN(lastx, New(b, {n, c.hidden}, m.act_));
    TESSERA_RETURN_IF_ERROR(b.EmbeddingForward(rows, x, 0, lastx));
  }
  if (n == 0) return Tensor();  // prompt chunks that sample nothing
  const int head_block = m.num_blocks() - 1;
  TESSERA_RETURN_IF_ERROR(acquire(head_block));
  TESSERA_ASSIGN_OR_RETURN(Tensor logits, New(b, {n, vocab}, m.act_));
  const Llama::NormedPart head{m.lm_head_, nullptr, &logits};
  TESSERA_RETURN_IF_ERROR(m.NormedLinears(lastx, *m.final_norm_, {&head, 1}, false, in));
  TESSERA_RETURN_IF_ERROR(release(head_block));
  return logits;
}

absl::StatusOr<Tensor> Generator::GatherVocab(const Tensor& local) {
  Llama& m = *model_;
  if (m.tp_size() == 1) return local;
  TESSERA_ASSIGN_OR_RETURN(Tensor full, New(*m.backend_, {local.dim(0), m.tp_size() * local.dim(1)}, local.dtype()));
  TESSERA_RETURN_IF_ERROR(m.GatherColumns(local, full));
  return full;
}

}  // namespace tessera::model
