// One rank's optimizer step (docs/design.md §6): gradient accumulation over micro-batches, data-
// parallel gradient reduction, the global gradient norm across data- and tensor-parallel
// ranks and clipping, warmup + cosine learning rate, AdamW on fp32 state. The ZeRO stage
// picks how the DP (x CP) ranks share gradients, parameters and optimizer state — one
// strategy class each (grad_sync.h): DataParallelSync (0), DistributedOptimizer (1, 2),
// FullyShardedSync (3). With one DP rank every stage is stage 0.
// Bytes kept per rank between steps, for Φ parameters over N ranks under mixed precision:
// 18Φ (0), 6Φ + 12Φ/N (1), 2Φ + 16Φ/N (2), 18Φ/N (3) — plus padding to a multiple of N
// per parameter; ZeRO-2/3 add a block's gradient buffers (and ZeRO-3 its gathered
// weights) while it runs (common/plan counts them).
//
// The loss is a token mean over the global batch: every micro-batch's gradient is
// scaled by 1 / (target tokens of the whole global batch, summed over data-parallel
// ranks), so any split of the batch over ranks and micro-batches gives the same update.
//
// Threading: one thread (the model's backend thread).
#pragma once

#include <cstdint>
#include <array>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/rl.h"
#include "worker/comm/communicator.h"
#include "common/parallel/pipeline.h"
#include "worker/model/llama.h"
#include "worker/runtime/backend.h"
#include "worker/train/grad_sync.h"

namespace tessera::engine {

struct OptimizerOptions {
  float lr = 3e-4f;
  float min_lr = 3e-5f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;  // cosine decay ends here
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  float clip_norm = 1.0f;  // <= 0: no clipping
  int zero = 0;            // ZeRO stage, 0-3 (above)
  parallel::Schedule schedule = parallel::Schedule::kOneFOneB;  // pipeline schedule (pp > 1; vpp > 1 interleaves 1F1B)
};

// Learning rate at a 1-based step: linear warmup to lr, then cosine to min_lr.
float LearningRate(const OptimizerOptions& o, int64_t step);

struct StepStats {
  double loss = 0;       // token mean over the global batch
  double grad_norm = 0;  // before clipping
  float lr = 0;
  int64_t tokens = 0;  // target tokens of the global batch
  // Pipelines (pp > 1): this rank's schedule in seconds — all of it, and the part inside
  // its operations' compute (outside receives, sends and the final wait for the sends),
  // from timing marks on the backend's stream (Backend::Mark: CUDA events on GPUs, where
  // the host only enqueues; the host clock on the CPU).
  // The bubble of a step: the slowest stage's pipeline_s over the stages' mean busy time,
  // minus 1 — (pp - 1) / (vpp * micro-batches) for balanced stages and free transfers.
  double pipeline_s = 0, pipeline_busy_s = 0;
  // DP without a pipeline (ZeRO-0/1, gradients reduced during the last backward): how
  // long the compute stream waited after that backward for the reduction to finish —
  // the part of the gradient reduction the backward did not hide (0 on blocking backends).
  double dp_wait_s = 0;
};

class Trainer {
 public:
  // dp: the gradient-reduction group (DP x CP), tp: the model's tensor-parallel group,
  // pp: the pipeline group (the model is then this rank's stage; each may be null for
  // one rank). Pipelines: every stage gets all micro-batches of the DP rank; the schedule
  // runs them with asynchronous sends of activations and gradients; the loss (from the
  // last stage), the gradient norm and a tied embedding's gradient (first + last stage)
  // are reduced over pp (under ZeRO-2/3 the tied embedding's DP-reduced slices).
  // The trainer turns on the model's Llama::set_defer_loss while it lives (a step's loss
  // stays on the device until the step reads it once); the model must outlive it.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(model::Llama* model, runtime::Backend* backend,
                                                         comm::Communicator* dp, comm::Communicator* tp,
                                                         const OptimizerOptions& options,
                                                         comm::Communicator* pp = nullptr);
  ~Trainer();
  // One optimizer step over this rank's micro-batches of the global batch.
  absl::StatusOr<StepStats> Step(const std::vector<model::TokenBatch>& micro_batches);
  // RL: one optimizer step of the actor on the policy loss (common/rl.h) over this rank's
  // micro-batches of a mini-batch (source: policy_step.cc). `tokens[i]` holds micro-batch
  // i's per-token inputs, aligned with its tokens (entry t: the target of token t): old
  // log-probs, advantages, the mask (1: a response token that counts) and, with a KL
  // term, the reference's log-probs. The loss aggregates the whole mini-batch's (all DP
  // ranks) token losses as options.aggregation says (rl::LossAggregation: token mean by
  // default; the per-response modes read each micro-batch's cu_seqlens, one response per
  // sequence). Gradients, clipping, LR and the update as Step.
  // With options.entropy_coef > 0 the entropy bonus's gradient goes through the softmax
  // (Llama::TokenGrads::dentropy). PolicyStats::entropy is the token mean of the
  // predictive entropy over the mask, with or without the bonus. Not with pipelines yet.
  // With options.tis_cap > 0, rollout_logp (the rollout engine's log-probs of the sampled
  // tokens) gives each token its truncated importance weight (rl::TisWeight).
  struct PolicyTokens {
    std::vector<double> old_logp, advantage, mask, ref_logp, rollout_logp;
  };
  struct PolicyStats {
    double loss = 0, pg_loss = 0;  // as aggregated
    double kl = 0, clip_fraction = 0, entropy = 0;  // weighted means (token means under token_mean)
    double tis_weight = 0;  // options.tis_cap > 0: the importance weights' token mean
    double grad_norm = 0;
    float lr = 0;
    int64_t tokens = 0;  // counted (masked) tokens of the mini-batch, all DP ranks
  };
  absl::StatusOr<PolicyStats> PolicyStep(const std::vector<model::TokenBatch>& micro_batches,
                                         const std::vector<PolicyTokens>& tokens, const rl::PolicyLossOptions& options);
  // PPO's critic (the model has a value head, LlamaConfig::value_head): one optimizer step
  // on the clipped value loss (rl::ComputeValueLoss, clip <= 0: none) over this rank's
  // micro-batches of a mini-batch; `tokens[i]` holds micro-batch i's old values, returns
  // and mask per token (entry t: token t's value). Token mean over the mask of the whole
  // mini-batch (all DP ranks); gradients, clipping, LR and the update as Step. Not with
  // pipelines.
  struct ValueTokens {
    std::vector<double> old_value, returns, mask;
  };
  struct ValueStats {
    double loss = 0, clip_fraction = 0, value = 0;  // token means (value: before the step)
    double grad_norm = 0;
    float lr = 0;
    int64_t tokens = 0;
  };
  absl::StatusOr<ValueStats> ValueStep(const std::vector<model::TokenBatch>& micro_batches,
                                       const std::vector<ValueTokens>& tokens, double clip);
  int64_t step() const { return step_; }
  // Each entry replaced by its largest value over the data-parallel group (with CP, the
  // DP x CP group); every rank of it must call it. RL's micro-batch counts.
  absl::Status AgreeMax(std::vector<int64_t>& values);
  // Sliced values (values_sliced()): gathers every parameter's f32 value onto the model
  // (Param::value, for Llama::GatherGlobal, weight sync, digests and exports) and any
  // compute copy still pending; the next update frees the values again. Otherwise only
  // the pending compute copies. Every rank of the DP group must call it.
  absl::Status GatherParams() { return sync_->GatherParams(); }
  // ZeRO-1/2 under mixed precision: the compute copies gathered from the ranks' updated
  // slices where still pending (Step leaves them to the next forward, LoadPiece to the
  // next step or this call); a no-op otherwise. Every rank of the DP group must call it
  // before the model computes outside a step.
  absl::Status GatherComputes() { return sync_->GatherComputes(); }
  // Whether a rank keeps only its slice of the f32 values between steps: ZeRO-3, and
  // ZeRO-1/2 under mixed precision (ReadPiece / LoadPiece then take the slice).
  bool values_sliced() const { return sync_->values_sliced(); }

  // Checkpoints (worker/checkpoint): parameter i (the model's order) as this rank holds it
  // (ParamPiece: the value's and the moments' elements, no padding); which elements those
  // are; and setting them from exactly those ranges (INVALID_ARGUMENT naming the
  // parameter otherwise).
  using Piece = ::tessera::engine::ParamPiece;
  using PieceSlices = ::tessera::engine::PieceSlices;
  absl::StatusOr<Piece> ReadPiece(size_t i) { return sync_->ReadPiece(i); }
  PieceSlices SlicesOf(size_t i) const { return sync_->SlicesOf(i); }
  absl::Status LoadPiece(size_t i, const Piece& p) { return sync_->LoadPiece(i, p); }
  void set_step(int64_t step) { step_ = step; }
  // Zeroes the AdamW moments and the step count: a fresh optimizer on the current
  // weights (an RL job's warm start from an SFT checkpoint).
  absl::Status ResetOptimizerState();
  int zero() const { return sync_->zero(); }  // the effective stage (0 with one DP rank)
  runtime::Backend* backend() const { return backend_; }
  // Everything the model and the optimizer keep between steps — the model's parameter
  // tensors (Llama::AppendStates), AdamW's moments, the ZeRO stage's gradient and value
  // buffers —: what an idle group offloads between its calls (runtime::HostOffload).
  void AppendStates(std::vector<runtime::Tensor>* out) const;

 private:
  Trainer(model::Llama* model, runtime::Backend* backend, comm::Communicator* dp, comm::Communicator* tp,
          comm::Communicator* pp, const OptimizerOptions& options);
  absl::StatusOr<double> RunPipeline(const std::vector<model::TokenBatch>& micro_batches, float scale);
  // A step's start, before any collective of its own: kernels readied for these
  // micro-batches (model::Llama::PrepareKernels) and gradients zeroed.
  absl::Status BeginStep(const std::vector<model::TokenBatch>& micro_batches);
  // `also` (at most 2 of this rank's values, e.g. its share of the loss's denominator)
  // become the group's sums, reduced in one collective with the masks' (returned).
  absl::StatusOr<float> BeginMaskedStep(const char* who, const std::vector<model::TokenBatch>& micro_batches,
                                        const std::vector<const std::vector<double>*>& masks, float* also = nullptr,
                                        int n_also = 0);
  // The step's end: gradients reduced, their norm, clipping, the LR and the update
  // (lazy_gather: Step's, see GradSync::FinishUpdate).
  absl::Status FinishStep(StepStats& stats, bool lazy_gather = false);
  absl::Status PipelineTimes(StepStats* stats);
  absl::Status SumTiedEmbeddingGrads();
  absl::Status AllReduceHost(comm::Communicator* c, float* values, int n);
  absl::StatusOr<int64_t> GlobalTokens(const std::vector<model::TokenBatch>& micro_batches);
  absl::StatusOr<double> ReduceGradsAndNorm();
  absl::Status Update(float lr, float clip_scale, bool lazy_gather);

  model::Llama* model_;
  runtime::Backend* backend_;
  comm::Communicator* dp_;  // null: one data-parallel rank
  comm::Communicator* tp_;
  comm::Communicator* pp_;  // null: one stage
  OptimizerOptions options_;
  std::unique_ptr<GradSync> sync_;
  std::vector<int> pipe_marks_;  // RunPipeline's timing marks: start, (before, after) per op, end
  std::array<int, 2> wait_marks_{-1, -1};  // around the join of the DP reduction (StepStats::dp_wait_s)
  int64_t step_ = 0;
};

}  // namespace tessera::engine
