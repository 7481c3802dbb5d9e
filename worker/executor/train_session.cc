#include "worker/executor/train_session.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/util.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/checkpoint/hf.h"
#include "worker/executor/model_spec.h"
#include "worker/executor/pretrain_session.h"
#include "worker/executor/rl_actor_session.h"

namespace tessera::executor {

absl::StatusOr<std::unique_ptr<TrainSession>> TrainSession::Create(const v1::JobSpec& spec, GroupComms& comms,
                                                                   v1::DeviceType device, int device_index) {
  const std::string& kind = spec.kind();
  if (kind == "pretrain" || kind == "sft") return PretrainSession::Create(spec, comms, device, device_index);
  if (kind == "grpo" || kind == "ppo") return RlActorSession::Create(spec, comms, device, device_index);
  return absl::InvalidArgumentError(absl::StrCat("kind: '", kind, "' has no training session (pretrain, sft, grpo, ppo)"));
}

absl::Status TrainSession::Init(const v1::JobSpec& spec, GroupComms& comms, v1::DeviceType device, int device_index,
                                const v1::CheckpointSpec& start, engine::OptimizerOptions* o, bool make_trainer) {
  const auto& m = spec.model();
  const auto& t = spec.train();
  kind_ = spec.kind();
  TESSERA_ASSIGN_OR_RETURN(model::LlamaConfig config, ModelConfigFromSpec(spec, device));
  runtime::Device dev = device == v1::DEVICE_TYPE_GPU ? runtime::Device::Cuda(device_index) : runtime::Device::Cpu();
  TESSERA_ASSIGN_OR_RETURN(backend_, runtime::MakeBackend(dev));
  auto comm_of = [&](parallel::GroupKind k) { return CommOf(comms, k); };
  tp_ = comm_of(parallel::GroupKind::kTp);
  dp_ = comm_of(parallel::GroupKind::kDpCp);
  cp_comm_ = comm_of(parallel::GroupKind::kCp);
  pp_ = comm_of(parallel::GroupKind::kPp);
  comm::Communicator* dp_only = comm_of(parallel::GroupKind::kDp);
  dp_rank_ = dp_only != nullptr ? dp_only->rank() : 0;
  dps_ = comms.layout.dp;
  // NCCL runs on each communicator's own streams: order them with the backend's compute
  // stream (events both ways; a pipeline's tagged messages travel over per-link
  // communicators and streams, so a send never holds up the compute or a receive).
  TESSERA_RETURN_IF_ERROR(OrderCommsWith(comms, device, backend_->stream()));
  const model::StageSpec stage{comms.layout.pp, pp_ != nullptr ? pp_->rank() : 0, comms.layout.vpp,
                                comms.layout.last_stage_layers, comms.layout.stage_layers};
  TESSERA_ASSIGN_OR_RETURN(model_, model::Llama::Create(config, backend_.get(), tp_, comms.layout.sp, cp_comm_, stage));
  if (!m.hf_dir().empty()) {
    TESSERA_RETURN_IF_ERROR(checkpoint::ImportHf(m.hf_dir(), *model_));
  } else {
    TESSERA_RETURN_IF_ERROR(model_->InitRandom(t.seed(), static_cast<float>(t.init_std())));
  }
  model_->set_recompute(t.recompute());
  model_->set_recompute_swiglu(t.recompute_swiglu());
  o->lr = static_cast<float>(t.lr()), o->min_lr = static_cast<float>(t.min_lr());
  o->warmup_steps = t.warmup_steps(), o->total_steps = t.steps();
  o->weight_decay = static_cast<float>(t.weight_decay()), o->clip_norm = static_cast<float>(t.clip_norm());
  o->zero = comms.layout.zero;
  TESSERA_ASSIGN_OR_RETURN(o->schedule, parallel::ParseSchedule(t.schedule()));
  if (make_trainer) {
    TESSERA_ASSIGN_OR_RETURN(trainer_, engine::Trainer::Create(model_.get(), backend_.get(), dp_, tp_, *o, pp_));
  }
  checkpoint_ = t.checkpoint();
  export_hf_ = t.export_hf();
  model_shape_ = m;
  first_replica_ = (dp_ == nullptr || dp_->rank() == 0) && (tp_ == nullptr || tp_->rank() == 0);
  total_steps_ = t.steps();
  return Resume(start);
}

void TrainSession::ReleaseForOffload(std::vector<runtime::Tensor>* states) {
  if (trainer_ != nullptr) trainer_->AppendStates(states);
  else model_->AppendStates(states);
}

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

absl::StatusOr<double> TrainSession::SaveAfter(int64_t done) {
  const bool force = save_requested_;
  save_requested_ = false;
  double checkpoint_secs = -1;
  const int64_t every = checkpoint_.save_every();
  if (!checkpoint_.dir().empty() && ((every > 0 && done % every == 0) || done == total_steps_ || force)) {
    const auto c0 = std::chrono::steady_clock::now();
    TESSERA_RETURN_IF_ERROR(SaveCompanions(done));
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

}  // namespace tessera::executor
