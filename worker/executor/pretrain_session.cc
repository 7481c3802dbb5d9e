#include "worker/executor/pretrain_session.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/gpu_devices.h"
#include "common/status.h"
#include "worker/executor/model_spec.h"
#include "worker/model/context_parallel.h"
#include "worker/runtime/device_peak.h"

namespace tessera::executor {

absl::StatusOr<std::unique_ptr<PretrainSession>> PretrainSession::Create(const v1::JobSpec& spec, GroupComms& comms,
                                                                         v1::DeviceType device, int device_index) {
  std::unique_ptr<PretrainSession> s(new PretrainSession());
  engine::OptimizerOptions o;
  TESSERA_RETURN_IF_ERROR(s->Init(spec, comms, device, device_index, spec.train().checkpoint(), &o));
  const auto& m = spec.model();
  const auto& t = spec.train();
  const model::LlamaConfig& config = s->model_->config();
  if (device == v1::DEVICE_TYPE_GPU) {
    const std::vector<GpuInfo> gpus = VisibleGpus();
    if (device_index >= 0 && device_index < static_cast<int>(gpus.size()))
      s->peak_flops_ = runtime::PeakFlops(gpus[device_index].name, config.dtype);
  }
  s->pad_to_ = comms.layout.sp ? comms.layout.tp : 1;
  s->tp_size_ = comms.layout.tp;
  s->data_ = {t.data().digits(), t.seed(), m.seq_len(), /*answer_only=*/spec.kind() == "sft"};
  s->data_.careless = t.data().careless();
  s->data_.calculator = t.data().calculator();
  if (t.data().kind() == "jsonl") {
    TESSERA_ASSIGN_OR_RETURN(tokenizer::ModelText text, ModelTextFromSpec(m, config.vocab));
    TESSERA_ASSIGN_OR_RETURN(engine::JsonlData d, engine::LoadJsonl(t.data().path(), m.seq_len(), text));
    s->jsonl_ = std::make_unique<engine::JsonlData>(std::move(d));
  }
  // The CP ranks of a DP rank take the same micro-batches, each its split of them.
  s->cp_ = comms.layout.cp;
  s->cp_rank_ = s->cp_comm_ != nullptr ? s->cp_comm_->rank() : 0;
  s->sequences_ = m.micro_batch();
  s->micro_per_step_ = m.global_batch() / m.micro_batch();
  s->micro_per_rank_ = s->micro_per_step_ / s->dps_;
  s->first_micro_ = s->dp_rank_ * s->micro_per_rank_;
  return s;
}

absl::StatusOr<v1::TrainStepResponse> PretrainSession::Step(int64_t step) {
  if (step != trainer_->step())
    return absl::FailedPreconditionError(absl::StrCat("TrainStep ", step, ": the session is at step ", trainer_->step(),
                                                      " (started from ", start_step_, ")"));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<model::TokenBatch> mine;
  double tokens = 0, attn = 0;  // of this DP rank's sequences (before any CP split or padding)
  for (int64_t k = 0; k < micro_per_rank_; ++k) {
    const int64_t index = step * micro_per_step_ + first_micro_ + k;
    mine.push_back(jsonl_ ? engine::MakeJsonlBatch(*jsonl_, index, sequences_)
                          : engine::MakeArithmeticBatch(data_, index, sequences_));
    model::TokenBatch& b = mine.back();
    for (size_t i = 1; i < b.cu_seqlens.size(); ++i) {  // the model FLOPs count the whole sequences
      const double len = b.cu_seqlens[i] - b.cu_seqlens[i - 1];
      tokens += len;
      attn += len * len;
    }
    if (cp_ > 1) {
      // Context parallelism: this rank's chunks of every sequence, each sequence padded to
      // a multiple of 2·cp (·tp under SP, so that the local tokens split over TP).
      TESSERA_ASSIGN_OR_RETURN(b, model::SplitForContextParallel(b, cp_, cp_rank_, static_cast<int>(pad_to_)));
      continue;
    }
    // Sequence parallelism splits the packed tokens over TP: pad with one more sequence
    // that takes no loss (it attends only to itself, so nothing else changes).
    const int64_t pad = (pad_to_ - b.size() % pad_to_) % pad_to_;
    for (int64_t i = 0; i < pad; ++i) {
      b.tokens.push_back(0);
      b.targets.push_back(-1);
      b.positions.push_back(static_cast<int32_t>(i));
    }
    if (pad > 0) b.cu_seqlens.push_back(static_cast<int32_t>(b.size()));
  }
  TESSERA_ASSIGN_OR_RETURN(engine::StepStats st, trainer_->Step(mine));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  TESSERA_ASSIGN_OR_RETURN(const double checkpoint_secs, SaveAfter(trainer_->step()));
  // This rank's share of the step's model FLOPs (Megatron's estimate: 6 N per token for
  // the weights, plus causal attention 6 L Hq D s^2 per sequence of s tokens, forward and
  // backward), split evenly over the TP ranks that shared its tokens.
  const auto& c = model_->config();
  const double flops = (6.0 * static_cast<double>(c.NumParams()) * tokens +
                        6.0 * c.layers * c.heads * c.HeadDim() * attn) / (tp_size_ * cp_);
  v1::TrainStepResponse r;
  r.set_step(step);
  r.set_loss(st.loss), r.set_grad_norm(st.grad_norm), r.set_lr(st.lr), r.set_tokens(st.tokens);
  r.set_seconds(secs);
  r.set_model_flops(flops);
  r.set_peak_flops(peak_flops_);  // 0: unknown (no MFU)
  r.set_memory_peak_bytes(backend_->allocator()->stats().peak_bytes);
  if (checkpoint_secs >= 0) r.set_checkpoint_seconds(checkpoint_secs);
  r.set_pipeline_seconds(st.pipeline_s);  // 0 without a pipeline
  r.set_pipeline_busy_seconds(st.pipeline_busy_s);
  r.set_dp_wait_seconds(st.dp_wait_s);  // the gradient reduction the backward did not hide
  return r;
}

}  // namespace tessera::executor
