#include "worker/engine/trainer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tessera::engine {
using runtime::DType;
using runtime::Tensor;

float LearningRate(const OptimizerOptions& o, int64_t step) {
  if (o.warmup_steps > 0 && step <= o.warmup_steps) return o.lr * static_cast<float>(step) / o.warmup_steps;
  const int64_t decay = std::max<int64_t>(1, o.total_steps - o.warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup_steps) / decay);
  return static_cast<float>(o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(M_PI * progress)));
}

// Optimizer state of one parameter. ZeRO: this DP rank owns elements
// [rank * shard, rank * shard + shard) of the flattened (local, TP-sharded) parameter,
// padded so that every rank's shard has the same size.
struct Trainer::State {
  int64_t n = 0, shard = 0;
  Tensor m, v;        // [shard] with ZeRO, else [n]
  Tensor grad_shard;  // [shard] with ZeRO
  Tensor padded;      // [shard * dp] with ZeRO: the flat gradient / the gathered parameter
  Tensor stage;       // [shard] with ZeRO: this rank's updated parameter slice
  bool decay = true;  // weight decay (not for norms and biases: 1-D parameters)
  bool tp_sharded = false;
};

Trainer::Trainer(model::Llama* model, runtime::Backend* backend, comm::Communicator* dp, comm::Communicator* tp,
                 const OptimizerOptions& options)
    : model_(model),
      backend_(backend),
      dp_(dp != nullptr && dp->size() > 1 ? dp : nullptr),
      tp_(tp != nullptr && tp->size() > 1 ? tp : nullptr),
      options_(options) {}
Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(model::Llama* model, runtime::Backend* backend,
                                                         comm::Communicator* dp, comm::Communicator* tp,
                                                         const OptimizerOptions& options) {
  if (model == nullptr || backend == nullptr) return absl::InvalidArgumentError("trainer: no model or backend");
  if (options.zero < 0 || options.zero > 3)
    return absl::InvalidArgumentError(absl::StrCat("trainer: zero must be 0, 1, 2 or 3, got ", options.zero));
  if (options.zero > 1)  // ZeRO-2 shards gradients during the backward, ZeRO-3 the parameters: not yet
    return absl::UnimplementedError(absl::StrCat("trainer: ZeRO-", options.zero, " is not implemented yet (0 and 1 are)"));
  if (!(options.lr > 0) || options.min_lr < 0 || options.min_lr > options.lr)
    return absl::InvalidArgumentError(
        absl::StrCat("trainer: need 0 <= min_lr <= lr and lr > 0, got lr ", options.lr, ", min_lr ", options.min_lr));
  if (options.total_steps < 1 || options.warmup_steps < 0)
    return absl::InvalidArgumentError("trainer: total_steps must be >= 1 and warmup_steps >= 0");
  std::unique_ptr<Trainer> t(new Trainer(model, backend, dp, tp, options));
  TESSERA_RETURN_IF_ERROR(t->Allocate());
  return t;
}

absl::Status Trainer::Allocate() {
  runtime::Backend& b = *backend_;
  const int dp = dp_ ? dp_->size() : 1;
  const bool zero = options_.zero > 0 && dp_ != nullptr;
  for (auto& p : model_->params()) {
    State s;
    s.n = p.value.numel();
    s.decay = p.spec.shape.size() > 1;
    s.tp_sharded = tp_ != nullptr && p.spec.shard_dim >= 0;
    s.shard = zero ? (s.n + dp - 1) / dp : s.n;
    TESSERA_ASSIGN_OR_RETURN(s.m, b.Empty({s.shard}, DType::kF32));
    TESSERA_ASSIGN_OR_RETURN(s.v, b.Empty({s.shard}, DType::kF32));
    TESSERA_RETURN_IF_ERROR(b.Fill(s.m, 0));
    TESSERA_RETURN_IF_ERROR(b.Fill(s.v, 0));
    if (zero) {
      TESSERA_ASSIGN_OR_RETURN(s.grad_shard, b.Empty({s.shard}, DType::kF32));
      TESSERA_ASSIGN_OR_RETURN(s.padded, b.Empty({s.shard * dp}, DType::kF32));
      TESSERA_ASSIGN_OR_RETURN(s.stage, b.Empty({s.shard}, DType::kF32));
      TESSERA_RETURN_IF_ERROR(b.Fill(s.padded, 0));  // the tail past n stays zero
    }
    state_.push_back(std::move(s));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Trainer::GlobalTokens(const std::vector<model::TokenBatch>& micro_batches) {
  int64_t tokens = 0;
  for (const auto& mb : micro_batches)
    for (int32_t t : mb.targets) tokens += t >= 0;
  if (dp_ == nullptr) return tokens;
  TESSERA_ASSIGN_OR_RETURN(Tensor buf, backend_->Empty({1}, DType::kI64));
  TESSERA_RETURN_IF_ERROR(backend_->CopyFromHost(&tokens, buf));
  TESSERA_RETURN_IF_ERROR(dp_->AllReduce(buf.data(), buf.data(), 1, DType::kI64, comm::ReduceOp::kSum));
  TESSERA_RETURN_IF_ERROR(backend_->CopyToHost(buf, &tokens));
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
  const bool zero = !state_.empty() && state_[0].grad_shard.defined();
  auto& params = model_->params();
  for (size_t i = 0; i < params.size(); ++i) {
    State& s = state_[i];
    Tensor& g = params[i].grad;
    Tensor& acc = s.tp_sharded ? sq_sharded : sq_repl;
    if (!zero) {
      if (dp_ != nullptr)
        TESSERA_RETURN_IF_ERROR(dp_->AllReduce(g.data(), g.data(), s.n, DType::kF32, comm::ReduceOp::kSum));
      TESSERA_RETURN_IF_ERROR(b.SumSquares(g, acc));
      continue;
    }
    TESSERA_ASSIGN_OR_RETURN(Tensor flat, g.Reshape({s.n}));
    TESSERA_ASSIGN_OR_RETURN(Tensor head, s.padded.Slice(0, 0, s.n));
    TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, flat, 0.f, head));
    TESSERA_RETURN_IF_ERROR(
        dp_->ReduceScatter(s.padded.data(), s.grad_shard.data(), s.shard, DType::kF32, comm::ReduceOp::kSum));
    TESSERA_RETURN_IF_ERROR(b.SumSquares(s.grad_shard, acc));
  }
  if (zero) TESSERA_RETURN_IF_ERROR(dp_->AllReduce(sq.data(), sq.data(), 2, DType::kF32, comm::ReduceOp::kSum));
  if (tp_ != nullptr)
    TESSERA_RETURN_IF_ERROR(tp_->AllReduce(sq_sharded.data(), sq_sharded.data(), 1, DType::kF32, comm::ReduceOp::kSum));
  float host[2];
  TESSERA_RETURN_IF_ERROR(b.CopyToHost(sq, host));
  return std::sqrt(static_cast<double>(host[0]) + host[1]);
}

absl::Status Trainer::Update(float lr, float clip_scale) {
  runtime::Backend& b = *backend_;
  auto& params = model_->params();
  const int rank = dp_ ? dp_->rank() : 0;
  for (size_t i = 0; i < params.size(); ++i) {
    State& s = state_[i];
    runtime::AdamWParams hp{lr, options_.beta1, options_.beta2, options_.eps, s.decay ? options_.weight_decay : 0.f,
                            step_};
    if (!s.grad_shard.defined()) {
      if (clip_scale != 1.f) TESSERA_RETURN_IF_ERROR(b.Scale(params[i].grad, clip_scale));
      TESSERA_ASSIGN_OR_RETURN(Tensor m, s.m.Reshape(params[i].value.shape()));
      TESSERA_ASSIGN_OR_RETURN(Tensor v, s.v.Reshape(params[i].value.shape()));
      TESSERA_RETURN_IF_ERROR(b.AdamW(params[i].value, params[i].grad, m, v, hp));
      continue;
    }
    // ZeRO: update this rank's slice, then all-gather the parameter.
    TESSERA_ASSIGN_OR_RETURN(Tensor flat, params[i].value.Reshape({s.n}));
    const int64_t begin = std::min<int64_t>(s.n, rank * s.shard), len = std::min<int64_t>(s.shard, s.n - begin);
    if (len > 0) {
      TESSERA_ASSIGN_OR_RETURN(Tensor p, flat.Slice(0, begin, len));
      TESSERA_ASSIGN_OR_RETURN(Tensor g, s.grad_shard.Slice(0, 0, len));
      TESSERA_ASSIGN_OR_RETURN(Tensor m, s.m.Slice(0, 0, len));
      TESSERA_ASSIGN_OR_RETURN(Tensor v, s.v.Slice(0, 0, len));
      TESSERA_ASSIGN_OR_RETURN(Tensor st, s.stage.Slice(0, 0, len));
      if (clip_scale != 1.f) TESSERA_RETURN_IF_ERROR(b.Scale(g, clip_scale));
      TESSERA_RETURN_IF_ERROR(b.AdamW(p, g, m, v, hp));
      TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, p, 0.f, st));
    }
    TESSERA_RETURN_IF_ERROR(dp_->AllGather(s.stage.data(), s.padded.data(), s.shard, DType::kF32));
    TESSERA_ASSIGN_OR_RETURN(Tensor head, s.padded.Slice(0, 0, s.n));
    TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, head, 0.f, flat));
    if (const int64_t tail = s.padded.numel() - s.n; tail > 0) {  // the next reduce-scatter expects zeros there
      TESSERA_ASSIGN_OR_RETURN(Tensor rest, s.padded.Slice(0, s.n, tail));
      TESSERA_RETURN_IF_ERROR(b.Fill(rest, 0));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepStats> Trainer::Step(const std::vector<model::TokenBatch>& micro_batches) {
  StepStats stats;
  TESSERA_ASSIGN_OR_RETURN(stats.tokens, GlobalTokens(micro_batches));
  if (stats.tokens == 0) return absl::InvalidArgumentError("trainer: the global batch has no target tokens");
  TESSERA_RETURN_IF_ERROR(model_->ZeroGrads());
  const float scale = 1.f / static_cast<float>(stats.tokens);
  float loss_sum = 0.f;
  for (const auto& mb : micro_batches) {
    TESSERA_ASSIGN_OR_RETURN(model::LossSum l, model_->ForwardBackward(mb, scale));
    loss_sum += static_cast<float>(l.sum);
  }
  if (dp_ != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(Tensor buf, backend_->Empty({1}, DType::kF32));
    TESSERA_RETURN_IF_ERROR(backend_->CopyFromHost(&loss_sum, buf));
    TESSERA_RETURN_IF_ERROR(dp_->AllReduce(buf.data(), buf.data(), 1, DType::kF32, comm::ReduceOp::kSum));
    TESSERA_RETURN_IF_ERROR(backend_->CopyToHost(buf, &loss_sum));
  }
  stats.loss = loss_sum / stats.tokens;
  TESSERA_ASSIGN_OR_RETURN(stats.grad_norm, ReduceGradsAndNorm());
  ++step_;
  stats.lr = LearningRate(options_, step_);
  const float clip = options_.clip_norm > 0 && stats.grad_norm > options_.clip_norm
                         ? static_cast<float>(options_.clip_norm / (stats.grad_norm + 1e-6))
                         : 1.f;
  TESSERA_RETURN_IF_ERROR(Update(stats.lr, clip));
  return stats;
}

}  // namespace tessera::engine
