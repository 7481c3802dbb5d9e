// ZeRO-1 and ZeRO-2 (grad_sync.h: DistributedOptimizer).
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/train/grad_sync.h"
#include "worker/train/grouped.h"

namespace tessera::engine {
using runtime::Tensor;

DistributedOptimizer::DistributedOptimizer(int zero, model::Llama* model, runtime::Backend* backend,
                                           comm::Communicator* dp, comm::Communicator* tp, comm::Communicator* pp)
    : GradSync(zero, model, backend, dp, tp, pp) {}

// ZeRO-1 moves the gradient into a padded buffer (where it does not split evenly),
// ZeRO-2 frees it (EnsureGrad gives each block's backward one); under mixed precision
// the compute copy moves into a padded buffer likewise and the f32 value becomes this
// rank's slice.
absl::Status DistributedOptimizer::AllocateParam(ParamState& s) {
  runtime::Backend& b = *backend_;
  model::Param& p = *s.param;
  const int dp = dp_->size(), rank = dp_->rank();
  if (zero_ == 1) {
    if (s.shard * dp == s.n && p.grad.contiguous()) {
      TESSERA_ASSIGN_OR_RETURN(s.grad_padded, p.grad.Reshape({s.n}));
    } else {  // the tail stays zero
      TESSERA_ASSIGN_OR_RETURN(s.grad_padded, b.Empty({s.shard * dp}, DType::kF32));
      TESSERA_RETURN_IF_ERROR(b.Fill(s.grad_padded, 0));
      TESSERA_ASSIGN_OR_RETURN(Tensor head, s.grad_padded.Slice(0, 0, s.n));
      TESSERA_ASSIGN_OR_RETURN(p.grad, head.Reshape(s.shape));
      TESSERA_RETURN_IF_ERROR(model_->MarkGradStale(p));
    }
    TESSERA_ASSIGN_OR_RETURN(s.grad_shard, s.grad_padded.Slice(0, rank * s.shard, s.shard));
  } else {
    TESSERA_ASSIGN_OR_RETURN(s.grad_shard, b.Empty({s.shard}, DType::kF32));
    p.grad = Tensor(), p.grad_stale = false;
  }
  if (p.compute.defined()) {  // mixed precision
    if (s.shard * dp == s.n && p.compute.contiguous()) {
      // No padding: the gather lands in the model's own compute copy.
      TESSERA_ASSIGN_OR_RETURN(s.lowp_padded, p.compute.Reshape({s.n}));
    } else {
      TESSERA_ASSIGN_OR_RETURN(s.lowp_padded, b.Empty({s.shard * dp}, p.compute.dtype()));
      TESSERA_RETURN_IF_ERROR(b.Fill(s.lowp_padded, 0));
      TESSERA_ASSIGN_OR_RETURN(Tensor head, s.lowp_padded.Slice(0, 0, s.n));
      TESSERA_ASSIGN_OR_RETURN(p.compute, head.Reshape(s.shape));
      TESSERA_RETURN_IF_ERROR(model_->RefreshCompute(p));  // casts into the view (same shape: no new buffer)
    }
  }
  if (sliced_) TESSERA_RETURN_IF_ERROR(SliceValue(s));
  return absl::OkStatus();
}

// Compute copies left pending by a load, or by an update no forward gathers (pipelines).
absl::Status DistributedOptimizer::BeginStep() {
  if (compute_pending_ && !LazyComputes()) TESSERA_RETURN_IF_ERROR(GatherComputes());
  if (zero_ >= 2)
    for (ParamState& s : states_) TESSERA_RETURN_IF_ERROR(backend_->Fill(s.grad_shard, 0));
  return absl::OkStatus();
}

// ZeRO-1: the padded gradient reduce-scattered into the rank's chunk of it.
absl::Status DistributedOptimizer::IssueReduce(ParamState& s) {
  return dp_->ReduceScatter(s.grad_padded.data(), s.grad_shard.data(), s.shard, DType::kF32, comm::ReduceOp::kSum);
}

absl::StatusOr<Tensor*> DistributedOptimizer::ReduceGrad(ParamState& s) {
  if (zero_ >= 2) return &s.grad_shard;  // reduced into the slice during the backward
  const bool reduced = s.reduced;
  s.reduced = false;
  if (!reduced) TESSERA_RETURN_IF_ERROR(IssueReduce(s));
  return &s.grad_shard;
}

absl::Status DistributedOptimizer::Update(ParamState& s, const runtime::AdamWParams& hp) {
  int64_t begin, len;
  SliceOf(s, &begin, &len);
  if (sliced_) {  // the slice is the master copy
    s.param->value = Tensor();  // a gathered copy (GatherParams), if any
    // The update's bf16 copy goes straight into this rank's chunk of the whole compute
    // copy, gathered in place from there (half the bytes of the f32 values, no cast).
    s.compute_pending = compute_pending_ = true;
    if (len == 0) return absl::OkStatus();
    TESSERA_ASSIGN_OR_RETURN(Tensor p, s.value_shard.Slice(0, 0, len));
    TESSERA_ASSIGN_OR_RETURN(Tensor lowp, s.lowp_padded.Slice(0, begin, len));
    return UpdateSlice(s, p, len, hp, &lowp);
  }
  // f32: the value is what the model computes with; its updated slices gathered at once.
  TESSERA_ASSIGN_OR_RETURN(Tensor flat, s.param->value.Reshape({s.n}));
  TESSERA_ASSIGN_OR_RETURN(Tensor p, flat.Slice(0, begin, len));
  if (len > 0) TESSERA_RETURN_IF_ERROR(UpdateSlice(s, p, len, hp, nullptr));
  return GatherSlices(s, begin, len);
}

// The compute copies now, or (lazy_gather: a Step's update, whose next forward goes
// through the hooks) a block at a time in the next forward.
absl::Status DistributedOptimizer::FinishUpdate(bool lazy_gather) {
  if (compute_pending_ && !(lazy_gather && LazyComputes())) return GatherComputes();
  return absl::OkStatus();
}

// In whatever mode the DP group is (Acquire: overlap, joined before the compute that
// reads it).
absl::Status DistributedOptimizer::GatherCompute(ParamState& s) {
  if (!s.compute_pending) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(Tensor mine, s.lowp_padded.Slice(0, dp_->rank() * s.shard, s.shard));
  TESSERA_RETURN_IF_ERROR(dp_->AllGather(mine.data(), s.lowp_padded.data(), s.shard, s.lowp_padded.dtype()));
  s.compute_pending = false;
  return absl::OkStatus();
}

absl::Status DistributedOptimizer::GatherComputes() {
  if (!compute_pending_) return absl::OkStatus();
  for (ParamState& s : states_) TESSERA_RETURN_IF_ERROR(GatherCompute(s));
  compute_pending_ = prefetched_ = false;
  return absl::OkStatus();
}

absl::Status DistributedOptimizer::GatherParams() {
  TESSERA_RETURN_IF_ERROR(GatherComputes());
  if (!sliced_) return absl::OkStatus();
  for (ParamState& s : states_) TESSERA_RETURN_IF_ERROR(GatherValue(s, /*refresh_compute=*/false));
  return absl::OkStatus();
}

// Gathered in place where no padding is needed, else through a padded temporary.
absl::Status DistributedOptimizer::GatherSlices(ParamState& s, int64_t begin, int64_t len) {
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

// Sliced values: this rank's chunk of the compute copy from the loaded slice now, the
// others' by the next GatherComputes (every DP rank loads, then gathers).
absl::Status DistributedOptimizer::LoadValue(ParamState& s, const ParamPiece& p) {
  if (!sliced_) return GradSync::LoadValue(s, p);
  s.param->value = Tensor();  // a gathered copy, if any
  TESSERA_RETURN_IF_ERROR(WriteHead(p.value, s.value_shard));
  if (!p.value.empty()) {
    const int64_t len = static_cast<int64_t>(p.value.size());
    TESSERA_ASSIGN_OR_RETURN(Tensor mine, s.value_shard.Slice(0, 0, len));
    TESSERA_ASSIGN_OR_RETURN(Tensor lowp, s.lowp_padded.Slice(0, p.value_begin, len));
    TESSERA_RETURN_IF_ERROR(backend_->Cast(mine, lowp));
  }
  s.compute_pending = compute_pending_ = true;
  return absl::OkStatus();
}

// A Step's update gathered a block at a time: the block's pending copies (unless
// prefetched) joined before it runs, the next block's issued under its compute.
// ZeRO-2's backward also gets each block its gradient buffers.
absl::Status DistributedOptimizer::Acquire(int block, Phase phase) {
  const bool backward = phase == Phase::kBackward;
  if (compute_pending_) {
    bool issued = false;
    TESSERA_RETURN_IF_ERROR(GatherBlockComputes(block, &issued));
    if (issued || prefetched_) TESSERA_RETURN_IF_ERROR(dp_->Join());  // the block's compute waits for its weights
    prefetched_ = false;
    const int next = NextBlock(block, Phase::kForward);  // ahead, under this block's compute
    if (!backward && next >= 0) TESSERA_RETURN_IF_ERROR(GatherBlockComputes(next, &prefetched_));
    if (!backward && next < 0) compute_pending_ = false;  // the forward's last block: all gathered
  }
  if (backward && zero_ >= 2)
    for (model::Param* p : model_->BlockUses(block)) TESSERA_RETURN_IF_ERROR(EnsureGrad(StateOf(p)));
  return absl::OkStatus();
}

absl::Status DistributedOptimizer::GatherBlockComputes(int block, bool* issued) {
  std::vector<ParamState*> todo;
  for (model::Param* p : model_->BlockUses(block))
    if (StateOf(p).compute_pending) todo.push_back(&StateOf(p));
  if (todo.empty()) return absl::OkStatus();
  dp_->SetOverlap(true);
  absl::Status st = Grouped(*dp_, todo.size() > 1, [&] {
    for (ParamState* s : todo) TESSERA_RETURN_IF_ERROR(GatherCompute(*s));
    return absl::OkStatus();
  });
  dp_->SetOverlap(false);
  *issued = true;
  return st;
}

absl::Status DistributedOptimizer::GradsReady(int block) {
  if (zero_ >= 2) return ReduceBlockGrads(block);
  if (!reducing_) return absl::OkStatus();
  std::vector<ParamState*> bucket;  // the block's gradients: one bucket
  for (model::Param* p : model_->BlockOwns(block)) bucket.push_back(&StateOf(p));
  return ReduceEarly(bucket);
}

}  // namespace tessera::engine
