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

float LearningRate(const OptimizerOptions& o, int64_t step) {
  if (o.warmup_steps > 0 && step <= o.warmup_steps) return o.lr * static_cast<float>(step) / o.warmup_steps;
  const int64_t decay = std::max<int64_t>(1, o.total_steps - o.warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup_steps) / decay);
  return static_cast<float>(o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(M_PI * progress)));
}

Trainer::Trainer(model::Llama* model, runtime::Backend* backend, comm::Communicator* dp, comm::Communicator* tp,
                 comm::Communicator* pp, const OptimizerOptions& options)
    : model_(model),
      backend_(backend),
      dp_(dp != nullptr && dp->size() > 1 ? dp : nullptr),
      tp_(tp != nullptr && tp->size() > 1 ? tp : nullptr),
      pp_(pp != nullptr && pp->size() > 1 ? pp : nullptr),
      options_(options) {
  model_->set_defer_loss(true);  // the step's loss read once, after its last backward
}
Trainer::~Trainer() {
  if (sync_ != nullptr && sync_->uses_hooks()) model_->set_hooks(nullptr);
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
  if (!(options.lr > 0) || options.min_lr < 0 || options.min_lr > options.lr)
    return absl::InvalidArgumentError(
        absl::StrCat("trainer: need 0 <= min_lr <= lr and lr > 0, got lr ", options.lr, ", min_lr ", options.min_lr));
  if (options.total_steps < 1 || options.warmup_steps < 0)
    return absl::InvalidArgumentError("trainer: total_steps must be >= 1 and warmup_steps >= 0");
  std::unique_ptr<Trainer> t(new Trainer(model, backend, dp, tp, pp, options));
  TESSERA_ASSIGN_OR_RETURN(t->sync_, GradSync::Create(options.zero, model, backend, t->dp_, t->tp_, t->pp_));
  if (t->sync_->uses_hooks()) model->set_hooks(t->sync_.get());
  return t;
}

void Trainer::AppendStates(std::vector<runtime::Tensor>* out) const {
  model_->AppendStates(out);
  for (const ParamState& s : sync_->states())
    for (const Tensor* t : {&s.m, &s.v, &s.grad_shard, &s.grad_padded, &s.grad_full, &s.value_shard, &s.lowp_shard, &s.lowp_padded})
      out->push_back(*t);
}

absl::Status Trainer::ResetOptimizerState() {
  TESSERA_RETURN_IF_ERROR(sync_->ResetOptimizerState());
  step_ = 0;
  return absl::OkStatus();
}

absl::Status Trainer::AgreeMax(std::vector<int64_t>& values) {
  if (dp_ == nullptr || dp_->size() == 1 || values.empty()) return absl::OkStatus();
  return dp_->AllReduceHost(values.data(), values.data(), values.size(), DType::kI64, comm::ReduceOp::kMax);
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
// gradient buffers are gone by now (GradSync::AccumulatedGrad).
absl::Status Trainer::SumTiedEmbeddingGrads() {
  const int rank = pp_->rank(), last = pp_->size() - 1;
  if (!model_->config().tie_embeddings || (rank != 0 && rank != last)) return absl::OkStatus();
  model::Param* e = model_->Find("model.embed_tokens.weight");
  if (e == nullptr) return absl::InternalError("trainer: a tied first or last stage holds no embedding");
  TESSERA_RETURN_IF_ERROR(model_->FreshenGrad(*e));
  Tensor* grad = sync_->AccumulatedGrad(sync_->states()[static_cast<size_t>(e - model_->params().data())]);
  TESSERA_ASSIGN_OR_RETURN(Tensor mine, backend_->Empty(grad->shape(), DType::kF32));
  TESSERA_ASSIGN_OR_RETURN(Tensor theirs, backend_->Empty(grad->shape(), DType::kF32));
  TESSERA_RETURN_IF_ERROR(backend_->Axpby(1.f, *grad, 0.f, mine));
  const int other = rank == 0 ? last : 0;
  TESSERA_RETURN_IF_ERROR(pp_->Isend(mine.data(), mine.numel(), DType::kF32, other, 2));
  TESSERA_RETURN_IF_ERROR(pp_->RecvTagged(theirs.data(), theirs.numel(), DType::kF32, other, 2));
  TESSERA_RETURN_IF_ERROR(pp_->WaitSends());
  return backend_->Axpby(1.f, theirs, 1.f, *grad);
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

// Reduces gradients over DP (GradSync::ReduceGrad) and returns the global gradient norm:
// squares summed over this rank's (slice of the) gradients, over DP when sliced, and over
// TP for TP-sharded parameters (replicated ones are the same on every TP rank and counted
// once).
absl::StatusOr<double> Trainer::ReduceGradsAndNorm() {
  runtime::Backend& b = *backend_;
  TESSERA_ASSIGN_OR_RETURN(Tensor sq, b.Empty({2}, DType::kF32));  // [TP-sharded, replicated]
  TESSERA_RETURN_IF_ERROR(b.Fill(sq, 0));
  TESSERA_ASSIGN_OR_RETURN(Tensor sq_sharded, sq.Slice(0, 0, 1));
  TESSERA_ASSIGN_OR_RETURN(Tensor sq_repl, sq.Slice(0, 1, 1));
  for (ParamState& s : sync_->states()) {
    TESSERA_RETURN_IF_ERROR(model_->FreshenGrad(*s.param));  // one no write reached this step
    TESSERA_ASSIGN_OR_RETURN(Tensor * g, sync_->ReduceGrad(s));
    // The last stage's copy of a tied embedding: reduced, counted on the first stage.
    if (!s.norm_elsewhere) TESSERA_RETURN_IF_ERROR(b.SumSquares(*g, s.tp_sharded ? sq_sharded : sq_repl));
  }
  if (sync_->norm_over_dp()) TESSERA_RETURN_IF_ERROR(dp_->AllReduce(sq.data(), sq.data(), 2, DType::kF32, comm::ReduceOp::kSum));
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
  for (ParamState& s : sync_->states()) {
    runtime::AdamWParams hp{lr, options_.beta1, options_.beta2, options_.eps, s.decay ? options_.weight_decay : 0.f,
                            step_, clip_scale};  // clipping fused into AdamW's read of the gradient
    TESSERA_RETURN_IF_ERROR(sync_->Update(s, hp));
  }
  return sync_->FinishUpdate(lazy_gather);
}

absl::Status Trainer::BeginStep(const std::vector<model::TokenBatch>& micro_batches) {
  model_->DropPendingLoss();  // a failed step's, if any
  for (const model::TokenBatch& mb : micro_batches) TESSERA_RETURN_IF_ERROR(model_->PrepareKernels(mb));
  TESSERA_RETURN_IF_ERROR(model_->ZeroGrads());
  return sync_->BeginStep();
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
  // What the last micro-batch's reduction needs planned (host collectives: the device goes
  // on with the last update).
  if (pp_ == nullptr) TESSERA_RETURN_IF_ERROR(sync_->PlanStep(micro_batches));
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
      const bool last = i + 1 == micro_batches.size() && sync_->reduces_in_last_backward();
      if (last) sync_->set_reducing(true), dp_->SetOverlap(true);
      absl::StatusOr<model::LossSum> l = model_->ForwardBackward(micro_batches[i], scale);
      if (last) {
        sync_->set_reducing(false);
        dp_->SetOverlap(false);
        absl::Status joined = l.status();
        if (joined.ok()) {  // marks around the join: the compute stream's wait for the reduction
          backend_->ClearMarks();
          TESSERA_ASSIGN_OR_RETURN(wait_marks_[0], backend_->Mark());
          joined = dp_->Join();
          if (joined.ok()) {
            TESSERA_ASSIGN_OR_RETURN(wait_marks_[1], backend_->Mark());
          }
        }
        absl::Status finished = sync_->FinishLastBackward(joined.ok());
        TESSERA_RETURN_IF_ERROR(joined);
        TESSERA_RETURN_IF_ERROR(finished);
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
