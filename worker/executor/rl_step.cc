// TrainSession's GRPO half (see train.h): the reference and the rollout engine made at
// creation, and one GRPO step per call.
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "common/rl.h"
#include "common/status.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/rl/grpo.h"
#include "worker/rl/ppo.h"
#include "worker/rollout/weight_sync.h"
#include "worker/executor/train.h"
#include "common/rpc/grpc_util.h"
#include "common/spec/job_spec.h"
#include "worker/executor/rollout_pool.h"
#include "common/util.h"

namespace tessera::executor {

// The starting weights (after a warm start) become the frozen reference: a second model
// of the same layout, filled by a colocated sync (a TP gather per tensor). The optimizer
// (AdamW moments) and the step count start over for GRPO, as an RL actor's do — unless
// the job resumes from its own checkpoint, which then loads over the actor.
absl::Status TrainSession::MakeRl(const v1::JobSpec& spec, int dp_rank, int dps,
                                  const engine::OptimizerOptions& actor_options) {
  rl_ = spec.rl();
  rl_dp_rank_ = dp_rank, rl_dps_ = dps;
  TESSERA_RETURN_IF_ERROR(trainer_->ResetOptimizerState());
  start_step_ = 0;
  if (spec.kind() == "ppo") {  // the critic: the actor's weights (after the warm start) under a fresh value head
    model::LlamaConfig cc = model_->config();
    cc.value_head = true, cc.tie_embeddings = false;
    TESSERA_ASSIGN_OR_RETURN(critic_, model::Llama::Create(cc, backend_.get(), tp_));
    TESSERA_RETURN_IF_ERROR(critic_->InitRandom(spec.train().seed() + 1, 0.02f));
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
  if (rl_.kl_coef() > 0 || rl_.kl_reward_coef() > 0) {
    TESSERA_ASSIGN_OR_RETURN(reference_, model::Llama::Create(model_->config(), backend_.get(), tp_));
    TESSERA_RETURN_IF_ERROR(engine::SyncColocated(*model_, *reference_));
  }
  TESSERA_RETURN_IF_ERROR(prompts_.Load(spec, model_->config().vocab));
  const int64_t longest_prompt = prompts_.longest_prompt();
  engine::RolloutOptions ro;
  const int64_t per_rank = int64_t(rl_.prompts_per_step() / dps) * rl_.group_size();
  ro.max_running = std::max<int64_t>(1, std::min<int64_t>(per_rank, 256));
  ro.block_size = 16;
  const int64_t longest = longest_prompt + rl_.max_new_tokens();  // a prompt and its completion
  ro.num_blocks = ro.max_running * ((longest + ro.block_size - 1) / ro.block_size);
  // With a rollout pool of its own (split pools) the actor generates nothing.
  if (RolloutPool(spec) == nullptr) {
    TESSERA_ASSIGN_OR_RETURN(rollout_, engine::RolloutEngine::Create(model_.get(), ro));
  }
  job_name_ = spec.name();
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
  return absl::OkStatus();
}

absl::StatusOr<std::string> TrainSession::RlStep(int64_t step) {
  if (rollout_ == nullptr)
    return absl::FailedPreconditionError("rl_step: the session has no rollout engine (not a grpo session, or its rollout pool has its own devices)");
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("rl_step: step ", step));
  // This rank's prompts: problems [step * P + rank * P/dp, ...) of the training data
  // (global numbering over all ranks; JSONL prompts cycle through the file), the answer
  // each completion must match.
  const int per_rank = rl_.prompts_per_step() / rl_dps_;
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> texts, answers;  // the prompts' text, and the answer each completion must match
  for (int i = 0; i < per_rank; ++i) {
    RlPrompts::Prompt p = prompts_.At(step * rl_.prompts_per_step() + rl_dp_rank_ * per_rank + i);
    prompts.push_back(std::move(p.ids));
    texts.push_back(std::move(p.text));
    answers.push_back(std::move(p.answer));
  }
  const engine::BatchRewardFn reward = [&](const std::vector<engine::Completion>& cs) -> absl::StatusOr<std::vector<double>> {
    std::vector<std::string> done;
    for (const engine::Completion& c : cs) done.push_back(prompts_.CompletionText(c.tokens));
    if (rewards_ != nullptr) return rewards_->Score(step, rl_dp_rank_, texts, answers, cs, done);
    std::vector<double> r;  // built in: exact match of the answer (JSONL: of the extracted final answer)
    for (size_t i = 0; i < cs.size(); ++i) r.push_back(prompts_.Reward(done[i], answers[cs[i].request]));
    return r;
  };
  const uint64_t seed = static_cast<uint64_t>(step) * 1009 + rl_dp_rank_;
  if (critic_ != nullptr) return PpoStep(step, prompts, reward, seed, per_rank);
  engine::GrpoOptions o;
  o.group_size = rl_.group_size();
  o.sampling = Sampling(), o.loss = PolicyLoss();
  o.epochs = rl_.epochs(), o.mini_batches = rl_.mini_batches();
  TESSERA_ASSIGN_OR_RETURN(engine::GrpoStats st,
                           engine::GrpoStep(*rollout_, *model_, *trainer_, reference_.get(), prompts, reward, o, seed));
  TESSERA_ASSIGN_OR_RETURN(const double checkpoint_secs, SaveAfter(step + 1));
  return nlohmann::json{{"step", step},
                        {"reward", st.reward},
                        {"response_length", st.response_length},
                        {"loss", st.loss},
                        {"kl", st.kl},
                        {"clip_fraction", st.clip_fraction},
                        {"entropy", st.entropy},
                        {"grad_norm", st.grad_norm},
                        {"samples", per_rank * rl_.group_size()},
                        {"generate_s", st.generate_s},
                        {"ref_s", st.ref_s},
                        {"old_s", st.old_s},
                        {"update_s", st.update_s},
                        {"checkpoint_seconds", checkpoint_secs}}
      .dump();
}

absl::StatusOr<std::string> TrainSession::RlUpdate(int64_t step, const v1::TensorBatch& batch) {
  if (rl_.group_size() == 0) return absl::FailedPreconditionError("rl_update: the session is not a grpo session");
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("rl_update: step ", step));
  std::vector<std::vector<int32_t>> prompts, completions;
  std::vector<double> rewards;
  TESSERA_RETURN_IF_ERROR(BatchToSamples(batch, &prompts, &completions, &rewards));
  const int64_t want = int64_t(rl_.prompts_per_step() / rl_dps_) * rl_.group_size();
  if (static_cast<int64_t>(prompts.size()) != want)
    return absl::InvalidArgumentError(absl::StrCat("rl_update: ", prompts.size(), " samples; this DP rank trains on ", want));
  const int64_t vocab = model_->config().vocab;
  for (const auto* rows : {&prompts, &completions})
    for (const auto& r : *rows)
      for (int32_t t : r)
        if (t < 0 || t >= vocab) return absl::InvalidArgumentError(absl::StrCat("rl_update: token ", t, " is outside the vocabulary"));
  engine::Rollouts got = engine::MakeRollouts(prompts, completions, rewards);
  if (critic_ != nullptr) return PpoUpdateJson(step, got, static_cast<int64_t>(prompts.size()));
  engine::GrpoOptions o;
  o.group_size = rl_.group_size();
  o.sampling = Sampling(), o.loss = PolicyLoss();
  o.epochs = rl_.epochs(), o.mini_batches = rl_.mini_batches();
  TESSERA_ASSIGN_OR_RETURN(engine::GrpoStats st, engine::GrpoUpdate(*model_, *trainer_, reference_.get(), got, o));
  TESSERA_ASSIGN_OR_RETURN(const double checkpoint_secs, SaveAfter(step + 1));
  return nlohmann::json{{"step", step}, {"reward", st.reward}, {"response_length", st.response_length},
                        {"loss", st.loss}, {"kl", st.kl}, {"clip_fraction", st.clip_fraction},
                        {"entropy", st.entropy}, {"grad_norm", st.grad_norm},
                        {"samples", prompts.size()}, {"ref_s", st.ref_s}, {"old_s", st.old_s},
                        {"update_s", st.update_s}, {"checkpoint_seconds", checkpoint_secs}}
      .dump();
}

// The rl section's sampling and actor-loss settings, shared by grpo and ppo.
engine::SamplingParams TrainSession::Sampling() const {
  engine::SamplingParams p;
  p.temperature = static_cast<float>(rl_.temperature());
  p.max_new_tokens = rl_.max_new_tokens();
  p.stop_tokens = prompts_.stop_tokens();
  return p;
}

rl::PolicyLossOptions TrainSession::PolicyLoss() const {
  rl::PolicyLossOptions l;
  l.kl_coef = rl_.kl_coef();
  l.entropy_coef = rl_.entropy_coef();
  l.clip_low = l.clip_high = rl_.clip();
  return l;
}

engine::PpoOptions TrainSession::PpoOpts() const {
  engine::PpoOptions o;
  o.samples_per_prompt = rl_.group_size();
  o.sampling = Sampling(), o.loss = PolicyLoss();
  o.kl_reward_coef = rl_.kl_reward_coef();
  o.gamma = rl_.gamma(), o.lambda = rl_.gae_lambda(), o.value_clip = rl_.value_clip();
  o.epochs = rl_.epochs(), o.mini_batches = rl_.mini_batches();
  return o;
}

absl::StatusOr<std::string> TrainSession::PpoUpdateJson(int64_t step, engine::Rollouts& got, int64_t samples) {
  TESSERA_ASSIGN_OR_RETURN(engine::PpoStats st, engine::PpoUpdate(*model_, *trainer_, *critic_, *critic_trainer_,
                                                                  reference_.get(), got, PpoOpts()));
  return PpoJson(step, st, samples);
}

absl::StatusOr<std::string> TrainSession::PpoStep(int64_t step, const std::vector<std::vector<int32_t>>& prompts,
                                                  const engine::BatchRewardFn& reward, uint64_t seed, int64_t per_rank) {
  TESSERA_ASSIGN_OR_RETURN(engine::PpoStats st, engine::PpoStep(*rollout_, *model_, *trainer_, *critic_, *critic_trainer_,
                                                                reference_.get(), prompts, reward, PpoOpts(), seed));
  return PpoJson(step, st, per_rank * rl_.group_size());
}

absl::StatusOr<std::string> TrainSession::PpoJson(int64_t step, const engine::PpoStats& st, int64_t samples) {
  TESSERA_ASSIGN_OR_RETURN(const double checkpoint_secs, SaveAfter(step + 1));
  // grpo's fields (the same names and meanings) and the critic's.
  return nlohmann::json{{"step", step}, {"reward", st.reward}, {"response_length", st.response_length},
                        {"loss", st.loss}, {"kl", st.kl}, {"clip_fraction", st.clip_fraction},
                        {"entropy", st.entropy}, {"grad_norm", st.grad_norm}, {"value_loss", st.value_loss},
                        {"value_clip_fraction", st.value_clip_fraction}, {"value", st.value},
                        {"critic_grad_norm", st.critic_grad_norm}, {"reward_kl", st.reward_kl},
                        {"samples", samples},
                        {"generate_s", st.generate_s}, {"ref_s", st.ref_s}, {"old_s", st.old_s},
                        {"values_s", st.values_s}, {"update_s", st.update_s}, {"critic_s", st.critic_s},
                        {"checkpoint_seconds", checkpoint_secs}}
      .dump();
}

}  // namespace tessera::executor

namespace tessera::executor {

absl::StatusOr<std::string> TrainSession::RlEval(int64_t problems) {
  if (rollout_ == nullptr) return absl::FailedPreconditionError("rl_eval: the session has no rollout engine");
  return HeldOutEval(*rollout_, prompts_, rl_.max_new_tokens(), problems, rl_dp_rank_, rl_dps_);
}

}  // namespace tessera::executor
