// How a trainer's data-parallel (DP x CP) ranks share gradients, parameters and optimizer
// state: one strategy per ZeRO stage, as Megatron (DistributedDataParallel, the
// distributed optimizer) and torch (DDP, FSDP) keep them apart. engine::Trainer runs the
// step (micro-batches, pipeline, loss, gradient norm, learning rate) and asks its
// strategy to allocate each parameter's state, reduce gradients, update and gather:
//   DataParallelSync      ZeRO-0 (DDP): gradients all-reduced, state replicated;
//   DistributedOptimizer  ZeRO-1: optimizer state (and, under mixed precision, the f32
//                         master weights) sharded, gradients reduce-scattered after the
//                         last micro-batch; ZeRO-2: the gradients sharded too, each
//                         block's reduce-scattered as soon as its backward is done;
//   FullyShardedSync      ZeRO-3 (FSDP): the parameters too, gathered a block at a time.
// A rank owns the same contiguous slice [rank * shard, (rank + 1) * shard) of every
// flattened (TP-local) parameter, padded so that every rank's slice has the same size.
// A strategy is the model's ParamHooks where it needs them (uses_hooks): the model calls
// them around each block (worker/model/llama.h).
//
// Threading: one thread (the model's backend thread), as the trainer.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/comm/communicator.h"
#include "worker/model/llama.h"
#include "worker/runtime/backend.h"

namespace tessera::engine {

// One parameter's optimizer state and the buffers of its sharing. [shard * dp] buffers
// are padded (the padding is zero); a rank's chunk of one is where its collectives run in
// place (reduce-scatter into the chunk, all-gather from it).
struct ParamState {
  model::Param* param = nullptr;
  std::vector<int64_t> shape;  // the parameter's local (TP-sharded) shape
  int64_t n = 0, shard = 0;    // elements; this rank's slice (n without ZeRO)
  runtime::Tensor m, v;        // AdamW's moments: [shard]
  // [shard] with ZeRO: this rank's slice of the reduced gradient — ZeRO-1: its chunk of
  // grad_padded (reduce-scattered in place); ZeRO-2/3: a buffer the micro-batches'
  // slices are added into.
  runtime::Tensor grad_shard;
  runtime::Tensor grad_padded;  // [shard * dp], ZeRO-1: the gradient (Param::grad is its head)
  runtime::Tensor grad_full;    // [shard * dp], ZeRO-2/3: the gradient buffer while a block's backward runs
  // [shard], with sliced values (ZeRO-3; ZeRO-1/2 under mixed precision): this rank's
  // slice of the f32 master weights, the only f32 copy kept between steps.
  runtime::Tensor value_shard;
  runtime::Tensor lowp_shard;  // [shard], ZeRO-3 under mixed precision: the slice's compute copy (what is gathered)
  // [shard * dp], ZeRO-1/2 under mixed precision: the whole compute copy (Param::compute
  // itself where nothing needs padding, else a buffer whose head Param::compute is);
  // AdamW writes the rank's updated slice into its chunk, all-gathered in place.
  runtime::Tensor lowp_padded;
  bool compute_pending = false;  // lowp_padded's other chunks not gathered since the update
  bool decay = true;             // weight decay (not for norms and biases: 1-D parameters)
  bool reduced = false;          // ZeRO-0/1: reduced during the backward of this step's last micro-batch
  bool tp_sharded = false;      // split over TP (its squares summed over TP in the norm)
  bool norm_elsewhere = false;  // counted on another rank: a tied embedding's last-stage copy, a KV replica
};

// Parameter i (the model's order) as a rank holds it: `value` is elements
// [value_begin, value_begin + value.size()) of the flattened TP-local tensor (sliced
// values: the rank's slice, else all of it), the AdamW moments m and v elements
// [state_begin, ...) (ZeRO >= 1: the slice, else all of it); no padding.
struct ParamPiece {
  int64_t value_begin = 0, state_begin = 0;
  std::vector<float> value, m, v;
};
struct PieceSlices {
  int64_t n = 0, value_begin = 0, value_len = 0, state_begin = 0, state_len = 0;
};

class GradSync : public model::ParamHooks {
 public:
  // dp: the gradient-reduction group (null: one rank, then every stage is ZeRO-0); tp and
  // pp as the trainer's (null for one rank). Allocates every parameter's state; sliced
  // values start from the model's full values (as initialized or loaded).
  static absl::StatusOr<std::unique_ptr<GradSync>> Create(int zero, model::Llama* model, runtime::Backend* backend,
                                                         comm::Communicator* dp, comm::Communicator* tp,
                                                         comm::Communicator* pp);
  ~GradSync() override;
  int zero() const { return zero_; }
  // Whether a rank keeps only its slice of the f32 values between steps.
  bool values_sliced() const { return sliced_; }
  // Whether the model's blocks call this strategy's hooks (Llama::set_hooks).
  virtual bool uses_hooks() const = 0;
  std::vector<ParamState>& states() { return states_; }

  // A step's start, after the model's gradients are zeroed: what the strategy resets.
  virtual absl::Status BeginStep();
  // Step only, after BeginStep, before any micro-batch: what the last micro-batch's
  // reduction needs planned (host collectives that run under the last step's update).
  virtual absl::Status PlanStep(const std::vector<model::TokenBatch>& /*micro_batches*/) { return absl::OkStatus(); }
  // Whether the last micro-batch's backward reduces each block's gradients as it goes
  // (ZeRO-0/1 without a pipeline); set_reducing brackets that backward, and after the DP
  // group's join FinishLastBackward(joined) completes it.
  virtual bool reduces_in_last_backward() const { return false; }
  void set_reducing(bool on) { reducing_ = on; }
  virtual absl::Status FinishLastBackward(bool /*joined*/) { return absl::OkStatus(); }
  // Where parameter s's gradient is after the backward (before ReduceGrad): the model's
  // gradient, or (ZeRO-2/3) this rank's reduced slice.
  virtual runtime::Tensor* AccumulatedGrad(ParamState& s) { return &s.param->grad; }
  // After the backward, with s's gradient freshened (Llama::FreshenGrad, by the caller):
  // s's gradient reduced over DP (if the backward did not already)
  // and what this rank counts of it in the gradient norm — the whole gradient, or its
  // slice (then the squares are summed over DP: norm_over_dp()).
  virtual absl::StatusOr<runtime::Tensor*> ReduceGrad(ParamState& s) = 0;
  bool norm_over_dp() const { return zero_ > 0; }
  // AdamW on what this rank updates of s (clipping fused in hp.grad_scale); then
  // FinishUpdate: gathers what the next forward needs (lazy_gather: a Step's update,
  // whose next forward may gather it a block at a time through the hooks).
  virtual absl::Status Update(ParamState& s, const runtime::AdamWParams& hp) = 0;
  virtual absl::Status FinishUpdate(bool /*lazy_gather*/) { return absl::OkStatus(); }
  // See Trainer::GatherParams / GatherComputes.
  virtual absl::Status GatherParams() { return absl::OkStatus(); }
  virtual absl::Status GatherComputes() { return absl::OkStatus(); }

  // Checkpoints: what this rank holds of parameter i (Trainer::ReadPiece and friends).
  absl::StatusOr<ParamPiece> ReadPiece(size_t i);
  PieceSlices SlicesOf(size_t i) const;
  absl::Status LoadPiece(size_t i, const ParamPiece& p);
  absl::Status ResetOptimizerState();

  // ParamHooks: nothing by default.
  absl::Status Acquire(int, Phase) override { return absl::OkStatus(); }
  absl::Status Release(int, Phase) override { return absl::OkStatus(); }
  absl::Status GradsReady(int) override { return absl::OkStatus(); }

 protected:
  GradSync(int zero, model::Llama* model, runtime::Backend* backend, comm::Communicator* dp, comm::Communicator* tp,
           comm::Communicator* pp);
  // The stage's buffers of one parameter (m and v are made; sliced values still whole).
  virtual absl::Status AllocateParam(ParamState& s) = 0;
  // LoadPiece's value part: whole values by default.
  virtual absl::Status LoadValue(ParamState& s, const ParamPiece& p);
  // This rank's slice of s: [begin, begin + len) of its n elements.
  void SliceOf(const ParamState& s, int64_t* begin, int64_t* len) const;
  // Copies the rank's slice of the whole value into value_shard and frees the value.
  absl::Status SliceValue(ParamState& s);
  // Writes `src` into the head of t, zeroing the rest.
  absl::Status WriteHead(const std::vector<float>& src, runtime::Tensor& t);
  // AdamW on `p` (len elements of this rank's slice) with the gradient slice; `lowp`:
  // the slice's compute copy AdamW writes too, if any.
  absl::Status UpdateSlice(ParamState& s, runtime::Tensor& p, int64_t len, const runtime::AdamWParams& hp,
                           runtime::Tensor* lowp);
  // Sliced values: the whole f32 value of one parameter from every rank's slice (no-op
  // when present); refresh_compute: its compute copy from it too.
  absl::Status GatherValue(ParamState& s, bool refresh_compute);
  // ZeRO-2/3: a padded gradient buffer for a block's backward (no-op when present).
  absl::Status EnsureGrad(ParamState& s);
  // ZeRO-2/3: one block's gradients of this micro-batch, reduce-scattered in place (one
  // NCCL group), added into the rank's slices; the full buffers freed.
  absl::Status ReduceBlockGrads(int block);
  // ZeRO-0/1: the last micro-batch's reduction of one block's gradients (a bucket) as one
  // NCCL group: the compute-stream preparation first, then the collectives (IssueReduce).
  absl::Status ReduceEarly(const std::vector<ParamState*>& bucket);
  virtual absl::Status IssueReduce(ParamState& /*s*/) { return absl::OkStatus(); }
  ParamState& StateOf(const model::Param* p);
  int NextBlock(int block, Phase phase) const;

  const int zero_;
  bool sliced_ = false;
  model::Llama* model_;
  runtime::Backend* backend_;
  comm::Communicator* dp_;  // null: one rank
  comm::Communicator* tp_;
  comm::Communicator* pp_;
  std::vector<ParamState> states_;  // in the model's order
  bool reducing_ = false;  // the last micro-batch's backward (reduces_in_last_backward)

 private:
  absl::Status Allocate();
};

// ZeRO-0 (DDP). With DP and no pipeline the last micro-batch's backward all-reduces each
// block's gradients as soon as the block is done (one bucket per block, overlapped with
// the backward of the blocks below on NCCL), and the embedding's gradient right after
// the LM head's backward, that micro-batch's embedding rows going round compacted
// (data_parallel_sync.cc: EmbeddingRows).
class DataParallelSync final : public GradSync {
 public:
  DataParallelSync(model::Llama* model, runtime::Backend* backend, comm::Communicator* dp, comm::Communicator* tp,
                   comm::Communicator* pp);
  ~DataParallelSync() override;
  bool uses_hooks() const override { return dp_ != nullptr && pp_ == nullptr; }
  absl::Status PlanStep(const std::vector<model::TokenBatch>& micro_batches) override;
  bool reduces_in_last_backward() const override { return uses_hooks(); }
  absl::Status FinishLastBackward(bool joined) override;
  absl::StatusOr<runtime::Tensor*> ReduceGrad(ParamState& s) override;
  absl::Status Update(ParamState& s, const runtime::AdamWParams& hp) override;
  absl::Status GradsReady(int block) override;
  absl::StatusOr<bool> TakeEmbeddingRows(const runtime::Tensor& ids, const runtime::Tensor& dout,
                                         int64_t vocab_start) override;

 private:
  struct EmbeddingRows;
  absl::Status AllocateParam(ParamState&) override { return absl::OkStatus(); }
  absl::Status IssueReduce(ParamState& s) override;
  model::Param* EarlyEmbedding() const;  // the embedding while rows_ is planned, else null
  std::unique_ptr<EmbeddingRows> rows_;  // during a Step's last micro-batch
};

// ZeRO-1 and ZeRO-2 (the distributed optimizer). Under mixed precision the f32 master
// weights are optimizer state too: a rank keeps only its slice of them and the whole
// bf16 compute copy, into whose chunk AdamW writes the updated slice; the chunks are
// all-gathered in place — after a Step by the next forward a block at a time (the next
// block's ahead, under the current one's compute), else at once. In f32 the value is what
// the model computes with: it stays whole and its updated slices are gathered at once.
class DistributedOptimizer final : public GradSync {
 public:
  DistributedOptimizer(int zero, model::Llama* model, runtime::Backend* backend, comm::Communicator* dp,
                       comm::Communicator* tp, comm::Communicator* pp);
  bool uses_hooks() const override { return zero_ >= 2 || pp_ == nullptr; }
  absl::Status BeginStep() override;
  bool reduces_in_last_backward() const override { return zero_ == 1 && pp_ == nullptr; }
  runtime::Tensor* AccumulatedGrad(ParamState& s) override { return zero_ >= 2 ? &s.grad_shard : &s.param->grad; }
  absl::StatusOr<runtime::Tensor*> ReduceGrad(ParamState& s) override;
  absl::Status Update(ParamState& s, const runtime::AdamWParams& hp) override;
  absl::Status FinishUpdate(bool lazy_gather) override;
  absl::Status GatherParams() override;
  absl::Status GatherComputes() override;
  absl::Status Acquire(int block, Phase phase) override;
  absl::Status GradsReady(int block) override;

 private:
  absl::Status AllocateParam(ParamState& s) override;
  absl::Status LoadValue(ParamState& s, const ParamPiece& p) override;
  absl::Status IssueReduce(ParamState& s) override;
  // Whether pending compute copies are left to the next forward (the hooks gather them
  // a block at a time): no pipeline.
  bool LazyComputes() const { return pp_ == nullptr; }
  absl::Status GatherCompute(ParamState& s);
  // One block's pending compute copies as one NCCL group, in overlap mode.
  absl::Status GatherBlockComputes(int block, bool* issued);
  // In f32: the value from every rank's updated slice (len elements at begin).
  absl::Status GatherSlices(ParamState& s, int64_t begin, int64_t len);
  bool compute_pending_ = false;  // some ParamState::compute_pending is set
  bool prefetched_ = false;       // Acquire issued the next block's gathers
};

// ZeRO-3 (FSDP): the slice is the only copy of a parameter between steps; a block's
// parameters (their bf16 compute copies under mixed precision: half the bytes, no cast)
// are all-gathered before its forward and its backward — the next block's one ahead, on
// the DP stream under this block's compute — and freed after unless the next block uses
// them; the embedding's backward gathers none. Each block's gradients are
// reduce-scattered into the slices as soon as its backward is done.
class FullyShardedSync final : public GradSync {
 public:
  FullyShardedSync(model::Llama* model, runtime::Backend* backend, comm::Communicator* dp, comm::Communicator* tp,
                   comm::Communicator* pp);
  bool uses_hooks() const override { return true; }
  absl::Status BeginStep() override;
  runtime::Tensor* AccumulatedGrad(ParamState& s) override { return &s.grad_shard; }
  absl::StatusOr<runtime::Tensor*> ReduceGrad(ParamState& s) override { return &s.grad_shard; }
  absl::Status Update(ParamState& s, const runtime::AdamWParams& hp) override;
  absl::Status GatherParams() override;
  absl::Status Acquire(int block, Phase phase) override;
  absl::Status Release(int block, Phase phase) override;
  absl::Status GradsReady(int block) override { return ReduceBlockGrads(block); }

 private:
  absl::Status AllocateParam(ParamState& s) override;
  absl::Status LoadValue(ParamState& s, const ParamPiece& p) override;
  // What a block's forward and backward multiply with, gathered (prefetchable).
  absl::Status GatherForCompute(ParamState& s);
  absl::Status GatherBlock(int block);
};

}  // namespace tessera::engine
