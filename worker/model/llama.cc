#include "worker/model/llama.h"

#include "worker/model/context_parallel.h"
#include "worker/model/llama_internal.h"
#include "common/parallel/layout.h"

#include <algorithm>

#include <cmath>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tessera::model {
using runtime::Backend;
using runtime::Tensor;

using internal::Linear;
using internal::LinearBackward;
using internal::New;

namespace {
uint64_t NameHash(const std::string& s) {  // FNV-1a
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}
bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

TokenBatch TokenBatch::NextTokenSequence(std::vector<int32_t> tokens) {
  TokenBatch b;
  b.tokens = std::move(tokens);
  const int64_t n = b.size();
  for (int64_t i = 0; i < n; ++i) {
    b.targets.push_back(i + 1 < n ? b.tokens[i + 1] : -1);
    b.positions.push_back(static_cast<int32_t>(i));
  }
  b.cu_seqlens = {0, static_cast<int32_t>(n)};
  return b;
}

absl::Status TokenBatch::Validate(int64_t vocab) const {
  const int64_t t = size();
  if (t == 0) return absl::InvalidArgumentError("batch: no tokens");
  if (static_cast<int64_t>(targets.size()) != t || static_cast<int64_t>(positions.size()) != t)
    return absl::InvalidArgumentError(absl::StrCat("batch: tokens (", t, "), targets (", targets.size(),
                                                   ") and positions (", positions.size(), ") must have one size"));
  if (cu_seqlens.size() < 2 || cu_seqlens.front() != 0 || cu_seqlens.back() != t)
    return absl::InvalidArgumentError(absl::StrCat("batch: cu_seqlens must run from 0 to the token count ", t));
  for (size_t i = 1; i < cu_seqlens.size(); ++i)
    if (cu_seqlens[i] <= cu_seqlens[i - 1])
      return absl::InvalidArgumentError(absl::StrCat("batch: cu_seqlens must increase strictly (entry ", i, ")"));
  for (int64_t i = 0; i < t; ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab)
      return absl::InvalidArgumentError(absl::StrCat("batch: token ", i, " = ", tokens[i], " is outside [0, ", vocab, ")"));
    if (targets[i] < -1 || targets[i] >= vocab)
      return absl::InvalidArgumentError(
          absl::StrCat("batch: target ", i, " = ", targets[i], " is outside [-1, ", vocab, ")"));
    if (positions[i] < 0) return absl::InvalidArgumentError(absl::StrCat("batch: position ", i, " is negative"));
  }
  return absl::OkStatus();
}

Llama::Llama(const LlamaConfig& config, Backend* backend, comm::Communicator* tp, bool sequence_parallel,
             comm::Communicator* cp, StageSpec stage)
    : config_(config),
      backend_(backend),
      tp_(tp != nullptr && tp->size() > 1 ? tp : nullptr),
      cp_(cp != nullptr && cp->size() > 1 ? cp : nullptr),
      sp_(sequence_parallel && tp_ != nullptr),
      host_(runtime::MakeCpuBackend()),
      act_(config.dtype),
      rope_(ComputeRopeFrequencies(config, 0)),
      stage_(stage) {}
Llama::~Llama() = default;

void Llama::AppendStates(std::vector<runtime::Tensor>* out) const {
  for (const Param& p : params_)
    for (const runtime::Tensor* t : {&p.value, &p.grad, &p.compute}) out->push_back(*t);
}

absl::StatusOr<std::unique_ptr<Llama>> Llama::Create(const LlamaConfig& config, Backend* backend,
                                                     comm::Communicator* tp, bool sequence_parallel,
                                                     comm::Communicator* cp, StageSpec stage) {
  TESSERA_RETURN_IF_ERROR(config.Validate());
  TESSERA_RETURN_IF_ERROR(config.ValidateTensorParallel(tp != nullptr ? tp->size() : 1));
  if (backend == nullptr) return absl::InvalidArgumentError("model: no backend");
  if (RopeDependsOnLength(config) && cp != nullptr && cp->size() > 1)
    return absl::InvalidArgumentError("model: dynamic RoPE scaling takes the batch's longest sequence, which a context-"
                                      "parallel rank does not see; run it without context parallelism");
  if (config.value_head && (sequence_parallel || stage.pp > 1 || stage.vpp > 1))
    return absl::InvalidArgumentError("model: a critic (value head) runs without sequence or pipeline parallelism yet");
  if (stage.pp < 1 || stage.vpp < 1 || stage.rank < 0 || stage.rank >= stage.pp || stage.last_layers < 0)
    return absl::InvalidArgumentError(absl::StrCat("model: bad pipeline stage (pp ", stage.pp, ", rank ", stage.rank,
                                                   ", vpp ", stage.vpp, ", last_layers ", stage.last_layers, ")"));
  if (auto st = parallel::CheckLayerSplit(config.layers, stage.pp, stage.vpp, stage.last_layers, stage.stage_layers); !st.ok())
    return absl::InvalidArgumentError(absl::StrCat("model: pipeline stage ", stage.rank, ": ", st.message()));
  std::unique_ptr<Llama> m(new Llama(config, backend, tp, sequence_parallel, cp, stage));
  TESSERA_RETURN_IF_ERROR(m->Allocate());
  return m;
}

absl::Status Llama::Allocate() {
  // This rank's chunks and what they hold.
  chunk_layers_.assign(stage_.vpp, {});
  std::vector<bool> held(config_.layers, false);
  for (int c = 0; c < stage_.vpp; ++c)
    for (auto [l, e] = ChunkLayers(config_, stage_, c); l < e; ++l) {
      chunk_layers_[c].push_back(l);
      held[l] = true;
    }
  const bool first = FirstVirtualStage(0), last = LastVirtualStage(stage_.vpp - 1);
  const auto specs = LlamaParamSpecs(config_);
  params_.reserve(specs.size());  // Param pointers below stay valid
  for (const auto& s : specs) {
    if (!StageHolds(s.name, config_, stage_)) continue;
    std::vector<int64_t> local = s.shape;
    if (s.shard_dim >= 0) local[s.shard_dim] /= TpSplitOf(s, tp_size(), tp_rank()).parts;
    TESSERA_ASSIGN_OR_RETURN(Tensor value, New(*backend_, local));
    TESSERA_ASSIGN_OR_RETURN(Tensor grad, New(*backend_, local));
    params_.push_back({s, std::move(value), std::move(grad), runtime::Tensor()});
  }
  TESSERA_RETURN_IF_ERROR(ZeroGrads());
  embed_ = Find("model.embed_tokens.weight");
  final_norm_ = Find("model.norm.weight");
  lm_head_ = config_.value_head ? nullptr : config_.tie_embeddings ? embed_ : Find("lm_head.weight");
  score_ = config_.value_head ? Find("score.weight") : nullptr;
  layers_.resize(config_.layers);
  for (int64_t i = 0; i < config_.layers; ++i) {
    const std::string l = absl::StrCat("model.layers.", i, ".");
    LayerParams& w = layers_[i];
    w.norm1 = Find(l + "input_layernorm.weight");
    w.wq = Find(l + "self_attn.q_proj.weight");
    w.wk = Find(l + "self_attn.k_proj.weight");
    w.wv = Find(l + "self_attn.v_proj.weight");
    if (config_.qkv_bias) {
      w.bq = Find(l + "self_attn.q_proj.bias");
      w.bk = Find(l + "self_attn.k_proj.bias");
      w.bv = Find(l + "self_attn.v_proj.bias");
    }
    if (config_.qk_norm) {
      w.qn = Find(l + "self_attn.q_norm.weight");
      w.kn = Find(l + "self_attn.k_norm.weight");
    }
    w.wo = Find(l + "self_attn.o_proj.weight");
    w.norm2 = Find(l + "post_attention_layernorm.weight");
    w.wg = Find(l + "mlp.gate_proj.weight");
    w.wu = Find(l + "mlp.up_proj.weight");
    w.wd = Find(l + "mlp.down_proj.weight");
  }
  uses_.assign(num_blocks(), {});
  owns_.assign(num_blocks(), {});
  if (first) uses_[0] = {embed_};
  for (int64_t i = 0; i < config_.layers; ++i) {
    if (!held[i]) continue;
    const LayerParams& w = layers_[i];
    for (Param* p : {w.norm1, w.wq, w.wk, w.wv, w.bq, w.bk, w.bv, w.qn, w.kn, w.wo, w.norm2, w.wg, w.wu, w.wd})
      if (p != nullptr) uses_[i + 1].push_back(p);
  }
  if (last) uses_.back() = {final_norm_, score_ != nullptr ? score_ : lm_head_};
  for (Param& p : params_)
    for (int b = 0; b < num_blocks(); ++b)
      if (std::find(uses_[b].begin(), uses_[b].end(), &p) != uses_[b].end()) {
        owns_[b].push_back(&p);
        break;
      }
  return absl::OkStatus();
}

Param* Llama::Find(const std::string& name) {
  for (auto& p : params_)
    if (p.name() == name) return &p;
  return nullptr;
}

absl::Status Llama::AllReduce(Tensor& t) {
  if (tp_ == nullptr) return absl::OkStatus();
  return tp_->AllReduce(t.data(), t.data(), t.numel(), t.dtype(), comm::ReduceOp::kSum);
}

absl::Status Llama::CheckNotFrozen(const char* what) const {
  if (!frozen_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("model: ", what, " on a frozen model (forward only: Freeze dropped its "
                                                    "gradients and f32 weights)"));
}

absl::Status Llama::Freeze() {
  for (Param& p : params_) {
    p.grad = Tensor();
    p.grad_stale = false;
    if (p.compute.defined()) p.value = Tensor();
  }
  frozen_ = true;
  return absl::OkStatus();
}

absl::Status Llama::SetGlobal(Param& p, const std::vector<float>& global) {
  TESSERA_RETURN_IF_ERROR(CheckNotFrozen("setting a weight"));
  int64_t n = 1;
  for (int64_t d : p.spec.shape) n *= d;
  if (static_cast<int64_t>(global.size()) != n)
    return absl::InvalidArgumentError(
        absl::StrCat("model: ", p.name(), " has ", n, " elements, got a value of ", global.size()));
  const TpSplit split = SplitOf(p);
  const auto shard = TpShardOf(global, p.spec.shape, split.dim, split.parts, split.index);
  TESSERA_RETURN_IF_ERROR(backend_->CopyFromHost(shard.data(), p.value));
  return RefreshCompute(p);
}

absl::Status Llama::SetShard(Param& p, const float* shard) {
  TESSERA_RETURN_IF_ERROR(CheckNotFrozen("setting a weight"));
  TESSERA_RETURN_IF_ERROR(backend_->CopyFromHost(shard, p.value));
  return RefreshCompute(p);
}

absl::Status Llama::RefreshCompute(Param& p) {
  TESSERA_RETURN_IF_ERROR(CheckNotFrozen("refreshing a compute copy"));
  if (act_ == DType::kF32 || !p.value.defined()) {
    p.compute = Tensor();
    return absl::OkStatus();
  }
  if (!p.compute.defined() || p.compute.shape() != p.value.shape()) {
    TESSERA_ASSIGN_OR_RETURN(p.compute, New(*backend_, p.value.shape(), act_));
  }
  return backend_->Cast(p.value, p.compute);
}


absl::StatusOr<std::vector<float>> Llama::GatherGlobal(const Param& p, bool grad) {
  TESSERA_RETURN_IF_ERROR(CheckNotFrozen("gathering a weight or gradient"));
  const Tensor& local = grad ? p.grad : p.value;
  const int64_t n = local.numel() * SplitOf(p).parts;
  if (grad && p.grad_stale) return std::vector<float>(n, 0.f);  // nothing written this step
  TESSERA_ASSIGN_OR_RETURN(Tensor whole, New(*backend_, {n}));
  TESSERA_RETURN_IF_ERROR(GatherInto(p, local, whole));
  std::vector<float> out(n);
  TESSERA_RETURN_IF_ERROR(backend_->CopyToHost(whole, out.data()));
  return out;
}

absl::Status Llama::GatherGlobalInto(const Param& p, Tensor& out) {
  TESSERA_RETURN_IF_ERROR(CheckNotFrozen("gathering a weight"));
  return GatherInto(p, p.value, out);
}

absl::Status Llama::GatherInto(const Param& p, const Tensor& shard, Tensor& out) {
  const TpSplit split = SplitOf(p);
  const int64_t n = shard.numel(), parts = split.parts;
  if (out.numel() != n * parts || out.dtype() != DType::kF32 || !out.contiguous())
    return absl::InvalidArgumentError(absl::StrCat("model: ", p.name(), ": gather into ", out.ShapeString(), " ",
                                                   DTypeName(out.dtype()), "; expected f32 of the global size"));
  TESSERA_ASSIGN_OR_RETURN(Tensor flat, out.Reshape({out.numel()}));
  TESSERA_ASSIGN_OR_RETURN(Tensor local, shard.Reshape({n}));
  if (tp_ == nullptr || split.dim < 0 || parts == 1) return backend_->Copy(local, flat);
  if (split.replicas > 1) {  // replicated KV heads (split along dim 0): every replica's first copy
    TESSERA_ASSIGN_OR_RETURN(Tensor gathered, New(*backend_, {n * tp_size()}));
    TESSERA_RETURN_IF_ERROR(backend_->Synchronize());  // the shard is written on the compute stream
    TESSERA_RETURN_IF_ERROR(tp_->AllGather(local.data(), gathered.data(), n, DType::kF32));
    TESSERA_RETURN_IF_ERROR(tp_->Synchronize());
    for (int64_t k = 0; k < parts; ++k) {
      TESSERA_ASSIGN_OR_RETURN(Tensor from, gathered.Slice(0, k * split.replicas * n, n));
      TESSERA_ASSIGN_OR_RETURN(Tensor to, flat.Slice(0, k * n, n));
      TESSERA_RETURN_IF_ERROR(backend_->Copy(from, to));
    }
    return absl::OkStatus();
  }
  if (split.dim == 0) {  // shards are consecutive row blocks: gather in place
    TESSERA_RETURN_IF_ERROR(backend_->Synchronize());  // the shard is written on the compute stream
    TESSERA_RETURN_IF_ERROR(tp_->AllGather(local.data(), flat.data(), n, DType::kF32));
    return tp_->Synchronize();
  }
  // Column shards: gather the [rows, cols / parts] blocks, then place each block.
  const int64_t rows = p.spec.shape[0], cols = p.spec.shape[1];
  TESSERA_ASSIGN_OR_RETURN(Tensor block, shard.Reshape({rows, cols / parts}));
  TESSERA_ASSIGN_OR_RETURN(Tensor whole, flat.Reshape({rows, cols}));
  return GatherColumns(block, whole);
}

absl::Status Llama::GatherColumns(const Tensor& local, Tensor& full) {
  const int64_t rows = local.dim(0), c = local.dim(1), parts = tp_size();
  TESSERA_ASSIGN_OR_RETURN(Tensor gathered, New(*backend_, {parts * rows, c}, local.dtype()));
  TESSERA_RETURN_IF_ERROR(backend_->Synchronize());  // `local` is written on the compute stream
  TESSERA_RETURN_IF_ERROR(tp_->AllGather(local.data(), gathered.data(), rows * c, local.dtype()));
  TESSERA_RETURN_IF_ERROR(tp_->Synchronize());  // under the watchdog, before anything waits on it
  for (int64_t k = 0; k < parts; ++k) {
    TESSERA_ASSIGN_OR_RETURN(Tensor block, gathered.Slice(0, k * rows, rows));
    TESSERA_ASSIGN_OR_RETURN(Tensor columns, full.Slice(1, k * c, c));
    TESSERA_RETURN_IF_ERROR(backend_->Copy(block, columns));
  }
  return absl::OkStatus();
}

absl::Status Llama::SetGlobalFrom(Param& p, const Tensor& global) {
  TESSERA_RETURN_IF_ERROR(CheckNotFrozen("setting a weight"));
  const TpSplit split = SplitOf(p);
  const int64_t n = p.value.numel(), parts = split.parts;
  int64_t total = 1;
  for (int64_t d : p.spec.shape) total *= d;
  if (global.numel() != total || global.dtype() != DType::kF32 || !global.contiguous())
    return absl::InvalidArgumentError(absl::StrCat("model: ", p.name(), " has ", total, " elements, got ",
                                                   global.ShapeString(), " ", DTypeName(global.dtype())));
  TESSERA_ASSIGN_OR_RETURN(Tensor local, p.value.Reshape({n}));
  if (tp_ == nullptr || split.dim < 0 || parts == 1) {
    TESSERA_ASSIGN_OR_RETURN(Tensor flat, global.Reshape({total}));
    TESSERA_RETURN_IF_ERROR(backend_->Copy(flat, local));
  } else if (split.dim == 0) {
    TESSERA_ASSIGN_OR_RETURN(Tensor flat, global.Reshape({total}));
    TESSERA_ASSIGN_OR_RETURN(Tensor mine, flat.Slice(0, split.index * n, n));
    TESSERA_RETURN_IF_ERROR(backend_->Copy(mine, local));
  } else {
    const int64_t rows = p.spec.shape[0], cols = p.spec.shape[1], c = cols / parts;
    TESSERA_ASSIGN_OR_RETURN(Tensor whole, global.Reshape({rows, cols}));
    TESSERA_ASSIGN_OR_RETURN(Tensor mine, whole.Slice(1, split.index * c, c));
    TESSERA_ASSIGN_OR_RETURN(Tensor block, p.value.Reshape({rows, c}));
    TESSERA_RETURN_IF_ERROR(backend_->Copy(mine, block));
  }
  return RefreshCompute(p);
}

absl::Status Llama::InitRandom(uint64_t seed, float stddev, const std::function<bool(const Param&)>& only) {
  TESSERA_RETURN_IF_ERROR(CheckNotFrozen("initializing the weights"));
  // Each parameter's values come from its own generator (seed ^ its name's hash), so they
  // are made on threads — a few parameters at a time, each then set on the device in
  // order — and equal what one thread makes.
  std::vector<Param*> todo;
  for (auto& p : params_)
    if (!only || only(p)) todo.push_back(&p);
  const size_t wave = std::max<size_t>(1, std::min<size_t>(8, std::thread::hardware_concurrency()));
  for (size_t first = 0; first < todo.size(); first += wave) {
    const size_t last = std::min(todo.size(), first + wave);
    std::vector<std::vector<float>> values(last - first);
    auto make = [&](size_t i) {
      const Param& p = *todo[i];
      int64_t n = 1;
      for (int64_t d : p.spec.shape) n *= d;
      std::vector<float>& v = values[i - first];
      v.resize(n);
      if (EndsWith(p.name(), "norm.weight")) {
        std::fill(v.begin(), v.end(), 1.f);
      } else if (EndsWith(p.name(), ".bias")) {
        std::fill(v.begin(), v.end(), 0.f);
      } else {
        std::mt19937_64 rng(seed ^ NameHash(p.name()));
        std::normal_distribution<float> normal(0.f, stddev);
        for (auto& x : v) x = normal(rng);
      }
    };
    std::vector<std::thread> threads;
    for (size_t i = first + 1; i < last; ++i) threads.emplace_back(make, i);
    make(first);
    for (std::thread& t : threads) t.join();
    for (size_t i = first; i < last; ++i) TESSERA_RETURN_IF_ERROR(SetGlobal(*todo[i], values[i - first]));
  }
  return absl::OkStatus();
}

absl::Status Llama::ZeroGrads() {
  for (auto& p : params_)
    if (p.grad.defined()) TESSERA_RETURN_IF_ERROR(MarkGradStale(p));
  return absl::OkStatus();
}

absl::Status Llama::MarkGradStale(Param& p) {
  p.grad_stale = true;
  const bool poison = backend_->device().kind == runtime::DeviceKind::kCpu;
  return poison && p.grad.defined() ? backend_->Fill(p.grad, 0xff) : absl::OkStatus();  // 0xff bytes: NaN in f32
}

absl::Status Llama::FreshenGrad(Param& p) {
  if (!p.grad_stale) return absl::OkStatus();
  p.grad_stale = false;
  return p.grad.defined() ? backend_->Fill(p.grad, 0) : absl::OkStatus();
}

absl::Status Llama::PrepareKernels(const TokenBatch& batch) {
  std::vector<int32_t> cu = batch.cu_seqlens;  // under CP, this rank's chunks: one half's
  if (cp_ != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(cu, ContextParallelHalf(batch));
  }
  if (cu.size() < 2 || cu.back() <= 0) return absl::OkStatus();
  const int64_t len = cu[1] - cu[0], seqs = static_cast<int64_t>(cu.size()) - 1;
  for (size_t i = 1; i + 1 < cu.size(); ++i)
    if (cu[i + 1] - cu[i] != len) return absl::OkStatus();
  const int64_t hq = config_.heads / tp_size(), hkv = config_.LocalKvHeads(tp_size()), d = config_.HeadDim();
  TESSERA_RETURN_IF_ERROR(backend_->PrepareAttention(seqs, len, hq, hkv, d, /*causal=*/true, act_));
  // Ring attention also runs a chunk's queries against another chunk's keys, unmasked.
  if (cp_ != nullptr) TESSERA_RETURN_IF_ERROR(backend_->PrepareAttention(seqs, len, hq, hkv, d, /*causal=*/false, act_));
  return absl::OkStatus();
}

RopeFrequencies Llama::RopeFor(const std::vector<int32_t>& positions) const {
  if (!RopeDependsOnLength(config_)) return rope_;
  int32_t longest = 0;
  for (int32_t p : positions) longest = std::max(longest, p + 1);
  return ComputeRopeFrequencies(config_, longest);
}

absl::StatusOr<Llama::Inputs> Llama::Upload(const TokenBatch& batch) {
  Backend& b = *backend_;
  const int64_t t = batch.size();
  Inputs in;
  TESSERA_ASSIGN_OR_RETURN(in.tokens, New(b, {t}, DType::kI32));
  TESSERA_ASSIGN_OR_RETURN(in.targets, New(b, {t}, DType::kI32));
  TESSERA_ASSIGN_OR_RETURN(in.positions, New(b, {t}, DType::kI32));
  TESSERA_RETURN_IF_ERROR(b.CopyFromHost(batch.tokens.data(), in.tokens));
  TESSERA_RETURN_IF_ERROR(b.CopyFromHost(batch.targets.data(), in.targets));
  TESSERA_RETURN_IF_ERROR(b.CopyFromHost(batch.positions.data(), in.positions));
  TESSERA_ASSIGN_OR_RETURN(in.cu, host_->Empty({static_cast<int64_t>(batch.cu_seqlens.size())}, DType::kI32));
  std::copy(batch.cu_seqlens.begin(), batch.cu_seqlens.end(), in.cu.data_as<int32_t>());
  in.rope = RopeFor(batch.positions);
  if (cp_ != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(std::vector<int32_t> half, ContextParallelHalf(batch));
    TESSERA_ASSIGN_OR_RETURN(in.cu_half, host_->Empty({static_cast<int64_t>(half.size())}, DType::kI32));
    std::copy(half.begin(), half.end(), in.cu_half.data_as<int32_t>());
  }
  if (config_.qkv_bias) {
    TESSERA_ASSIGN_OR_RETURN(in.ones, internal::Ones(b, t, act_));
  }
  return in;
}

// The input of a column-parallel block: with SP the rank's token shard [T/tp, H] is
// all-gathered into [T, H]; without, every rank already holds all tokens.
absl::StatusOr<Tensor> Llama::EnterTp(const Tensor& local) {
  if (!sp_) return local;
  TESSERA_ASSIGN_OR_RETURN(Tensor full, New(*backend_, {local.dim(0) * tp_size(), local.dim(1)}, local.dtype()));
  TESSERA_RETURN_IF_ERROR(tp_->AllGather(local.data(), full.data(), local.numel(), local.dtype()));
  return full;
}

// The output of a row-parallel block (partial sums over this rank's heads or columns,
// [T, H]): summed over TP — with SP by a reduce-scatter into this rank's tokens.
absl::StatusOr<Tensor> Llama::LeaveTp(Tensor& partial) {
  if (!sp_) {
    TESSERA_RETURN_IF_ERROR(AllReduce(partial));
    return partial;
  }
  TESSERA_ASSIGN_OR_RETURN(Tensor local, New(*backend_, {partial.dim(0) / tp_size(), partial.dim(1)}, partial.dtype()));
  TESSERA_RETURN_IF_ERROR(
      tp_->ReduceScatter(partial.data(), local.data(), local.numel(), partial.dtype(), comm::ReduceOp::kSum));
  return local;
}

absl::StatusOr<LossSum> Llama::Forward(const TokenBatch& batch) { return Run(batch, false, 0.f); }
absl::StatusOr<LossSum> Llama::ForwardBackward(const TokenBatch& batch, float grad_scale) {
  return Run(batch, true, grad_scale);
}

absl::StatusOr<std::vector<float>> Llama::ForwardLogits(const TokenBatch& batch) {
  std::vector<float> logits;
  TESSERA_RETURN_IF_ERROR(Run(batch, false, 0.f, &logits).status());
  return logits;
}

absl::StatusOr<Llama::TokenStats> Llama::TokenLogProbs(const TokenBatch& batch) {
  TokenStats stats;
  TESSERA_RETURN_IF_ERROR(Run(batch, false, 0.f, nullptr, &stats).status());
  return stats;
}

absl::StatusOr<std::vector<float>> Llama::TokenValues(const TokenBatch& batch) {
  std::vector<float> values;
  TESSERA_RETURN_IF_ERROR(Run(batch, false, 0.f, nullptr, nullptr, nullptr, &values).status());
  return values;
}

absl::StatusOr<std::vector<float>> Llama::ForwardBackwardValues(const TokenBatch& batch, const ValueGrad& grad) {
  std::vector<float> values;
  TESSERA_RETURN_IF_ERROR(Run(batch, true, 0.f, nullptr, nullptr, nullptr, &values, &grad).status());
  return values;
}

absl::StatusOr<Llama::TokenStats> Llama::ForwardBackwardLogProbs(const TokenBatch& batch, const LogProbGrad& grad) {
  TokenStats stats;
  TESSERA_RETURN_IF_ERROR(Run(batch, true, 0.f, nullptr, &stats, &grad).status());
  return stats;
}


absl::Status Llama::CheckBatch(const TokenBatch& batch) const {
  TESSERA_RETURN_IF_ERROR(batch.Validate(config_.vocab));
  if (sp_ && batch.size() % tp_size() != 0)
    return absl::InvalidArgumentError(absl::StrCat("batch: ", batch.size(), " tokens do not split over the ",
                                                   tp_size(), " tensor-parallel ranks of sequence parallelism; pad it"));
  return absl::OkStatus();
}

absl::StatusOr<Tensor> Llama::ChunkForward(int chunk, const TokenBatch& batch, Flight& f, const Tensor* input,
                                           bool backward, float grad_scale, LossSum* loss,
                                           std::vector<float>* logits_out) {
  using Phase = ParamHooks::Phase;
  auto acquire = [&](int block, Phase ph) { return hooks_ ? hooks_->Acquire(block, ph) : absl::OkStatus(); };
  auto release = [&](int block, Phase ph) { return hooks_ ? hooks_->Release(block, ph) : absl::OkStatus(); };
  Backend& b = *backend_;
  const LlamaConfig& c = config_;
  const int head_block = num_blocks() - 1;
  const int64_t t = batch.size(), vocab = c.vocab / tp_size(), vocab_start = tp_rank() * vocab;
  Tensor x;
  if (FirstVirtualStage(chunk)) {
    TESSERA_ASSIGN_OR_RETURN(Tensor emb, New(b, {t, c.hidden}, act_));
    TESSERA_RETURN_IF_ERROR(acquire(0, Phase::kForward));
    TESSERA_RETURN_IF_ERROR(b.EmbeddingForward(f.in.tokens, embed_->weight(), vocab_start, emb));
    TESSERA_RETURN_IF_ERROR(release(0, Phase::kForward));
    TESSERA_ASSIGN_OR_RETURN(x, LeaveTp(emb));  // vocab-parallel: each id's row lives on one rank
  } else {
    x = *input;
  }
  const auto& layers = chunk_layers_[chunk];
  f.acts.assign(layers.size(), LayerActs());
  for (size_t i = 0; i < layers.size(); ++i) {
    const int block = static_cast<int>(layers[i]) + 1;
    Tensor out;
    TESSERA_RETURN_IF_ERROR(acquire(block, Phase::kForward));
    TESSERA_RETURN_IF_ERROR(LayerForward(layers_[layers[i]], f.in, x, f.acts[i], out));
    if (!backward) {  // a forward alone (log-probs, values, logits) keeps nothing for a backward
      f.acts[i] = LayerActs();
    } else if (recompute_) {  // keep the input only; the backward recomputes the rest
      f.acts[i] = LayerActs();
      f.acts[i].x_in = x;
    }
    TESSERA_RETURN_IF_ERROR(release(block, Phase::kForward));
    x = out;
  }
  if (!LastVirtualStage(chunk)) return x;
  // Final norm, LM head (this rank's vocabulary columns), cross-entropy. With a backward
  // the head block stays acquired: its backward comes next.
  TESSERA_RETURN_IF_ERROR(acquire(head_block, Phase::kForward));
  f.x_last = x;
  TESSERA_ASSIGN_OR_RETURN(f.xn, New(b, x.shape(), act_));
  TESSERA_ASSIGN_OR_RETURN(f.rstd, New(b, {x.dim(0)}));
  TESSERA_RETURN_IF_ERROR(b.RmsNormForward(x, final_norm_->weight(), c.norm_eps, f.xn, f.rstd));
  TESSERA_ASSIGN_OR_RETURN(f.xn_full, EnterTp(f.xn));
  TESSERA_RETURN_IF_ERROR(HeadForward(f, batch, backward, grad_scale, loss, logits_out));
  if (!backward) TESSERA_RETURN_IF_ERROR(release(head_block, Phase::kForward));
  return Tensor();
}

absl::StatusOr<Tensor> Llama::ChunkBackward(int chunk, Flight& f, const Tensor* grad_output) {
  using Phase = ParamHooks::Phase;
  auto acquire = [&](int block, Phase ph) { return hooks_ ? hooks_->Acquire(block, ph) : absl::OkStatus(); };
  auto done = [&](int block) {  // the block's backward is complete
    if (hooks_ == nullptr) return absl::OkStatus();
    TESSERA_RETURN_IF_ERROR(hooks_->GradsReady(block));
    return hooks_->Release(block, Phase::kBackward);
  };
  Backend& b = *backend_;
  const int head_block = num_blocks() - 1;
  const int64_t vocab_start = tp_rank() * (config_.vocab / tp_size());
  Tensor dx;
  if (LastVirtualStage(chunk)) {  // from the head: the loss or a critic's values, then the final norm
    TESSERA_RETURN_IF_ERROR(acquire(head_block, Phase::kBackward));
    TESSERA_ASSIGN_OR_RETURN(dx, HeadBackward(f));
    TESSERA_RETURN_IF_ERROR(done(head_block));
  } else {  // the next stage's gradient of this chunk's output (copied: the backward works in place)
    TESSERA_ASSIGN_OR_RETURN(dx, New(b, grad_output->shape(), grad_output->dtype()));
    TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, *grad_output, 0.f, dx));
  }
  const auto& layers = chunk_layers_[chunk];
  for (size_t i = layers.size(); i-- > 0;) {
    const int block = static_cast<int>(layers[i]) + 1;
    TESSERA_RETURN_IF_ERROR(acquire(block, Phase::kBackward));
    if (recompute_) {
      Tensor out;
      const Tensor x_in = f.acts[i].x_in;
      TESSERA_RETURN_IF_ERROR(LayerForward(layers_[layers[i]], f.in, x_in, f.acts[i], out));
    }
    TESSERA_RETURN_IF_ERROR(LayerBackward(layers_[layers[i]], f.in, f.acts[i], dx));
    f.acts[i] = LayerActs();  // this layer's activations are no longer needed
    TESSERA_RETURN_IF_ERROR(done(block));
  }
  if (!FirstVirtualStage(chunk)) return dx;
  TESSERA_ASSIGN_OR_RETURN(Tensor dx_full, EnterTp(dx));
  TESSERA_RETURN_IF_ERROR(acquire(0, Phase::kBackward));
  bool taken = false;
  if (hooks_ != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(taken, hooks_->TakeEmbeddingRows(f.in.tokens, dx_full, vocab_start));
  }
  if (!taken) {
    TESSERA_RETURN_IF_ERROR(FreshenGrad(*embed_));
    TESSERA_RETURN_IF_ERROR(b.EmbeddingBackward(f.in.tokens, dx_full, vocab_start, embed_->grad));  // adds
  }
  TESSERA_RETURN_IF_ERROR(done(0));
  return Tensor();
}

absl::StatusOr<LossSum> Llama::Run(const TokenBatch& batch, bool backward, float grad_scale, std::vector<float>* logits_out,
                                   TokenStats* stats, const LogProbGrad* logprob_grad, std::vector<float>* values,
                                   const ValueGrad* value_grad) {
  if (stage_.pp > 1 || stage_.vpp > 1)
    return absl::FailedPreconditionError("model: a pipeline stage runs micro-batches through PipelineForward/Backward");
  if ((score_ != nullptr) != (values != nullptr))
    return absl::FailedPreconditionError(score_ != nullptr
                                             ? "model: a critic (value head) gives values: TokenValues / ForwardBackwardValues"
                                             : "model: values need a critic (LlamaConfig::value_head)");
  TESSERA_RETURN_IF_ERROR(CheckBatch(batch));
  if (backward) TESSERA_RETURN_IF_ERROR(CheckNotFrozen("a backward pass"));
  Flight f;
  f.stats = stats;
  f.logprob_grad = logprob_grad;
  f.values = values, f.value_grad = value_grad;
  TESSERA_ASSIGN_OR_RETURN(f.in, Upload(batch));
  LossSum loss;
  TESSERA_RETURN_IF_ERROR(ChunkForward(0, batch, f, nullptr, backward, grad_scale, &loss, logits_out).status());
  if (backward) TESSERA_RETURN_IF_ERROR(ChunkBackward(0, f, nullptr).status());
  if (!defer_loss_) {
    TESSERA_ASSIGN_OR_RETURN(double pending, TakePendingLoss());
    loss.sum += pending;
  }
  return loss;
}

absl::StatusOr<Tensor> Llama::PipelineForward(int chunk, int64_t micro_batch, const TokenBatch& batch,
                                              const Tensor* input, float grad_scale, LossSum* loss) {
  if (chunk < 0 || chunk >= stage_.vpp) return absl::OutOfRangeError(absl::StrCat("model: no chunk ", chunk));
  TESSERA_RETURN_IF_ERROR(CheckNotFrozen("a pipeline stage's forward and backward"));
  TESSERA_RETURN_IF_ERROR(CheckBatch(batch));
  if (FirstVirtualStage(chunk) != (input == nullptr))
    return absl::InvalidArgumentError("model: the first virtual stage takes no input, every other one does");
  if (input != nullptr && (input->rank() != 2 || input->dim(0) != StageTokens(batch) ||
                           input->dim(1) != config_.hidden || input->dtype() != act_))
    return absl::InvalidArgumentError(absl::StrCat("model: stage input ", tessera::DTypeName(input->dtype()), " ",
                                                   input->ShapeString(), ", expected ", tessera::DTypeName(act_), " [",
                                                   StageTokens(batch), ", ", config_.hidden, "]"));
  auto& slot = flights_[{chunk, micro_batch}];
  if (slot != nullptr)
    return absl::FailedPreconditionError(absl::StrCat("model: micro-batch ", micro_batch, " is already in chunk ", chunk));
  slot = std::make_unique<Flight>();
  TESSERA_ASSIGN_OR_RETURN(slot->in, Upload(batch));
  LossSum local;
  auto out = ChunkForward(chunk, batch, *slot, input, true, grad_scale, &local, nullptr);
  if (!out.ok()) flights_.erase({chunk, micro_batch});
  if (out.ok() && !defer_loss_) {
    TESSERA_ASSIGN_OR_RETURN(double pending, TakePendingLoss());
    local.sum += pending;
  }
  if (loss != nullptr) loss->sum += local.sum, loss->tokens += local.tokens;
  return out;
}

absl::StatusOr<Tensor> Llama::PipelineBackward(int chunk, int64_t micro_batch, const Tensor* grad_output) {
  auto it = flights_.find({chunk, micro_batch});
  if (it == flights_.end())
    return absl::FailedPreconditionError(absl::StrCat("model: micro-batch ", micro_batch, " has no forward in chunk ", chunk));
  if (LastVirtualStage(chunk) != (grad_output == nullptr))
    return absl::InvalidArgumentError("model: the last virtual stage takes no output gradient, every other one does");
  std::unique_ptr<Flight> f = std::move(it->second);
  flights_.erase(it);
  return ChunkBackward(chunk, *f, grad_output);
}

}  // namespace tessera::model
