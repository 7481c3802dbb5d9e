// ZeRO-3 (grad_sync.h: FullyShardedSync).
#include <algorithm>

#include "common/status.h"
#include "worker/train/grad_sync.h"
#include "worker/train/grouped.h"

namespace tessera::engine {
using runtime::Tensor;

FullyShardedSync::FullyShardedSync(model::Llama* model, runtime::Backend* backend, comm::Communicator* dp,
                                   comm::Communicator* tp, comm::Communicator* pp)
    : GradSync(3, model, backend, dp, tp, pp) {}

// Each rank keeps its slice of the value (and, under mixed precision, the slice's compute
// copy) and frees the rest; the gradient buffers are made per block (EnsureGrad).
absl::Status FullyShardedSync::AllocateParam(ParamState& s) {
  runtime::Backend& b = *backend_;
  model::Param& p = *s.param;
  TESSERA_ASSIGN_OR_RETURN(s.grad_shard, b.Empty({s.shard}, DType::kF32));
  TESSERA_RETURN_IF_ERROR(SliceValue(s));
  if (p.compute.defined()) {  // mixed precision
    TESSERA_ASSIGN_OR_RETURN(s.lowp_shard, b.Empty({s.shard}, p.compute.dtype()));
    TESSERA_RETURN_IF_ERROR(b.Cast(s.value_shard, s.lowp_shard));
  }
  p.compute = Tensor();
  p.grad = Tensor(), p.grad_stale = false;
  return absl::OkStatus();
}

absl::Status FullyShardedSync::BeginStep() {
  for (ParamState& s : states_) TESSERA_RETURN_IF_ERROR(backend_->Fill(s.grad_shard, 0));
  return absl::OkStatus();
}

absl::Status FullyShardedSync::Update(ParamState& s, const runtime::AdamWParams& hp) {
  s.param->value = Tensor();  // gathered again when a block needs it
  s.param->compute = Tensor();
  int64_t begin, len;
  SliceOf(s, &begin, &len);
  if (len == 0) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(Tensor p, s.value_shard.Slice(0, 0, len));
  Tensor lowp;
  if (s.lowp_shard.defined()) {
    TESSERA_ASSIGN_OR_RETURN(lowp, s.lowp_shard.Slice(0, 0, len));
  }
  return UpdateSlice(s, p, len, hp, lowp.defined() ? &lowp : nullptr);
}

absl::Status FullyShardedSync::GatherParams() {
  for (ParamState& s : states_) TESSERA_RETURN_IF_ERROR(GatherValue(s, /*refresh_compute=*/true));
  return absl::OkStatus();
}

absl::Status FullyShardedSync::LoadValue(ParamState& s, const ParamPiece& p) {
  s.param->value = Tensor();
  s.param->compute = Tensor();
  TESSERA_RETURN_IF_ERROR(WriteHead(p.value, s.value_shard));
  if (s.lowp_shard.defined()) TESSERA_RETURN_IF_ERROR(backend_->Cast(s.value_shard, s.lowp_shard));
  return absl::OkStatus();
}

// Under mixed precision the bf16 compute copy, gathered from the bf16 slices (half the
// bytes of the f32 values, and no cast), else the f32 value. GatherBlock issues a block's
// gathers as one group with the DP group in overlap mode; Acquire joins before the
// compute that reads them, so a prefetch runs under the current block's compute.
absl::Status FullyShardedSync::GatherForCompute(ParamState& s) {
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

absl::Status FullyShardedSync::GatherBlock(int block) {
  const auto& uses = model_->BlockUses(block);
  dp_->SetOverlap(true);
  absl::Status st = Grouped(*dp_, uses.size() > 1, [&] {
    for (model::Param* p : uses) TESSERA_RETURN_IF_ERROR(GatherForCompute(StateOf(p)));
    return absl::OkStatus();
  });
  dp_->SetOverlap(false);
  return st;
}

// The block's weights (no-op when prefetched), then the next block's in the same
// direction; the embedding's backward needs none. In the backward, its gradient buffers.
absl::Status FullyShardedSync::Acquire(int block, Phase phase) {
  const bool backward = phase == Phase::kBackward;
  if (!(backward && block == 0)) {
    TESSERA_RETURN_IF_ERROR(GatherBlock(block));
    TESSERA_RETURN_IF_ERROR(dp_->Join());  // the block's compute waits for its weights
    const int next = NextBlock(block, phase);
    if (next >= 0 && !(backward && next == 0)) TESSERA_RETURN_IF_ERROR(GatherBlock(next));
  }
  if (backward)
    for (model::Param* p : model_->BlockUses(block)) TESSERA_RETURN_IF_ERROR(EnsureGrad(StateOf(p)));
  return absl::OkStatus();
}

// What the next block in the same direction does not use is freed.
absl::Status FullyShardedSync::Release(int block, Phase phase) {
  const int next = NextBlock(block, phase);
  for (model::Param* p : model_->BlockUses(block)) {
    if (next >= 0) {
      const auto& keep = model_->BlockUses(next);
      if (std::find(keep.begin(), keep.end(), p) != keep.end()) continue;
    }
    p->value = Tensor();
    p->compute = Tensor();
  }
  return absl::OkStatus();
}

}  // namespace tessera::engine
