#include "worker/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tessera::engine {
using runtime::Tensor;

namespace {
// `issue` enqueues collectives on `c`, as one NCCL group when `group` (more than one
// collective: one launch for a block's collectives instead of one each, the small norm
// vectors' latency folded into the large ones): the group is ended whatever `issue`
// returned, and the first error is returned.
absl::Status Grouped(comm::Communicator& c, bool group, const std::function<absl::Status()>& issue) {
  if (group) c.GroupStart();
  absl::Status st = issue();
  if (group) {
    absl::Status end = c.GroupEnd();
    if (st.ok()) st = end;
  }
  return st;
}
}  // namespace

float LearningRate(const OptimizerOptions& o, int64_t step) {
  if (o.warmup_steps > 0 && step <= o.warmup_steps) return o.lr * static_cast<float>(step) / o.warmup_steps;
  const int64_t decay = std::max<int64_t>(1, o.total_steps - o.warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup_steps) / decay);
  return static_cast<float>(o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(M_PI * progress)));
}

// Optimizer state of one parameter. ZeRO: this DP rank owns elements
// [rank * shard, rank * shard + shard) of the flattened (local, TP-sharded) parameter,
// padded so that every rank's shard has the same size (the padding is zero). Every
// buffer named [shard * dp] is padded so, and a rank's chunk of it is where its
// collectives run in place (reduce-scatter into the chunk, all-gather from it).
struct Trainer::State {
  model::Param* param = nullptr;
  std::vector<int64_t> shape;  // the parameter's local (TP-sharded) shape
  int64_t n = 0, shard = 0;
  Tensor m, v;  // [shard] with ZeRO, else [n]
  // [shard] with ZeRO: this rank's slice of the reduced gradient — ZeRO-1: its chunk of
  // grad_padded (reduce-scattered in place); ZeRO-2/3: a buffer the micro-batches' slices
  // are added into.
  Tensor grad_shard;
  Tensor grad_padded;  // [shard * dp], ZeRO-1: the gradient (Param::grad is its head)
  Tensor grad_full;    // [shard * dp], ZeRO-2/3: the gradient buffer while a block's backward runs
  // [shard], with sliced values (ZeRO-3; ZeRO-1/2 under mixed precision): this rank's
  // slice of the f32 master weights, the only f32 copy kept between steps.
  Tensor value_shard;
  Tensor lowp_shard;  // [shard], ZeRO-3 under mixed precision: the slice's compute copy (what is gathered)
  bool decay = true;  // weight decay (not for norms and biases: 1-D parameters)
  bool reduced = false;  // ZeRO-0/1: reduced during the backward of this step's last micro-batch
  bool tp_sharded = false;
  bool norm_elsewhere = false;  // the last pipeline stage's copy of a tied embedding
  // ZeRO-1/2 under mixed precision (the distributed optimizer): the whole compute copy
  // lives in lowp_padded ([shard * dp] bf16: Param::compute itself where nothing needs
  // padding, else a buffer whose head Param::compute then is); AdamW writes the rank's
  // updated slice straight into its chunk, all-gathered in place — lazily after Step
  // (compute_pending: the next forward gathers a block at a time, the next block's
  // ahead), at once after PolicyStep / ValueStep.
  Tensor lowp_padded;
  bool compute_pending = false;
};

// ZeRO-2/3 through the model's block hooks. Values (ZeRO-3; their bf16 compute copies
// under mixed precision) are gathered for the block about to run and for the next one in
// the same direction (prefetch: with NCCL the next block's gather runs on the DP stream
// under this block's compute; Gloo blocks, so on the CPU it only fixes the order), and
// freed unless the next block uses them too. The embedding's
// backward needs no weights, so block 0 gathers none in the backward.
class Trainer::Hooks : public model::ParamHooks {
 public:
  explicit Hooks(Trainer* t) : t_(t) {
    for (size_t i = 0; i < t->state_.size(); ++i) index_[t->state_[i].param] = i;
  }
  absl::Status Acquire(int block, Phase phase) override {
    const bool backward = phase == Phase::kBackward;
    if (t_->compute_pending_) {  // ZeRO-1/2: the last Step's update, gathered a block at a time
      bool issued = false;
      TESSERA_RETURN_IF_ERROR(GatherComputes(block, &issued));
      if (issued || t_->prefetched_) TESSERA_RETURN_IF_ERROR(t_->dp_->Join());  // the block's compute waits for its weights
      t_->prefetched_ = false;
      const int next = Next(block, Phase::kForward);  // ahead, under this block's compute
      if (!backward && next >= 0) TESSERA_RETURN_IF_ERROR(GatherComputes(next, &t_->prefetched_));
      if (!backward && next < 0) t_->compute_pending_ = false;  // the forward's last block: all gathered
    }
    if (t_->options_.zero >= 3 && !(backward && block == 0)) {
      TESSERA_RETURN_IF_ERROR(GatherBlock(block));  // no-op when prefetched
      TESSERA_RETURN_IF_ERROR(t_->dp_->Join());      // the block's compute waits for its weights
      const int next = Next(block, phase);           // prefetch: runs under this block's compute
      if (next >= 0 && !(backward && next == 0)) TESSERA_RETURN_IF_ERROR(GatherBlock(next));
    }
    if (backward)
      for (model::Param* p : t_->model_->BlockUses(block)) TESSERA_RETURN_IF_ERROR(t_->EnsureGrad(State(p)));
    return absl::OkStatus();
  }
  absl::Status Release(int block, Phase phase) override {
    if (t_->options_.zero < 3) return absl::OkStatus();
    const int next = Next(block, phase);
    for (model::Param* p : t_->model_->BlockUses(block)) {
      if (next >= 0) {
        const auto& keep = t_->model_->BlockUses(next);
        if (std::find(keep.begin(), keep.end(), p) != keep.end()) continue;
      }
      p->value = Tensor();
      p->compute = Tensor();
    }
    return absl::OkStatus();
  }
  absl::Status GradsReady(int block) override {
    if (t_->options_.zero >= 2) {
      std::vector<Trainer::State*> bucket;
      for (model::Param* p : t_->model_->BlockOwns(block)) bucket.push_back(&State(p));
      TESSERA_RETURN_IF_ERROR(t_->ReduceGrads(bucket));
    } else if (t_->reduce_in_backward_) {
      model::Param* early = t_->EarlyEmbedding();  // reduced after the LM head's backward instead
      std::vector<Trainer::State*> bucket;  // the block's gradients: one bucket
      for (model::Param* p : t_->model_->BlockOwns(block))
        if (p != early) bucket.push_back(&State(p));
      if (early != nullptr && block == t_->model_->num_blocks() - 1) bucket.push_back(&State(early));
      TESSERA_RETURN_IF_ERROR(t_->ReduceEarly(bucket));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<bool> TakeEmbeddingRows(const Tensor& ids, const Tensor& dout, int64_t /*vocab_start*/) override {
    return t_->TakeEmbeddingRows(ids, dout);
  }

 private:
  int Next(int block, Phase phase) const {
    const int next = phase == Phase::kForward ? block + 1 : block - 1;
    return next >= 0 && next < t_->model_->num_blocks() ? next : -1;
  }
  Trainer::State& State(const model::Param* p) { return t_->state_[index_.at(p)]; }
  absl::Status GatherBlock(int block) {
    const auto& uses = t_->model_->BlockUses(block);
    t_->dp_->SetOverlap(true);
    absl::Status st = Grouped(*t_->dp_, uses.size() > 1, [&] {
      for (model::Param* p : uses) TESSERA_RETURN_IF_ERROR(t_->GatherForCompute(State(p)));
      return absl::OkStatus();
    });
    t_->dp_->SetOverlap(false);
    return st;
  }
  // One NCCL group per block (as the block's gradient reductions), in overlap mode.
  absl::Status GatherComputes(int block, bool* issued) {
    std::vector<Trainer::State*> todo;
    for (model::Param* p : t_->model_->BlockUses(block))
      if (State(p).compute_pending) todo.push_back(&State(p));
    if (todo.empty()) return absl::OkStatus();
    t_->dp_->SetOverlap(true);
    absl::Status st = Grouped(*t_->dp_, todo.size() > 1, [&] {
      for (Trainer::State* s : todo) TESSERA_RETURN_IF_ERROR(t_->GatherCompute(*s));
      return absl::OkStatus();
    });
    t_->dp_->SetOverlap(false);
    *issued = true;
    return st;
  }
  Trainer* t_;
  std::unordered_map<const model::Param*, size_t> index_;
};

Trainer::Trainer(model::Llama* model, runtime::Backend* backend, comm::Communicator* dp, comm::Communicator* tp,
                 comm::Communicator* pp, const OptimizerOptions& options)
    : model_(model),
      backend_(backend),
      dp_(dp != nullptr && dp->size() > 1 ? dp : nullptr),
      tp_(tp != nullptr && tp->size() > 1 ? tp : nullptr),
      pp_(pp != nullptr && pp->size() > 1 ? pp : nullptr),
      options_(options) {
  if (dp_ == nullptr) options_.zero = 0;  // one DP rank: nothing to shard
  sliced_ = options_.zero == 3 || (options_.zero >= 1 && model_->config().dtype != DType::kF32);
  model_->set_defer_loss(true);  // the step's loss read once, after its last backward
}
Trainer::~Trainer() {
  if (hooks_ != nullptr) model_->set_hooks(nullptr);
  model_->set_defer_loss(false);
  model_->DropPendingLoss();
}

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(model::Llama* model, runtime::Backend* backend,
                                                         comm::Communicator* dp, comm::Communicator* tp,
                                                         const OptimizerOptions& options, comm::Communicator* pp) {
  if (model == nullptr || backend == nullptr) return absl::InvalidArgumentError("trainer: no model or backend");
  const int pp_size = pp != nullptr ? pp->size() : 1;
  if (model->stage().pp != pp_size)
    return absl::InvalidArgumentError(absl::StrCat("trainer: the model is a stage of pp ", model->stage().pp,
                                                   " but the pipeline group has ", pp_size, " ranks"));
  if (options.zero < 0 || options.zero > 3)
    return absl::InvalidArgumentError(absl::StrCat("trainer: zero must be 0, 1, 2 or 3, got ", options.zero));
  if (!(options.lr > 0) || options.min_lr < 0 || options.min_lr > options.lr)
    return absl::InvalidArgumentError(
        absl::StrCat("trainer: need 0 <= min_lr <= lr and lr > 0, got lr ", options.lr, ", min_lr ", options.min_lr));
  if (options.total_steps < 1 || options.warmup_steps < 0)
    return absl::InvalidArgumentError("trainer: total_steps must be >= 1 and warmup_steps >= 0");
  std::unique_ptr<Trainer> t(new Trainer(model, backend, dp, tp, pp, options));
  TESSERA_RETURN_IF_ERROR(t->Allocate());
  return t;
}

// Sliced values start from the model's full values (as initialized or loaded): each rank
// keeps its slice and frees the rest (ZeRO-3 the compute copy too); ZeRO-1 moves the
// gradient into a padded buffer, ZeRO-2/3 free the model's gradient buffers.
absl::Status Trainer::Allocate() {
  runtime::Backend& b = *backend_;
  const int dp = dp_ ? dp_->size() : 1, rank = dp_ ? dp_->rank() : 0;
  const int zero = options_.zero;
  for (auto& p : model_->params()) {
    State s;
    s.param = &p;
    s.shape = p.value.shape();
    s.n = p.value.numel();
    s.decay = p.spec.shape.size() > 1;
    s.tp_sharded = tp_ != nullptr && p.spec.shard_dim >= 0;
    s.norm_elsewhere = pp_ != nullptr && pp_->rank() != 0 && p.name() == "model.embed_tokens.weight";
    s.shard = zero > 0 ? (s.n + dp - 1) / dp : s.n;
    TESSERA_ASSIGN_OR_RETURN(s.m, b.Empty({s.shard}, DType::kF32));
    TESSERA_ASSIGN_OR_RETURN(s.v, b.Empty({s.shard}, DType::kF32));
    TESSERA_RETURN_IF_ERROR(b.Fill(s.m, 0));
    TESSERA_RETURN_IF_ERROR(b.Fill(s.v, 0));
    if (zero == 1) {
      if (s.shard * dp == s.n && p.grad.contiguous()) {
        TESSERA_ASSIGN_OR_RETURN(s.grad_padded, p.grad.Reshape({s.n}));
      } else {  // the gradient moves into a padded buffer whose tail stays zero
        TESSERA_ASSIGN_OR_RETURN(s.grad_padded, b.Empty({s.shard * dp}, DType::kF32));
        TESSERA_RETURN_IF_ERROR(b.Fill(s.grad_padded, 0));
        TESSERA_ASSIGN_OR_RETURN(Tensor head, s.grad_padded.Slice(0, 0, s.n));
        TESSERA_ASSIGN_OR_RETURN(p.grad, head.Reshape(s.shape));
        TESSERA_RETURN_IF_ERROR(model_->MarkGradStale(p));
      }
      TESSERA_ASSIGN_OR_RETURN(s.grad_shard, s.grad_padded.Slice(0, rank * s.shard, s.shard));
    }
    if (zero >= 2) {
      TESSERA_ASSIGN_OR_RETURN(s.grad_shard, b.Empty({s.shard}, DType::kF32));
    }
    if ((zero == 1 || zero == 2) && p.compute.defined()) {  // mixed precision: the slices' bf16 copies are gathered
      if (s.shard * dp == s.n && p.compute.contiguous()) {
        // No padding: the gather lands in the model's own compute copy.
        TESSERA_ASSIGN_OR_RETURN(s.lowp_padded, p.compute.Reshape({s.n}));
      } else {  // the compute copy moves into a padded buffer
        TESSERA_ASSIGN_OR_RETURN(s.lowp_padded, b.Empty({s.shard * dp}, p.compute.dtype()));
        TESSERA_RETURN_IF_ERROR(b.Fill(s.lowp_padded, 0));
        TESSERA_ASSIGN_OR_RETURN(Tensor head, s.lowp_padded.Slice(0, 0, s.n));
        TESSERA_ASSIGN_OR_RETURN(p.compute, head.Reshape(s.shape));
        TESSERA_RETURN_IF_ERROR(model_->RefreshCompute(p));  // casts into the view (same shape: no new buffer)
      }
    }
    if (sliced_) {
      TESSERA_ASSIGN_OR_RETURN(s.value_shard, b.Empty({s.shard}, DType::kF32));
      TESSERA_RETURN_IF_ERROR(b.Fill(s.value_shard, 0));
      const int64_t begin = std::min<int64_t>(s.n, rank * s.shard), len = std::min<int64_t>(s.shard, s.n - begin);
      if (len > 0) {
        TESSERA_ASSIGN_OR_RETURN(Tensor flat, p.value.Reshape({s.n}));
        TESSERA_ASSIGN_OR_RETURN(Tensor mine, flat.Slice(0, begin, len));
        TESSERA_ASSIGN_OR_RETURN(Tensor dst, s.value_shard.Slice(0, 0, len));
        TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, mine, 0.f, dst));
      }
      p.value = Tensor();
    }
    if (zero == 3) {
      if (p.compute.defined()) {  // mixed precision
        TESSERA_ASSIGN_OR_RETURN(s.lowp_shard, b.Empty({s.shard}, p.compute.dtype()));
        TESSERA_RETURN_IF_ERROR(b.Cast(s.value_shard, s.lowp_shard));
      }
      p.compute = Tensor();
    }
    if (zero >= 2) p.grad = Tensor(), p.grad_stale = false;  // EnsureGrad gives each block its buffer
    state_.push_back(std::move(s));
  }
  if (zero >= 2 || (dp_ != nullptr && pp_ == nullptr)) {
    hooks_ = std::make_unique<Hooks>(this);
    model_->set_hooks(hooks_.get());
  }
  return absl::OkStatus();
}

// Sliced values: the full f32 value of one parameter from every rank's slice (no-op when
// present); ZeRO-3 also makes its compute copy (ZeRO-1/2 keep theirs whole).
absl::Status Trainer::GatherValue(State& s) {
  if (s.param->value.defined()) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(Tensor full, backend_->Empty({s.shard * dp_->size()}, DType::kF32));
  TESSERA_RETURN_IF_ERROR(dp_->AllGather(s.value_shard.data(), full.data(), s.shard, DType::kF32));
  TESSERA_ASSIGN_OR_RETURN(Tensor head, full.Slice(0, 0, s.n));
  TESSERA_ASSIGN_OR_RETURN(s.param->value, head.Reshape(s.shape));
  return options_.zero == 3 ? model_->RefreshCompute(*s.param) : absl::OkStatus();
}

// ZeRO-3, before a block runs: what its forward and backward multiply with — under mixed
// precision the bf16 compute copy, gathered from the bf16 slices (half the bytes of the
// f32 values, and no cast), else the f32 value. The caller (Hooks::GatherBlock) issues
// a block's gathers as one group with the DP group in overlap mode and joins before the
// compute that reads them (Hooks::Acquire), so a prefetch runs under the current
// block's compute.
absl::Status Trainer::GatherForCompute(State& s) {
  model::Param& p = *s.param;
  const bool lowp = s.lowp_shard.defined();
  if (lowp ? p.compute.defined() : p.value.defined()) return absl::OkStatus();
  const Tensor& shard = lowp ? s.lowp_shard : s.value_shard;
  TESSERA_ASSIGN_OR_RETURN(Tensor full, backend_->Empty({s.shard * dp_->size()}, shard.dtype()));
  TESSERA_RETURN_IF_ERROR(dp_->AllGather(shard.data(), full.data(), s.shard, shard.dtype()));
  TESSERA_ASSIGN_OR_RETURN(Tensor head, full.Slice(0, 0, s.n));
  Tensor& dst = lowp ? p.compute : p.value;
  TESSERA_ASSIGN_OR_RETURN(dst, head.Reshape(s.shape));
  return absl::OkStatus();
}

// ZeRO-2/3: a padded gradient buffer for a block's backward (no-op when present: a tied
// embedding's gradient lives from the LM head's backward to the embedding's). The padding
// is zeroed (the reduce-scatter reads it); the gradient itself starts stale, so the
// micro-batch's first write overwrites it (Param::grad_stale) — no fill of every
// gradient per micro-batch.
absl::Status Trainer::EnsureGrad(State& s) {
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

// ZeRO-2/3: adds this micro-batch's gradients of one block, reduce-scattered over DP in
// place (one NCCL group), into the rank's slices and frees the full buffers.
absl::Status Trainer::ReduceGrads(const std::vector<State*>& bucket) {
  std::vector<Tensor> mine;  // each buffer's chunk of this rank, where its reduced slice lands
  for (State* s : bucket) {
    if (!s->grad_full.defined())
      return absl::InternalError(absl::StrCat("trainer: no gradient buffer for ", s->param->name()));
    TESSERA_RETURN_IF_ERROR(model_->FreshenGrad(*s->param));  // one this micro-batch did not reach
    TESSERA_ASSIGN_OR_RETURN(Tensor chunk, s->grad_full.Slice(0, dp_->rank() * s->shard, s->shard));
    mine.push_back(chunk);
  }
  TESSERA_RETURN_IF_ERROR(Grouped(*dp_, bucket.size() > 1, [&] {
    for (size_t k = 0; k < bucket.size(); ++k)
      TESSERA_RETURN_IF_ERROR(dp_->ReduceScatter(bucket[k]->grad_full.data(), mine[k].data(), bucket[k]->shard,
                                                 DType::kF32, comm::ReduceOp::kSum));
    return absl::OkStatus();
  }));
  for (size_t k = 0; k < bucket.size(); ++k) {
    State* s = bucket[k];
    TESSERA_RETURN_IF_ERROR(backend_->Axpby(1.f, mine[k], 1.f, s->grad_shard));
    s->param->grad = Tensor();
    s->grad_full = Tensor();
  }
  return absl::OkStatus();
}

// ZeRO-0/1, the reduction of a gradient in two parts. Prepare: compute-stream work only —
// the gradient present (one this step did not reach is zeroed). Issue: the collective —
// ZeRO-0 all-reduces in place, ZeRO-1 reduce-scatters the padded gradient into the rank's
// chunk of it. Apart so that a block's collectives go as one NCCL group after all of the
// block's preparation (a group waits for the compute enqueued before it starts).
absl::Status Trainer::PrepareReduce(State& s) { return model_->FreshenGrad(*s.param); }

absl::Status Trainer::IssueReduce(State& s) {
  if (options_.zero > 0)
    return dp_->ReduceScatter(s.grad_padded.data(), s.grad_shard.data(), s.shard, DType::kF32, comm::ReduceOp::kSum);
  Tensor& g = s.param->grad;
  return dp_->AllReduce(g.data(), g.data(), s.n, DType::kF32, comm::ReduceOp::kSum);
}

absl::Status Trainer::AllReduceGrad(State& s) {
  TESSERA_RETURN_IF_ERROR(PrepareReduce(s));
  return IssueReduce(s);
}

absl::Status Trainer::ReduceEarly(const std::vector<State*>& bucket) {
  if (bucket.empty()) return absl::OkStatus();
  for (State* s : bucket) TESSERA_RETURN_IF_ERROR(PrepareReduce(*s));
  TESSERA_RETURN_IF_ERROR(Grouped(*dp_, bucket.size() > 1, [&] {
    for (State* s : bucket) TESSERA_RETURN_IF_ERROR(IssueReduce(*s));
    return absl::OkStatus();
  }));
  for (State* s : bucket) s->reduced = true;
  return absl::OkStatus();
}

absl::StatusOr<Trainer::Piece> Trainer::ReadPiece(size_t i) {
  if (i >= state_.size()) return absl::OutOfRangeError(absl::StrCat("trainer: no parameter ", i));
  State& s = state_[i];
  runtime::Backend& b = *backend_;
  const int rank = dp_ ? dp_->rank() : 0;
  const int64_t begin = std::min<int64_t>(s.n, rank * s.shard), len = std::min<int64_t>(s.shard, s.n - begin);
  Piece p;
  auto read = [&](const Tensor& t, int64_t count, std::vector<float>& out) -> absl::Status {
    out.resize(count);
    if (count == 0) return absl::OkStatus();
    TESSERA_ASSIGN_OR_RETURN(Tensor flat, t.Reshape({t.numel()}));
    TESSERA_ASSIGN_OR_RETURN(Tensor head, flat.Slice(0, 0, count));
    return b.CopyToHost(head, out.data());
  };
  if (sliced_) {
    p.value_begin = begin;
    TESSERA_RETURN_IF_ERROR(read(s.value_shard, len, p.value));
  } else {
    TESSERA_RETURN_IF_ERROR(read(s.param->value, s.n, p.value));
  }
  p.state_begin = options_.zero > 0 ? begin : 0;
  const int64_t state_len = options_.zero > 0 ? len : s.n;
  TESSERA_RETURN_IF_ERROR(read(s.m, state_len, p.m));
  TESSERA_RETURN_IF_ERROR(read(s.v, state_len, p.v));
  return p;
}

absl::Status Trainer::ResetOptimizerState() {
  for (State& s : state_) {
    TESSERA_RETURN_IF_ERROR(backend_->Fill(s.m, 0));
    TESSERA_RETURN_IF_ERROR(backend_->Fill(s.v, 0));
  }
  step_ = 0;
  return absl::OkStatus();
}

Trainer::PieceSlices Trainer::SlicesOf(size_t i) const {
  const State& s = state_[i];
  const int rank = dp_ ? dp_->rank() : 0;
  const int64_t begin = std::min<int64_t>(s.n, rank * s.shard), len = std::min<int64_t>(s.shard, s.n - begin);
  PieceSlices r;
  r.n = s.n;
  if (sliced_) r.value_begin = begin, r.value_len = len;
  else r.value_len = s.n;
  if (options_.zero > 0) r.state_begin = begin, r.state_len = len;
  else r.state_len = s.n;
  return r;
}

absl::Status Trainer::LoadPiece(size_t i, const Piece& p) {
  if (i >= state_.size()) return absl::OutOfRangeError(absl::StrCat("trainer: no parameter ", i));
  State& s = state_[i];
  const PieceSlices sl = SlicesOf(i);
  if (p.value_begin != sl.value_begin || static_cast<int64_t>(p.value.size()) != sl.value_len ||
      p.state_begin != sl.state_begin || static_cast<int64_t>(p.m.size()) != sl.state_len ||
      static_cast<int64_t>(p.v.size()) != sl.state_len)
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer: ", s.param->name(), " holds value elements [", sl.value_begin, ", +", sl.value_len, ") and moments [",
        sl.state_begin, ", +", sl.state_len, "); got [", p.value_begin, ", +", p.value.size(), ") and [", p.state_begin,
        ", +", p.m.size(), " / ", p.v.size(), ")"));
  runtime::Backend& b = *backend_;
  auto write = [&](const std::vector<float>& src, Tensor& t) -> absl::Status {
    TESSERA_RETURN_IF_ERROR(b.Fill(t, 0));  // the padding past n stays zero
    if (src.empty()) return absl::OkStatus();
    TESSERA_ASSIGN_OR_RETURN(Tensor flat, t.Reshape({t.numel()}));
    TESSERA_ASSIGN_OR_RETURN(Tensor head, flat.Slice(0, 0, static_cast<int64_t>(src.size())));
    return b.CopyFromHost(src.data(), head);
  };
  if (sliced_) {
    s.param->value = Tensor();  // a gathered copy, if any
    if (options_.zero == 3) s.param->compute = Tensor();
    TESSERA_RETURN_IF_ERROR(write(p.value, s.value_shard));
    if (s.lowp_shard.defined()) TESSERA_RETURN_IF_ERROR(b.Cast(s.value_shard, s.lowp_shard));
    if (s.lowp_padded.defined()) {  // ZeRO-1/2: this rank's chunk now, the others' by GatherComputes
      if (!p.value.empty()) {
        const int64_t len = static_cast<int64_t>(p.value.size());
        TESSERA_ASSIGN_OR_RETURN(Tensor mine, s.value_shard.Slice(0, 0, len));
        TESSERA_ASSIGN_OR_RETURN(Tensor lowp, s.lowp_padded.Slice(0, p.value_begin, len));
        TESSERA_RETURN_IF_ERROR(b.Cast(mine, lowp));
      }
      s.compute_pending = compute_pending_ = true;
    }
  } else {
    TESSERA_RETURN_IF_ERROR(write(p.value, s.param->value));
    TESSERA_RETURN_IF_ERROR(model_->RefreshCompute(*s.param));
  }
  TESSERA_RETURN_IF_ERROR(write(p.m, s.m));
  return write(p.v, s.v);
}

// Host values: not ordered with the compute stream (Communicator::AllReduceHost).
absl::Status Trainer::AllReduceHost(comm::Communicator* c, float* values, int n) {
  if (c == nullptr) return absl::OkStatus();
  return c->AllReduceHost(values, values, n, DType::kF32, comm::ReduceOp::kSum);
}

// The schedule's operations in order. Activations go to the next rank (tag 0) and
// gradients to the previous one (tag 1) without waiting; receives block (on GPUs: order
// the streams). The sent tensors stay alive until every send is done. Timing marks
// (Backend::Mark) go at the start, around each operation's compute (after its receive,
// before its send) and after the final wait for the sends; PipelineTimes reads them.
absl::StatusOr<double> Trainer::RunPipeline(const std::vector<model::TokenBatch>& micro_batches, float scale) {
  model::Llama& m = *model_;
  runtime::Backend& b = *backend_;
  const int64_t n = static_cast<int64_t>(micro_batches.size());
  if (n * m.num_chunks() > 250)  // Gloo keeps 256 message slots in flight per pair of ranks
    return absl::InvalidArgumentError(absl::StrCat("pipeline: ", n, " micro-batches x ", m.num_chunks(),
                                                   " chunks per step; at most 250"));
  TESSERA_ASSIGN_OR_RETURN(std::vector<parallel::PipeOp> ops,
                           parallel::PipelineSchedule(options_.schedule, pp_->size(), m.num_chunks(), pp_->rank(), n));
  const int next = (pp_->rank() + 1) % pp_->size(), prev = (pp_->rank() + pp_->size() - 1) % pp_->size();
  // The stages start together: the step's call reaches each executor at its own time (a
  // job's driver sends one RPC per rank), and a stage that waited for a late peer would
  // count that wait as bubble. The host has waited at the end of the last step anyway.
  TESSERA_RETURN_IF_ERROR(pp_->Barrier());
  b.ClearMarks();
  pipe_marks_.clear();
  TESSERA_ASSIGN_OR_RETURN(int start, b.Mark());
  pipe_marks_.push_back(start);
  std::vector<Tensor> sent;
  model::LossSum loss;
  for (const parallel::PipeOp& op : ops) {
    const model::TokenBatch& batch = micro_batches[op.micro_batch];
    const std::vector<int64_t> shape = {m.StageTokens(batch), m.config().hidden};
    Tensor in;  // the activation (forward) or gradient (backward) received, if any
    const bool receives = op.forward ? !m.FirstVirtualStage(op.chunk) : !m.LastVirtualStage(op.chunk);
    if (receives) {
      TESSERA_ASSIGN_OR_RETURN(in, b.Empty(shape, model_->config().dtype));
      TESSERA_RETURN_IF_ERROR(pp_->RecvTagged(in.data(), in.numel(), in.dtype(), op.forward ? prev : next, op.forward ? 0 : 1));
    }
    TESSERA_ASSIGN_OR_RETURN(int before, b.Mark());
    absl::StatusOr<Tensor> out = op.forward ? m.PipelineForward(op.chunk, op.micro_batch, batch,
                                                                  receives ? &in : nullptr, scale, &loss)
                                            : m.PipelineBackward(op.chunk, op.micro_batch, receives ? &in : nullptr);
    if (!out.ok()) return out.status();
    TESSERA_ASSIGN_OR_RETURN(int after, b.Mark());
    pipe_marks_.push_back(before);
    pipe_marks_.push_back(after);
    const bool sends = op.forward ? !m.LastVirtualStage(op.chunk) : !m.FirstVirtualStage(op.chunk);
    if (sends) {
      TESSERA_RETURN_IF_ERROR(pp_->Isend(out->data(), out->numel(), out->dtype(), op.forward ? next : prev,
                                         op.forward ? 0 : 1));
      sent.push_back(*out);
    }
  }
  TESSERA_RETURN_IF_ERROR(pp_->WaitSends());
  TESSERA_ASSIGN_OR_RETURN(int end, b.Mark());
  pipe_marks_.push_back(end);
  TESSERA_ASSIGN_OR_RETURN(double pending, m.TakePendingLoss());  // the last stage's, summed on the device
  return loss.sum + pending;
}

// From RunPipeline's marks (start, before/after of each operation, end): the whole
// schedule and the time inside the operations' compute. Call after the host has waited
// for the step (on GPUs, reading an event waits for it).
absl::Status Trainer::PipelineTimes(StepStats* stats) {
  if (pipe_marks_.size() < 2) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(stats->pipeline_s, backend_->Seconds(pipe_marks_.front(), pipe_marks_.back()));
  double busy = 0;
  for (size_t i = 1; i + 2 < pipe_marks_.size(); i += 2) {
    TESSERA_ASSIGN_OR_RETURN(double op, backend_->Seconds(pipe_marks_[i], pipe_marks_[i + 1]));
    busy += op;
  }
  stats->pipeline_busy_s = busy;
  return absl::OkStatus();
}

// Tied embeddings under PP: the first stage's embedding and the last stage's LM head are
// one parameter held twice; both copies get the sum of their gradients (tag 2) — under
// ZeRO-2/3 the sum of the DP-reduced slices (both stages slice it alike), since the full
// gradient buffers are gone by now.
absl::Status Trainer::SumTiedEmbeddingGrads() {
  const int rank = pp_->rank(), last = pp_->size() - 1;
  if (!model_->config().tie_embeddings || (rank != 0 && rank != last)) return absl::OkStatus();
  model::Param* e = model_->Find("model.embed_tokens.weight");
  if (e == nullptr) return absl::InternalError("trainer: a tied first or last stage holds no embedding");
  TESSERA_RETURN_IF_ERROR(model_->FreshenGrad(*e));
  Tensor* grad = &e->grad;
  if (options_.zero >= 2)
    for (State& s : state_)
      if (s.param == e) grad = &s.grad_shard;
  TESSERA_ASSIGN_OR_RETURN(Tensor mine, backend_->Empty(grad->shape(), DType::kF32));
  TESSERA_ASSIGN_OR_RETURN(Tensor theirs, backend_->Empty(grad->shape(), DType::kF32));
  TESSERA_RETURN_IF_ERROR(backend_->Axpby(1.f, *grad, 0.f, mine));
  const int other = rank == 0 ? last : 0;
  TESSERA_RETURN_IF_ERROR(pp_->Isend(mine.data(), mine.numel(), DType::kF32, other, 2));
  TESSERA_RETURN_IF_ERROR(pp_->RecvTagged(theirs.data(), theirs.numel(), DType::kF32, other, 2));
  TESSERA_RETURN_IF_ERROR(pp_->WaitSends());
  return backend_->Axpby(1.f, theirs, 1.f, *grad);
}

absl::Status Trainer::GatherParams() {
  TESSERA_RETURN_IF_ERROR(GatherComputes());
  if (!sliced_) return absl::OkStatus();
  for (State& s : state_) TESSERA_RETURN_IF_ERROR(GatherValue(s));
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Trainer::GlobalTokens(const std::vector<model::TokenBatch>& micro_batches) {
  int64_t tokens = 0;
  for (const auto& mb : micro_batches)
    for (int32_t t : mb.targets) tokens += t >= 0;
  if (dp_ == nullptr) return tokens;
  // On the host, not behind the last step's optimizer on the device (which the step's
  // first kernels then queue behind, as with one rank).
  TESSERA_RETURN_IF_ERROR(dp_->AllReduceHost(&tokens, &tokens, 1, DType::kI64, comm::ReduceOp::kSum));
  return tokens;
}

// Reduces gradients over DP (all-reduce, or reduce-scatter into the ZeRO shard) and
// returns the global gradient norm: squares summed over this rank's (shard of the)
// gradients, over DP when sharded by ZeRO, and over TP for TP-sharded parameters
// (replicated ones are the same on every TP rank and counted once).
absl::StatusOr<double> Trainer::ReduceGradsAndNorm() {
  runtime::Backend& b = *backend_;
  TESSERA_ASSIGN_OR_RETURN(Tensor sq, b.Empty({2}, DType::kF32));  // [TP-sharded, replicated]
  TESSERA_RETURN_IF_ERROR(b.Fill(sq, 0));
  TESSERA_ASSIGN_OR_RETURN(Tensor sq_sharded, sq.Slice(0, 0, 1));
  TESSERA_ASSIGN_OR_RETURN(Tensor sq_repl, sq.Slice(0, 1, 1));
  const bool zero = options_.zero > 0;
  auto& params = model_->params();
  for (size_t i = 0; i < params.size(); ++i) {
    State& s = state_[i];
    TESSERA_RETURN_IF_ERROR(model_->FreshenGrad(params[i]));  // one no write reached this step
    Tensor& g = params[i].grad;
    Tensor& acc = s.tp_sharded ? sq_sharded : sq_repl;
    if (s.norm_elsewhere) {  // the last stage's copy of a tied embedding: reduce it, count it on the first stage
      if (dp_ != nullptr && !zero)
        TESSERA_RETURN_IF_ERROR(dp_->AllReduce(g.data(), g.data(), s.n, DType::kF32, comm::ReduceOp::kSum));
      if (!zero) continue;
    }
    if (options_.zero >= 2) {  // reduced into the slice during the backward
      if (!s.norm_elsewhere) TESSERA_RETURN_IF_ERROR(b.SumSquares(s.grad_shard, acc));
      continue;
    }
    const bool reduced = s.reduced;  // during the backward (ReduceEarly)
    s.reduced = false;
    if (!zero) {
      if (dp_ != nullptr && !reduced) TESSERA_RETURN_IF_ERROR(AllReduceGrad(s));
      TESSERA_RETURN_IF_ERROR(b.SumSquares(g, acc));
      continue;
    }
    if (!reduced) {
      TESSERA_RETURN_IF_ERROR(PrepareReduce(s));
      TESSERA_RETURN_IF_ERROR(IssueReduce(s));
    }
    if (!s.norm_elsewhere) TESSERA_RETURN_IF_ERROR(b.SumSquares(s.grad_shard, acc));
  }
  if (zero) TESSERA_RETURN_IF_ERROR(dp_->AllReduce(sq.data(), sq.data(), 2, DType::kF32, comm::ReduceOp::kSum));
  if (tp_ != nullptr)
    TESSERA_RETURN_IF_ERROR(tp_->AllReduce(sq_sharded.data(), sq_sharded.data(), 1, DType::kF32, comm::ReduceOp::kSum));
  if (pp_ != nullptr)  // the stages hold different parameters (a tied embedding's copy is not counted twice)
    TESSERA_RETURN_IF_ERROR(pp_->AllReduce(sq.data(), sq.data(), 2, DType::kF32, comm::ReduceOp::kSum));
  // A collective stuck on NCCL fails here under the communicators' watchdog, not in the
  // host copy below (which would wait for ever).
  for (comm::Communicator* c : {dp_, tp_, pp_})
    if (c != nullptr) TESSERA_RETURN_IF_ERROR(c->Synchronize());
  float host[2];
  TESSERA_RETURN_IF_ERROR(b.CopyToHost(sq, host));
  return std::sqrt(static_cast<double>(host[0]) + host[1]);
}

absl::Status Trainer::Update(float lr, float clip_scale, bool lazy_gather) {
  runtime::Backend& b = *backend_;
  auto& params = model_->params();
  const int rank = dp_ ? dp_->rank() : 0;
  for (size_t i = 0; i < params.size(); ++i) {
    State& s = state_[i];
    runtime::AdamWParams hp{lr, options_.beta1, options_.beta2, options_.eps, s.decay ? options_.weight_decay : 0.f,
                            step_, clip_scale};  // clipping fused into AdamW's read of the gradient
    if (!s.grad_shard.defined()) {
      TESSERA_ASSIGN_OR_RETURN(Tensor m, s.m.Reshape(params[i].value.shape()));
      TESSERA_ASSIGN_OR_RETURN(Tensor v, s.v.Reshape(params[i].value.shape()));
      // Mixed precision: AdamW writes the bf16 compute copy in the same pass.
      Tensor* lowp = params[i].compute.defined() ? &params[i].compute : nullptr;
      TESSERA_RETURN_IF_ERROR(b.AdamW(params[i].value, params[i].grad, m, v, hp, lowp));
      continue;
    }
    const int64_t begin = std::min<int64_t>(s.n, rank * s.shard), len = std::min<int64_t>(s.shard, s.n - begin);
    // AdamW on this rank's slice of the parameter (p: len elements) with its gradient
    // slice; under mixed precision it also writes the slice's compute copy (`lowp`).
    auto update_slice = [&](Tensor& p, Tensor* lowp) -> absl::Status {
      TESSERA_ASSIGN_OR_RETURN(Tensor g, s.grad_shard.Slice(0, 0, len));
      TESSERA_ASSIGN_OR_RETURN(Tensor m, s.m.Slice(0, 0, len));
      TESSERA_ASSIGN_OR_RETURN(Tensor v, s.v.Slice(0, 0, len));
      return b.AdamW(p, g, m, v, hp, lowp);
    };
    if (sliced_) {  // the slice is the master copy
      params[i].value = Tensor();  // a gathered copy (GatherParams), if any
      if (options_.zero == 3) params[i].compute = Tensor();  // gathered again when a block needs it
      // ZeRO-1/2 under mixed precision: the update's bf16 copy goes straight into this
      // rank's chunk of the whole compute copy, gathered in place from there (half the
      // bytes of the f32 values, and no cast).
      if (s.lowp_padded.defined()) s.compute_pending = compute_pending_ = true;
      if (len == 0) continue;
      TESSERA_ASSIGN_OR_RETURN(Tensor p, s.value_shard.Slice(0, 0, len));
      Tensor lowp;
      if (s.lowp_shard.defined()) {
        TESSERA_ASSIGN_OR_RETURN(lowp, s.lowp_shard.Slice(0, 0, len));
      } else if (s.lowp_padded.defined()) {
        TESSERA_ASSIGN_OR_RETURN(lowp, s.lowp_padded.Slice(0, begin, len));
      }
      TESSERA_RETURN_IF_ERROR(update_slice(p, lowp.defined() ? &lowp : nullptr));
      continue;
    }
    // ZeRO-1/2 in f32: the value is what the model computes with; its updated slices are
    // gathered at once.
    TESSERA_ASSIGN_OR_RETURN(Tensor flat, params[i].value.Reshape({s.n}));
    TESSERA_ASSIGN_OR_RETURN(Tensor p, flat.Slice(0, begin, len));
    if (len > 0) TESSERA_RETURN_IF_ERROR(update_slice(p, nullptr));
    TESSERA_RETURN_IF_ERROR(GatherSlices(s, begin, len));
  }
  // Mixed precision, ZeRO-1/2: the compute copies now, or (lazy_gather: Step, whose next
  // forward goes through the hooks) a block at a time in the next forward.
  if (compute_pending_ && !(lazy_gather && LazyComputes())) return GatherComputes();
  return absl::OkStatus();
}

// ZeRO-1/2 under mixed precision: the compute copy of one parameter gathered in place
// from every rank's updated chunk, in whatever mode the DP group is (Hooks::Acquire:
// overlap, joined before the compute that reads it).
absl::Status Trainer::GatherCompute(State& s) {
  if (!s.compute_pending) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(Tensor mine, s.lowp_padded.Slice(0, dp_->rank() * s.shard, s.shard));
  TESSERA_RETURN_IF_ERROR(dp_->AllGather(mine.data(), s.lowp_padded.data(), s.shard, s.lowp_padded.dtype()));
  s.compute_pending = false;
  return absl::OkStatus();
}

absl::Status Trainer::GatherComputes() {
  if (!compute_pending_) return absl::OkStatus();
  for (State& s : state_) TESSERA_RETURN_IF_ERROR(GatherCompute(s));
  compute_pending_ = prefetched_ = false;
  return absl::OkStatus();
}

// ZeRO-1/2 in f32: the value from every rank's updated slice (len elements at `begin`),
// gathered in place where no padding is needed, else through a padded temporary.
absl::Status Trainer::GatherSlices(State& s, int64_t begin, int64_t len) {
  runtime::Backend& b = *backend_;
  const int dp = dp_->size(), rank = dp_->rank();
  TESSERA_ASSIGN_OR_RETURN(Tensor flat, s.param->value.Reshape({s.n}));
  if (s.shard * dp == s.n) {
    TESSERA_ASSIGN_OR_RETURN(Tensor mine, flat.Slice(0, rank * s.shard, s.shard));
    return dp_->AllGather(mine.data(), flat.data(), s.shard, DType::kF32);
  }
  TESSERA_ASSIGN_OR_RETURN(Tensor gathered, b.Empty({s.shard * dp}, DType::kF32));
  TESSERA_ASSIGN_OR_RETURN(Tensor chunk, gathered.Slice(0, rank * s.shard, s.shard));
  if (len > 0) {
    TESSERA_ASSIGN_OR_RETURN(Tensor mine, flat.Slice(0, begin, len));
    TESSERA_ASSIGN_OR_RETURN(Tensor dst, chunk.Slice(0, 0, len));
    TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, mine, 0.f, dst));
  }
  TESSERA_RETURN_IF_ERROR(dp_->AllGather(chunk.data(), gathered.data(), s.shard, DType::kF32));
  TESSERA_ASSIGN_OR_RETURN(Tensor head, gathered.Slice(0, 0, s.n));
  return b.Axpby(1.f, head, 0.f, flat);
}

absl::Status Trainer::BeginStep(const std::vector<model::TokenBatch>& micro_batches) {
  model_->DropPendingLoss();  // a failed step's, if any
  for (const model::TokenBatch& mb : micro_batches) TESSERA_RETURN_IF_ERROR(model_->PrepareKernels(mb));
  // Compute copies left pending by a load, or by a step where no forward gathers them.
  if (compute_pending_ && !LazyComputes()) TESSERA_RETURN_IF_ERROR(GatherComputes());
  TESSERA_RETURN_IF_ERROR(model_->ZeroGrads());
  if (options_.zero >= 2)
    for (State& s : state_) TESSERA_RETURN_IF_ERROR(backend_->Fill(s.grad_shard, 0));
  return absl::OkStatus();
}

// The step's end: the gradients reduced and their global norm, clipping, the LR schedule
// and the update.
absl::Status Trainer::FinishStep(StepStats& stats, bool lazy_gather) {
  TESSERA_ASSIGN_OR_RETURN(stats.grad_norm, ReduceGradsAndNorm());
  ++step_;
  stats.lr = LearningRate(options_, step_);
  const float clip = options_.clip_norm > 0 && stats.grad_norm > options_.clip_norm
                         ? static_cast<float>(options_.clip_norm / (stats.grad_norm + 1e-6))
                         : 1.f;
  return Update(stats.lr, clip, lazy_gather);
}

absl::StatusOr<StepStats> Trainer::Step(const std::vector<model::TokenBatch>& micro_batches) {
  StepStats stats;
  TESSERA_ASSIGN_OR_RETURN(stats.tokens, GlobalTokens(micro_batches));
  if (stats.tokens == 0) return absl::InvalidArgumentError("trainer: the global batch has no target tokens");
  TESSERA_RETURN_IF_ERROR(BeginStep(micro_batches));
  // The last micro-batch's rows (host collectives: the device goes on with the last update).
  if (pp_ == nullptr && options_.zero == 0)
    TESSERA_RETURN_IF_ERROR(PlanEmbeddingRows(micro_batches.back()));
  const float scale = 1.f / static_cast<float>(stats.tokens);
  float loss_sum = 0.f;
  if (pp_ != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(double l, RunPipeline(micro_batches, scale));
    loss_sum = static_cast<float>(l);
    TESSERA_RETURN_IF_ERROR(SumTiedEmbeddingGrads());
  } else {
    for (size_t i = 0; i < micro_batches.size(); ++i) {
      // ZeRO-0/1 with DP: the last micro-batch's backward reduces each block's gradients
      // as it goes, overlapped (NCCL) with the blocks below; joined before the norm.
      const bool last = i + 1 == micro_batches.size() && hooks_ != nullptr && options_.zero < 2;
      if (last) reduce_in_backward_ = true, dp_->SetOverlap(true);
      absl::StatusOr<model::LossSum> l = model_->ForwardBackward(micro_batches[i], scale);
      if (last) {
        reduce_in_backward_ = false;
        dp_->SetOverlap(false);
        if (l.ok()) {  // marks around the join: the compute stream's wait for the reduction
          backend_->ClearMarks();
          TESSERA_ASSIGN_OR_RETURN(wait_marks_[0], backend_->Mark());
          TESSERA_RETURN_IF_ERROR(dp_->Join());
          TESSERA_ASSIGN_OR_RETURN(wait_marks_[1], backend_->Mark());
          TESSERA_RETURN_IF_ERROR(AddEmbeddingRows());
        }
        rows_.reset();
      }
      if (!l.ok()) return l.status();
      loss_sum += static_cast<float>(l->sum);
    }
    TESSERA_ASSIGN_OR_RETURN(double pending, model_->TakePendingLoss());  // summed on the device
    loss_sum += static_cast<float>(pending);
  }
  TESSERA_RETURN_IF_ERROR(AllReduceHost(dp_, &loss_sum, 1));
  TESSERA_RETURN_IF_ERROR(AllReduceHost(pp_, &loss_sum, 1));  // only the last stage has a loss
  if (pp_ != nullptr) TESSERA_RETURN_IF_ERROR(PipelineTimes(&stats));  // the host has waited
  if (wait_marks_[0] >= 0) {
    TESSERA_ASSIGN_OR_RETURN(stats.dp_wait_s, backend_->Seconds(wait_marks_[0], wait_marks_[1]));
    wait_marks_ = {-1, -1};
  }
  stats.loss = loss_sum / stats.tokens;
  TESSERA_RETURN_IF_ERROR(FinishStep(stats, /*lazy_gather=*/true));
  return stats;
}

}  // namespace tessera::engine
