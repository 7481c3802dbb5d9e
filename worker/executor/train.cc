#include "worker/executor/train.h"

#include <chrono>
#include <filesystem>


#include "absl/strings/str_cat.h"
#include "common/gpu_devices.h"
#include "common/status.h"
#include "common/util.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/checkpoint/hf.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/model/context_parallel.h"
#include "worker/runtime/device_peak.h"

namespace tessera::executor {

absl::StatusOr<model::LlamaConfig> ModelConfigFromSpec(const v1::JobSpec& spec, v1::DeviceType device) {
  const auto& m = spec.model();
  model::LlamaConfig config;
  if (!m.hf_dir().empty()) {  // the dims from the Hugging Face directory
    TESSERA_ASSIGN_OR_RETURN(config, model::ReadHfConfig(m.hf_dir()));
  } else {
    config.vocab = m.vocab_size(), config.hidden = m.hidden(), config.layers = m.num_layers();
    config.heads = m.num_heads(), config.kv_heads = m.num_kv_heads(), config.head_dim = m.head_dim(), config.ffn = m.ffn();
    if (m.rope_base() > 0) config.rope_base = static_cast<float>(m.rope_base());
    config.tie_embeddings = m.tie_embeddings(), config.qkv_bias = m.qkv_bias();
  }
  // Mixed precision by default on GPUs (as Megatron's --bf16 / FSDP's MixedPrecision);
  // the CPU oracle stays f32 (bf16 on the CPU is emulated through f32: slower, no gain).
  const std::string& precision = spec.train().precision();
  config.dtype = precision == "bf16" || ((precision.empty() || precision == "auto") && device == v1::DEVICE_TYPE_GPU)
                     ? tessera::DType::kBF16
                     : tessera::DType::kF32;
  return config;
}

namespace {
// model.tokenizer, or model.hf_dir when it holds a tokenizer.json, or "" (bytes).
std::string TokenizerPath(const v1::ModelShape& m) {
  if (m.tokenizer() == "byte") return "";
  if (!m.tokenizer().empty()) return m.tokenizer();
  return !m.hf_dir().empty() && ReadFile(m.hf_dir() + "/tokenizer.json").ok() ? m.hf_dir() : "";
}

// An exported Hugging Face directory carries the model's tokenizer files, as
// save_pretrained does, so that it reads and writes text wherever it goes next.
absl::Status CopyTokenizerFiles(const v1::ModelShape& m, const std::string& to) {
  const std::string path = TokenizerPath(m);
  if (path.empty()) return absl::OkStatus();
  std::error_code ec;
  const bool is_file = !std::filesystem::is_directory(path, ec);
  const std::string dir = is_file ? path.substr(0, path.rfind('/')) : path;
  TESSERA_ASSIGN_OR_RETURN(std::string tok, ReadFile(is_file ? path : dir + "/tokenizer.json"));
  TESSERA_RETURN_IF_ERROR(WriteFileAtomic(to + "/tokenizer.json", tok));
  for (const char* f : {"tokenizer_config.json", "generation_config.json", "special_tokens_map.json"})
    if (auto text = ReadFile(dir + "/" + f); text.ok()) TESSERA_RETURN_IF_ERROR(WriteFileAtomic(to + "/" + f, *text));
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<tokenizer::ModelText> ModelTextFromSpec(const v1::ModelShape& m, int64_t model_vocab) {
  auto text = tokenizer::LoadModelText(TokenizerPath(m));
  if (!text.ok()) return absl::Status(text.status().code(), absl::StrCat("model.tokenizer: ", text.status().message()));
  if (text->tokenizer->vocab_size() > model_vocab)
    return absl::InvalidArgumentError(absl::StrCat("model.tokenizer: ", text->tokenizer->name(), " has ",
                                                   text->tokenizer->vocab_size(), " tokens; the model's vocabulary has ",
                                                   model_vocab));
  return text;
}

absl::StatusOr<std::unique_ptr<TrainSession>> TrainSession::Create(const v1::JobSpec& spec, GroupComms& comms,
                                                                   v1::DeviceType device, int device_index) {
  const auto& m = spec.model();
  const auto& t = spec.train();
  TESSERA_ASSIGN_OR_RETURN(model::LlamaConfig config, ModelConfigFromSpec(spec, device));
  std::unique_ptr<TrainSession> s(new TrainSession());
  runtime::Device dev = device == v1::DEVICE_TYPE_GPU ? runtime::Device::Cuda(device_index) : runtime::Device::Cpu();
  TESSERA_ASSIGN_OR_RETURN(s->backend_, runtime::MakeBackend(dev));
  if (device == v1::DEVICE_TYPE_GPU) {
    const std::vector<GpuInfo> gpus = VisibleGpus();
    if (device_index >= 0 && device_index < static_cast<int>(gpus.size()))
      s->peak_flops_ = runtime::PeakFlops(gpus[device_index].name, config.dtype);
  }
  auto comm_of = [&](parallel::GroupKind k) { return CommOf(comms, k); };
  comm::Communicator* tp = comm_of(parallel::GroupKind::kTp);
  comm::Communicator* dp = comm_of(parallel::GroupKind::kDpCp);
  comm::Communicator* cp = comm_of(parallel::GroupKind::kCp);
  comm::Communicator* pp = comm_of(parallel::GroupKind::kPp);
  // NCCL runs on each communicator's own streams: order them with the backend's compute
  // stream (events both ways; a pipeline's tagged messages travel over per-link
  // communicators and streams, so a send never holds up the compute or a receive).
  TESSERA_RETURN_IF_ERROR(OrderCommsWith(comms, device, s->backend_->stream()));
  const model::StageSpec stage{comms.layout.pp, pp != nullptr ? pp->rank() : 0, comms.layout.vpp,
                                comms.layout.last_stage_layers, comms.layout.stage_layers};
  TESSERA_ASSIGN_OR_RETURN(s->model_, model::Llama::Create(config, s->backend_.get(), tp, comms.layout.sp, cp, stage));
  s->pad_to_ = comms.layout.sp ? comms.layout.tp : 1;
  s->tp_size_ = comms.layout.tp;
  if (!m.hf_dir().empty()) {
    TESSERA_RETURN_IF_ERROR(checkpoint::ImportHf(m.hf_dir(), *s->model_));
  } else {
    TESSERA_RETURN_IF_ERROR(s->model_->InitRandom(t.seed(), static_cast<float>(t.init_std())));
  }
  s->model_->set_recompute(t.recompute());
  s->model_->set_recompute_swiglu(t.recompute_swiglu());
  engine::OptimizerOptions o;
  o.lr = static_cast<float>(t.lr()), o.min_lr = static_cast<float>(t.min_lr());
  o.warmup_steps = t.warmup_steps(), o.total_steps = t.steps();
  o.weight_decay = static_cast<float>(t.weight_decay()), o.clip_norm = static_cast<float>(t.clip_norm());
  o.zero = comms.layout.zero;
  TESSERA_ASSIGN_OR_RETURN(o.schedule, parallel::ParseSchedule(t.schedule()));
  TESSERA_ASSIGN_OR_RETURN(s->trainer_, engine::Trainer::Create(s->model_.get(), s->backend_.get(), dp, tp, o, pp));
  s->data_ = {t.data().digits(), t.seed(), m.seq_len(), /*answer_only=*/spec.kind() == "sft"};
  s->data_.careless = t.data().careless();
  const bool rl = spec.kind() == "grpo" || spec.kind() == "ppo";
  if (t.data().kind() == "jsonl" && !rl) {  // grpo's and ppo's prompts: MakeRl
    TESSERA_ASSIGN_OR_RETURN(tokenizer::ModelText text, ModelTextFromSpec(m, config.vocab));
    TESSERA_ASSIGN_OR_RETURN(engine::JsonlData d, engine::LoadJsonl(t.data().path(), m.seq_len(), text));
    s->jsonl_ = std::make_unique<engine::JsonlData>(std::move(d));
  }
  // The CP ranks of a DP rank take the same micro-batches, each its split of them.
  const int dps = comms.layout.dp;
  comm::Communicator* dp_only = comm_of(parallel::GroupKind::kDp);
  const int dp_rank = dp_only != nullptr ? dp_only->rank() : 0;
  s->cp_ = comms.layout.cp;
  s->cp_rank_ = cp != nullptr ? cp->rank() : 0;
  s->sequences_ = m.micro_batch();
  s->micro_per_step_ = m.global_batch() / m.micro_batch();
  s->micro_per_rank_ = s->micro_per_step_ / dps;
  s->first_micro_ = dp_rank * s->micro_per_rank_;
  s->tp_ = tp, s->dp_ = dp, s->pp_ = pp;
  s->checkpoint_ = t.checkpoint();
  s->export_hf_ = t.export_hf();
  s->model_shape_ = m;
  s->first_replica_ = (dp == nullptr || dp->rank() == 0) && (tp == nullptr || tp->rank() == 0);
  s->total_steps_ = t.steps();
  // grpo: here only the warm start (train.checkpoint.load, which the reference copies);
  // its own checkpoints (train.checkpoint.dir) load over the actor once the reference is
  // made (MakeRl).
  v1::CheckpointSpec start = t.checkpoint();
  if (rl) start.clear_dir();
  TESSERA_RETURN_IF_ERROR(s->Resume(start));
  if (rl) TESSERA_RETURN_IF_ERROR(s->MakeRl(spec, dp_rank, dps, o));
  return s;
}

// The directory's latest checkpoint if resuming and there is one, else `load` (a step-N
// directory, or a checkpoint directory whose latest is taken).
absl::Status TrainSession::Resume(const v1::CheckpointSpec& ck) {
  std::string from;
  if (!ck.dir().empty() && ck.resume()) {
    auto latest = checkpoint::LatestCheckpoint(ck.dir());
    if (latest.ok()) from = *latest;
    else if (latest.status().code() != absl::StatusCode::kNotFound) return latest.status();
  }
  if (from.empty() && !ck.load().empty()) {
    from = ck.load();
    if (!ReadFile(from + "/metadata.json").ok()) {
      TESSERA_ASSIGN_OR_RETURN(from, checkpoint::LatestCheckpoint(ck.load()));
    }
  }
  if (from.empty()) return absl::OkStatus();
  TESSERA_ASSIGN_OR_RETURN(start_step_, checkpoint::LoadCheckpoint(from, {model_.get(), trainer_.get(), tp_, dp_, pp_}));
  return absl::OkStatus();
}

// After `done` steps (of total_steps_): a checkpoint every save_every steps, after the
// last and when RequestSave() asked for one, named by `done`; the Hugging Face export after the last. Returns the checkpoint's
// seconds (-1: none this step).
absl::StatusOr<double> TrainSession::SaveAfter(int64_t done) {
  const bool force = save_requested_;
  save_requested_ = false;
  double checkpoint_secs = -1;
  const int64_t every = checkpoint_.save_every();
  if (!checkpoint_.dir().empty() && ((every > 0 && done % every == 0) || done == total_steps_ || force)) {
    const auto c0 = std::chrono::steady_clock::now();
    // ppo: the critic first (under dir/critic, same step), so that the actor's `latest`
    // never names a step whose critic is missing.
    if (critic_ != nullptr)
      TESSERA_RETURN_IF_ERROR(checkpoint::SaveCheckpoint(checkpoint_.dir() + "/critic", done,
                                                         {critic_.get(), critic_trainer_.get(), tp_, dp_, nullptr},
                                                         checkpoint_.keep()));
    TESSERA_RETURN_IF_ERROR(checkpoint::SaveCheckpoint(checkpoint_.dir(), done, {model_.get(), trainer_.get(), tp_, dp_, pp_},
                                                       checkpoint_.keep()));
    checkpoint_secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
  }
  if (!export_hf_.empty() && done == total_steps_) {
    // Every rank takes part (the weights are gathered over TP, over DP under ZeRO-3, and
    // sent to the first stage under PP); the first one writes.
    TESSERA_RETURN_IF_ERROR(trainer_->GatherParams());
    TESSERA_RETURN_IF_ERROR(checkpoint::ExportHf(export_hf_, *model_, "BF16", first_replica_,
                                                 pp_ != nullptr && pp_->size() > 1 ? pp_ : nullptr));
    if (first_replica_ && (pp_ == nullptr || pp_->rank() == 0)) TESSERA_RETURN_IF_ERROR(CopyTokenizerFiles(model_shape_, export_hf_));
  }
  return checkpoint_secs;
}

absl::StatusOr<v1::TrainStepResponse> TrainSession::Step(int64_t step) {
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
