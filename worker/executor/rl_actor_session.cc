#include "worker/executor/rl_actor_session.h"

#include "common/spec/rl_options.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/rl.h"
#include "common/rpc/grpc_util.h"
#include "common/spec/job_spec.h"
#include "common/spec/rl_options.h"
#include "common/status.h"
#include "common/util.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/executor/rl_batch.h"
#include "worker/executor/rollout_pool.h"
#include "worker/rollout/weight_sync.h"

namespace tessera::executor {

absl::StatusOr<std::unique_ptr<RlActorSession>> RlActorSession::Create(const v1::JobSpec& spec, GroupComms& comms,
                                                                       v1::DeviceType device, int device_index) {
  std::unique_ptr<RlActorSession> s(new RlActorSession());
  // Here only the warm start (train.checkpoint.load, which the reference copies); the
  // job's own checkpoints (train.checkpoint.dir) load over the actor once the reference
  // is made (MakeRl).
  v1::CheckpointSpec start = spec.train().checkpoint();
  start.clear_dir();
  engine::OptimizerOptions o;
  TESSERA_RETURN_IF_ERROR(s->Init(spec, comms, device, device_index, start, &o));
  TESSERA_RETURN_IF_ERROR(s->MakeRl(spec, o));
  return s;
}

// The starting weights (after a warm start) become the frozen reference: a second model
// of the same layout, filled by a colocated sync (a TP gather per tensor). The optimizer
// (AdamW moments) and the step count start over for GRPO, as an RL actor's do — unless
// the job resumes from its own checkpoint, which then loads over the actor.
absl::Status RlActorSession::MakeRl(const v1::JobSpec& spec, const engine::OptimizerOptions& actor_options) {
  rl_ = spec.rl();
  TESSERA_RETURN_IF_ERROR(trainer_->ResetOptimizerState());
  TESSERA_RETURN_IF_ERROR(trainer_->GatherParams());  // the critic and the reference copy the actor's values
  start_step_ = 0;
  if (spec.kind() == "ppo" && GroupWithRole(spec, "critic") == nullptr) {  // the critic: the actor's weights (after the warm start) under a fresh value head
    model::LlamaConfig cc = model_->config();
    cc.value_head = true, cc.tie_embeddings = false;
    TESSERA_ASSIGN_OR_RETURN(critic_, model::Llama::Create(cc, backend_.get(), tp_));
    model::Llama* actor = model_.get();  // the value head fresh; the rest copied below
    TESSERA_RETURN_IF_ERROR(critic_->InitRandom(spec.train().seed() + 1, 0.02f,
                                                [actor](const model::Param& p) { return actor->Find(p.name()) == nullptr; }));
    for (model::Param& p : critic_->params()) {
      model::Param* a = model_->Find(p.name());
      if (a == nullptr) continue;  // score.weight
      TESSERA_ASSIGN_OR_RETURN(std::vector<float> whole, model_->GatherGlobal(*a, /*grad=*/false));
      TESSERA_RETURN_IF_ERROR(critic_->SetGlobal(p, whole));
    }
    engine::OptimizerOptions co = actor_options;
    co.lr = static_cast<float>(rl_.critic_lr()), co.min_lr = std::min(co.min_lr, co.lr);
    TESSERA_ASSIGN_OR_RETURN(critic_trainer_, engine::Trainer::Create(critic_.get(), backend_.get(), dp_, tp_, co));
  }
  ppo_ = spec.kind() == "ppo";
  if ((rl_.kl_coef() > 0 || rl_.kl_reward_coef() > 0) && GroupWithRole(spec, "reference") == nullptr) {
    TESSERA_ASSIGN_OR_RETURN(reference_, model::Llama::Create(model_->config(), backend_.get(), tp_));
    TESSERA_RETURN_IF_ERROR(engine::SyncColocated(*model_, *reference_));
    TESSERA_RETURN_IF_ERROR(reference_->Freeze());  // forward only: its compute copy is all it needs
  }
  TESSERA_RETURN_IF_ERROR(prompts_.Load(spec, model_->config().vocab));
  // With a rollout pool of its own (split pools) the actor generates nothing.
  if (RolloutPool(spec) == nullptr) {
    TESSERA_ASSIGN_OR_RETURN(rollout_, engine::RolloutEngine::Create(
                                           model_.get(), RlRolloutOptions(rl_, dps_, prompts_.longest_prompt())));
  }
  if (!checkpoint_.dir().empty() && checkpoint_.resume()) {
    auto latest = checkpoint::LatestCheckpoint(checkpoint_.dir());
    if (!latest.ok() && latest.status().code() != absl::StatusCode::kNotFound) return latest.status();
    if (latest.ok()) {
      TESSERA_ASSIGN_OR_RETURN(start_step_, checkpoint::LoadCheckpoint(*latest, {model_.get(), trainer_.get(), tp_, dp_, pp_}));
      trainer_->set_step(start_step_ * rl_.epochs() * rl_.mini_batches());  // the LR schedule and AdamW step
      if (critic_ != nullptr) {  // the critic of the same step (saved before the actor's)
        const std::string critic_dir = absl::StrCat(checkpoint_.dir(), "/critic/", checkpoint::StepDirName(start_step_));
        TESSERA_ASSIGN_OR_RETURN(const int64_t cs, checkpoint::LoadCheckpoint(critic_dir, {critic_.get(), critic_trainer_.get(), tp_, dp_, nullptr}));
        if (cs != start_step_)
          return absl::DataLossError(absl::StrCat(critic_dir, ": the critic's checkpoint is of step ", cs, ", the actor's of ", start_step_));
        critic_trainer_->set_step(start_step_ * rl_.epochs() * rl_.mini_batches());
      }
    }
  }
  TESSERA_ASSIGN_OR_RETURN(rewards_, RewardServiceClient::Create(spec, tp_, backend_.get()));
  if (rollout_ != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(env_, EnvironmentClient::Create(spec, tp_, backend_.get()));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RolloutStats> RlActorSession::RolloutGenerate(int64_t step, int refill, v1::TensorBatch* out) {
  if (rollout_ == nullptr)
    return absl::FailedPreconditionError("RolloutGenerate: the session has no rollout engine (not a grpo or ppo session, or "
                                         "the job's rollout group generates)");
  auto got = GenerateSamples(*rollout_, prompts_, rl_, rewards_.get(), env_.get(), step, refill, dp_rank_, dps_, dps_, out);
  rollout_->ReleaseCache();  // the update comes next on these devices: the cache's memory goes to it
  return got;
}

absl::StatusOr<v1::RlUpdateResponse> RlActorSession::RlUpdate(int64_t step, const v1::TensorBatch& batch) {
  if (rl_.group_size() == 0) return absl::FailedPreconditionError("RlUpdate: the session is not a grpo or ppo session");
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("RlUpdate: step ", step));
  const int64_t want = int64_t(rl_.prompts_per_step() / dps_) * rl_.group_size();
  TESSERA_ASSIGN_OR_RETURN(engine::Rollouts got, RolloutsOfBatch(batch, want, model_->config().vocab, "RlUpdate"));
  // What other groups and the driver made: the reference group's log-probs; with a
  // critic group, the old log-probs and PPO's advantages.
  TESSERA_ASSIGN_OR_RETURN(const bool has_ref, TakeTokenTensor(batch, kRefLogp, got.samples, &engine::RlSample::ref_logp));
  if (!has_ref && reference_ == nullptr && (rl_.kl_coef() > 0 || rl_.kl_reward_coef() > 0))
    return absl::InvalidArgumentError(absl::StrCat("RlUpdate: the samples carry no ", kRefLogp, " and the actor has no reference"));
  if (rl_.tis_cap() > 0) {  // the rollout engine's log-probs, for the importance weights
    TESSERA_ASSIGN_OR_RETURN(const bool has, TakeTokenTensor(batch, kRolloutLogp, got.samples, &engine::RlSample::rollout_logp));
    if (!has) return absl::InvalidArgumentError(absl::StrCat("RlUpdate: rl.tis_cap needs the samples' ", kRolloutLogp));
  }
  const bool critic_group = ppo_ && critic_ == nullptr;
  if (critic_group)
    for (auto [name, field] : {std::pair{kOldLogp, &engine::RlSample::old_logp}, std::pair{kAdvantage, &engine::RlSample::advantage}}) {
      TESSERA_ASSIGN_OR_RETURN(const bool has, TakeTokenTensor(batch, name, got.samples, field));
      if (!has) return absl::InvalidArgumentError(absl::StrCat("RlUpdate: with a critic group the samples carry ", name));
    }
  backend_->allocator()->ResetPeak();
  v1::RlUpdateResponse r;
  r.set_step(step);
  r.set_samples(static_cast<int64_t>(got.samples.size()));
  TESSERA_ASSIGN_OR_RETURN(const engine::PpoOptions ppo_options, PpoOpts());
  if (critic_group) {
    TESSERA_ASSIGN_OR_RETURN(engine::PpoStats st, engine::PpoActorUpdate(*trainer_, got, ppo_options));
    r.set_reward(st.reward), r.set_response_length(st.response_length);
    r.set_loss(st.loss), r.set_kl(st.kl), r.set_clip_fraction(st.clip_fraction), r.set_entropy(st.entropy);
    r.set_grad_norm(st.grad_norm), r.set_tis_weight(st.tis_weight);
    r.set_update_s(st.update_s);
  } else if (critic_ != nullptr) {
    TESSERA_ASSIGN_OR_RETURN(engine::PpoStats st, engine::PpoUpdate(*model_, *trainer_, *critic_, *critic_trainer_,
                                                                    reference_.get(), got, ppo_options));
    r.set_reward(st.reward), r.set_response_length(st.response_length);
    r.set_loss(st.loss), r.set_kl(st.kl), r.set_clip_fraction(st.clip_fraction), r.set_entropy(st.entropy);
    r.set_grad_norm(st.grad_norm), r.set_tis_weight(st.tis_weight);
    r.set_ref_s(st.ref_s), r.set_old_s(st.old_s), r.set_update_s(st.update_s);
    v1::CriticStats& c = *r.mutable_critic();
    c.set_value_loss(st.value_loss), c.set_value_clip_fraction(st.value_clip_fraction), c.set_value(st.value);
    c.set_grad_norm(st.critic_grad_norm), c.set_reward_kl(st.reward_kl);
    c.set_values_s(st.values_s), c.set_update_s(st.critic_s);
  } else {
    engine::GrpoOptions o;
    o.group_size = rl_.group_size();
    o.sampling = Sampling(), o.loss = ppo_options.loss;
    TESSERA_ASSIGN_OR_RETURN(o.advantages, OutcomeAdvantagesOf(rl_));
    o.overlong = ppo_options.overlong;
    o.epochs = rl_.epochs(), o.mini_batches = rl_.mini_batches();
    o.max_tokens_per_micro_batch = rl_.max_tokens_per_micro_batch();
    TESSERA_ASSIGN_OR_RETURN(engine::GrpoStats st, engine::GrpoUpdate(*model_, *trainer_, reference_.get(), got, o));
    r.set_reward_kl(st.reward_kl);
    r.set_reward(st.reward), r.set_response_length(st.response_length);
    r.set_loss(st.loss), r.set_kl(st.kl), r.set_clip_fraction(st.clip_fraction), r.set_entropy(st.entropy);
    r.set_grad_norm(st.grad_norm), r.set_tis_weight(st.tis_weight);
    r.set_ref_s(st.ref_s), r.set_old_s(st.old_s), r.set_update_s(st.update_s);
  }
  r.set_memory_peak_bytes(backend_->allocator()->stats().peak_bytes);
  TESSERA_ASSIGN_OR_RETURN(const double checkpoint_secs, SaveAfter(step + 1));
  if (checkpoint_secs >= 0) r.set_checkpoint_seconds(checkpoint_secs);
  return r;
}

// ppo: the critic under dir/critic, same step, before the actor's checkpoint.
absl::Status RlActorSession::SaveCompanions(int64_t done) {
  if (critic_ == nullptr) return absl::OkStatus();
  return checkpoint::SaveCheckpoint(checkpoint_.dir() + "/critic", done,
                                    {critic_.get(), critic_trainer_.get(), tp_, dp_, nullptr}, checkpoint_.keep());
}

// The rl section's sampling and actor-loss settings, shared by grpo and ppo.
engine::SamplingParams RlActorSession::Sampling() const {
  engine::SamplingParams p;
  p.temperature = static_cast<float>(rl_.temperature());
  p.max_new_tokens = rl_.max_new_tokens();
  p.stop_tokens = prompts_.stop_tokens();
  return p;
}

absl::StatusOr<engine::PpoOptions> RlActorSession::PpoOpts() const {
  engine::PpoOptions o;
  o.samples_per_prompt = rl_.group_size();
  o.sampling = Sampling();
  TESSERA_ASSIGN_OR_RETURN(o.loss, PolicyLossOf(rl_));
  o.kl_reward_coef = rl_.kl_reward_coef();
  TESSERA_ASSIGN_OR_RETURN(o.kl_reward, KlRewardEstimatorOf(rl_));
  o.overlong = OverlongOf(rl_);
  o.gamma = rl_.gamma(), o.lambda = rl_.gae_lambda(), o.value_clip = rl_.value_clip();
  o.epochs = rl_.epochs(), o.mini_batches = rl_.mini_batches();
  o.max_tokens_per_micro_batch = rl_.max_tokens_per_micro_batch();
  return o;
}

void RlActorSession::ReleaseForOffload(std::vector<runtime::Tensor>* states) {
  if (rollout_ != nullptr) rollout_->ReleaseCache();
  TrainSession::ReleaseForOffload(states);
  if (reference_ != nullptr) reference_->AppendStates(states);
  if (critic_trainer_ != nullptr) critic_trainer_->AppendStates(states);
  else if (critic_ != nullptr) critic_->AppendStates(states);
}

absl::StatusOr<v1::RlForwardStats> RlActorSession::Forward(int64_t step, const v1::TensorBatch& samples, v1::TensorBatch* out) {
  if (rl_.group_size() == 0) return absl::FailedPreconditionError("RlForward: the session is not a grpo or ppo session");
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("RlForward: step ", step));
  const int64_t want = int64_t(rl_.prompts_per_step() / dps_) * rl_.group_size();
  TESSERA_ASSIGN_OR_RETURN(v1::RlForwardStats st, ForwardSamples(*model_, trainer_.get(), *backend_, rl_, want, samples, kOldLogp, out));
  if (reference_ == nullptr) return st;
  // The actor's own reference (no reference group): its log-probs go with the old ones.
  TESSERA_ASSIGN_OR_RETURN(v1::RlForwardStats ref, ForwardSamples(*reference_, trainer_.get(), *backend_, rl_, want, samples, kRefLogp, out));
  st.set_seconds(st.seconds() + ref.seconds());
  st.set_memory_peak_bytes(std::max(st.memory_peak_bytes(), ref.memory_peak_bytes()));
  return st;
}

absl::StatusOr<v1::RlEvalResponse> RlActorSession::RlEval(int64_t problems) {
  if (rollout_ == nullptr) return absl::FailedPreconditionError("RlEval: the session has no rollout engine");
  auto got = HeldOutEval(*rollout_, prompts_, env_.get(), rl_.max_new_tokens(), problems, dp_rank_, dps_);
  rollout_->ReleaseCache();  // as RolloutGenerate
  return got;
}

}  // namespace tessera::executor
