#include "worker/executor/rl_role_sessions.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/model/hf_config.h"
#include "common/rpc/tensor_stream.h"
#include "common/status.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/executor/rl_batch.h"
#include "worker/rl/ppo.h"

namespace tessera::executor {
namespace {

// This DP rank's samples of a step.
int64_t SamplesPerRank(const v1::RlSpec& rl, int dps) { return int64_t(rl.prompts_per_step() / dps) * rl.group_size(); }

// The starting weights only: the job's own checkpoints (train.checkpoint.dir) are the
// actor's and the critic's to resume from.
v1::CheckpointSpec StartOnly(const v1::JobSpec& spec) {
  v1::CheckpointSpec start = spec.train().checkpoint();
  start.clear_dir();
  return start;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RlReferenceSession>> RlReferenceSession::Create(const v1::JobSpec& spec, GroupComms& comms,
                                                                              v1::DeviceType device, int device_index) {
  std::unique_ptr<RlReferenceSession> s(new RlReferenceSession());
  engine::OptimizerOptions o;
  TESSERA_RETURN_IF_ERROR(s->Init(spec, comms, device, device_index, StartOnly(spec), &o, /*make_trainer=*/false));
  s->rl_ = spec.rl();
  s->checkpoint_.Clear();  // saves nothing, exports nothing
  s->export_hf_.clear();
  s->start_step_ = 0;
  TESSERA_RETURN_IF_ERROR(s->model_->Freeze());
  return s;
}

absl::StatusOr<v1::RlForwardStats> RlReferenceSession::Forward(int64_t step, const v1::TensorBatch& samples,
                                                               v1::TensorBatch* out) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("RlForward: step ", step));
  return ForwardSamples(*model_, nullptr, *backend_, rl_, SamplesPerRank(rl_, dps_), samples, kRefLogp, out);
}

absl::StatusOr<std::unique_ptr<RlCriticSession>> RlCriticSession::Create(const v1::JobSpec& spec, GroupComms& comms,
                                                                        v1::DeviceType device, int device_index,
                                                                        int64_t resume_step) {
  std::unique_ptr<RlCriticSession> s(new RlCriticSession());
  engine::OptimizerOptions o;
  TESSERA_RETURN_IF_ERROR(s->Init(spec, comms, device, device_index, StartOnly(spec), &o, /*make_trainer=*/false));
  s->rl_ = spec.rl();
  // The value model: the starting weights under a fresh value head (as the actor's own critic).
  model::LlamaConfig cc = s->model_->config();
  cc.value_head = true, cc.tie_embeddings = false;
  TESSERA_ASSIGN_OR_RETURN(std::unique_ptr<model::Llama> critic, model::Llama::Create(cc, s->backend_.get(), s->tp_));
  // The value head fresh (its own seed, as the actor's own critic makes it); the rest copied.
  model::Llama* actor = s->model_.get();
  TESSERA_RETURN_IF_ERROR(critic->InitRandom(spec.train().seed() + 1, 0.02f,
                                             [actor](const model::Param& p) { return actor->Find(p.name()) == nullptr; }));
  for (model::Param& p : critic->params()) {
    model::Param* a = s->model_->Find(p.name());
    if (a == nullptr) continue;  // score.weight
    TESSERA_ASSIGN_OR_RETURN(std::vector<float> whole, s->model_->GatherGlobal(*a, /*grad=*/false));
    TESSERA_RETURN_IF_ERROR(critic->SetGlobal(p, whole));
  }
  s->model_ = std::move(critic);
  o.lr = static_cast<float>(s->rl_.critic_lr()), o.min_lr = std::min(o.min_lr, o.lr);
  TESSERA_ASSIGN_OR_RETURN(s->trainer_, engine::Trainer::Create(s->model_.get(), s->backend_.get(), s->dp_, s->tp_, o));
  s->export_hf_.clear();  // the export is the actor's
  s->start_step_ = 0;
  if (!s->checkpoint_.dir().empty()) s->checkpoint_.set_dir(s->checkpoint_.dir() + "/critic");
  // One more than the actor keeps: the driver saves the critic's step first, and the
  // actor's latest must still have its critic beside it if the actor's save never lands.
  if (s->checkpoint_.keep() > 0) s->checkpoint_.set_keep(s->checkpoint_.keep() + 1);
  if (resume_step > 0) {
    if (s->checkpoint_.dir().empty())
      return absl::InvalidArgumentError(absl::StrCat("TrainInit: resume_step ", resume_step, " without train.checkpoint.dir"));
    const std::string dir = absl::StrCat(s->checkpoint_.dir(), "/", checkpoint::StepDirName(resume_step));
    TESSERA_ASSIGN_OR_RETURN(const int64_t got, checkpoint::LoadCheckpoint(dir, {s->model_.get(), s->trainer_.get(), s->tp_, s->dp_, nullptr}));
    if (got != resume_step)
      return absl::DataLossError(absl::StrCat(dir, ": the critic's checkpoint is of step ", got, ", the actor's of ", resume_step));
    s->trainer_->set_step(resume_step * s->rl_.epochs() * s->rl_.mini_batches());
    s->start_step_ = resume_step;
  }
  return s;
}

absl::StatusOr<v1::RlForwardStats> RlCriticSession::Forward(int64_t step, const v1::TensorBatch& samples, v1::TensorBatch* out) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("RlForward: step ", step));
  return ForwardSamples(*model_, trainer_.get(), *backend_, rl_, SamplesPerRank(rl_, dps_), samples, kOldValue, out);
}

absl::StatusOr<v1::RlUpdateResponse> RlCriticSession::Update(int64_t step, const v1::TensorBatch& samples) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("RlUpdate: step ", step));
  TESSERA_ASSIGN_OR_RETURN(engine::Rollouts got, RolloutsOfBatch(samples, SamplesPerRank(rl_, dps_), model_->config().vocab, "RlUpdate"));
  for (const char* name : {kOldValue, kReturns}) {
    TESSERA_ASSIGN_OR_RETURN(const bool has, TakeTokenTensor(samples, name, got.samples,
                                                             std::string(name) == kOldValue ? &engine::RlSample::old_value
                                                                                            : &engine::RlSample::returns));
    if (!has) return absl::InvalidArgumentError(absl::StrCat("RlUpdate: a critic's samples carry ", name));
  }
  engine::PpoOptions o;
  o.value_clip = rl_.value_clip();
  o.epochs = rl_.epochs(), o.mini_batches = rl_.mini_batches();
  o.max_tokens_per_micro_batch = rl_.max_tokens_per_micro_batch();
  backend_->allocator()->ResetPeak();
  TESSERA_ASSIGN_OR_RETURN(engine::PpoStats st, engine::PpoCriticUpdate(*model_, *trainer_, got, o));
  v1::RlUpdateResponse r;
  r.set_step(step);
  r.set_samples(static_cast<int64_t>(got.samples.size()));
  r.set_reward(st.reward), r.set_response_length(st.response_length);
  v1::CriticStats& c = *r.mutable_critic();
  c.set_value_loss(st.value_loss), c.set_value_clip_fraction(st.value_clip_fraction), c.set_value(st.value);
  c.set_grad_norm(st.critic_grad_norm), c.set_update_s(st.critic_s);
  r.set_memory_peak_bytes(backend_->allocator()->stats().peak_bytes);
  TESSERA_ASSIGN_OR_RETURN(const double checkpoint_secs, SaveAfter(step + 1));
  if (checkpoint_secs >= 0) r.set_checkpoint_seconds(checkpoint_secs);
  return r;
}

absl::StatusOr<std::unique_ptr<RlRewardSession>> RlRewardSession::Create(const v1::JobSpec& spec, GroupComms& comms,
                                                                        v1::DeviceType device, int device_index) {
  const std::string& dir = spec.rl().reward_model();
  if (dir.empty()) return absl::InvalidArgumentError("rl.reward_model: a reward group needs the reward model's directory");
  auto config = model::ReadHfConfig(dir);
  if (!config.ok()) return absl::Status(config.status().code(), absl::StrCat("rl.reward_model: ", config.status().message()));
  if (!config->sequence_score)
    return absl::InvalidArgumentError(absl::StrCat("rl.reward_model: ", dir, "/config.json is not a sequence classifier ",
                                                   "(architectures: *ForSequenceClassification, one label)"));
  // The reward model's own directory, weights only: no checkpoints, no export.
  v1::JobSpec own = spec;
  own.mutable_model()->set_hf_dir(dir);
  own.mutable_model()->clear_tokenizer();
  own.mutable_train()->clear_checkpoint();
  own.mutable_train()->clear_export_hf();
  std::unique_ptr<RlRewardSession> s(new RlRewardSession());
  engine::OptimizerOptions o;
  if (absl::Status st = s->Init(own, comms, device, device_index, v1::CheckpointSpec{}, &o, /*make_trainer=*/false); !st.ok())
    return absl::Status(st.code(), absl::StrCat("rl.reward_model: ", st.message()));
  s->rl_ = spec.rl();
  TESSERA_RETURN_IF_ERROR(s->model_->Freeze());
  return s;
}

absl::StatusOr<v1::RlForwardStats> RlRewardSession::Forward(int64_t step, const v1::TensorBatch& samples, v1::TensorBatch* out) {
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("RlForward: step ", step));
  TESSERA_ASSIGN_OR_RETURN(engine::Rollouts got, RolloutsOfBatch(samples, SamplesPerRank(rl_, dps_), model_->config().vocab,
                                                                 "RlForward (rl.reward_model)"));
  int64_t tokens = 0;
  for (const engine::RlSample& x : got.samples) tokens += x.batch.size();
  backend_->allocator()->ResetPeak();
  const auto t0 = std::chrono::steady_clock::now();
  TESSERA_ASSIGN_OR_RETURN(const engine::MicroBatchPlan plan,
                           engine::PlanMicroBatches(nullptr, got.samples, 1, rl_.max_tokens_per_micro_batch()));
  TESSERA_ASSIGN_OR_RETURN(const std::vector<double> scores, engine::SequenceScores(*model_, got.samples, plan));
  std::vector<float> flat(scores.size());
  for (size_t i = 0; i < scores.size(); ++i) {
    if (!std::isfinite(scores[i]))
      return absl::InternalError(absl::StrCat("rl.reward_model: the score of sample ", i, " of step ", step, " is ", scores[i]));
    flat[i] = static_cast<float>(scores[i]);
  }
  v1::RlForwardStats st;
  st.set_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  st.set_tokens(tokens);
  st.set_memory_peak_bytes(backend_->allocator()->stats().peak_bytes);
  *out->add_tensors() = F32Tensor(kScore, {static_cast<int64_t>(flat.size())}, flat);
  return st;
}

}  // namespace tessera::executor
