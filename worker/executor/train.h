// The executor side of pretrain jobs: one training session per worker group on this
// executor — a backend on the executor's device, the Llama sharded over the group's TP
// communicator, the Trainer reducing over its DP x CP communicator, and the built-in
// data for this data-parallel rank. Calls: train_init (once), train_step (per step).
// Checkpoints (train.checkpoint): at creation the session resumes from the directory's
// latest checkpoint (or starts from `load`), in any layout; after every save_every-th
// and the last step every rank saves its shard (worker/checkpoint/checkpoint.h).
// model.hf_dir starts from a Hugging Face directory, train.export_hf writes one after the
// last step (bf16), train.recompute turns on activation recomputation.
//
// Threading: the driver calls one method at a time per executor.
#pragma once

#include "worker/tokenizer/model_text.h"

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tessera/v1/common.pb.h"
#include "tessera/v1/reward_service.grpc.pb.h"
#include "worker/engine/data.h"
#include "worker/engine/grpo.h"
#include "worker/engine/rollout.h"
#include "worker/engine/trainer.h"
#include "worker/executor/executor.h"

namespace tessera::executor {

// The model's dims (the job's model section, or model.hf_dir's config.json) and compute
// dtype (train.precision; auto: bf16 on GPUs, f32 on the CPU).
absl::StatusOr<model::LlamaConfig> ModelConfigFromSpec(const v1::JobSpec& spec, v1::DeviceType device);
// The model's text side (model.tokenizer; default model.hf_dir's tokenizer.json when it
// has one, else the byte tokenizer). Errors name model.tokenizer; a tokenizer with more
// tokens than the model's vocabulary is refused.
absl::StatusOr<tokenizer::ModelText> ModelTextFromSpec(const v1::ModelShape& m, int64_t model_vocab);

class TrainSession {
 public:
  static absl::StatusOr<std::unique_ptr<TrainSession>> Create(const v1::JobSpec& spec, GroupComms& comms,
                                                              v1::DeviceType device, int device_index);
  // One optimizer step; its statistics as JSON: loss, grad_norm, lr, tokens (global),
  // seconds, model_flops (this rank's share) and memory_peak_bytes (this rank's backend).
  // Steps are 0-based here (step s makes the trainer's step count s + 1) and must follow
  // on from start_step(): FAILED_PRECONDITION otherwise.
  absl::StatusOr<std::string> Step(int64_t step);
  // The step count of the checkpoint the session started from (0: none).
  int64_t start_step() const { return start_step_; }
  // grpo and ppo jobs (source: rl_step.cc): GRPO step `step` (0-based; any order) on this DP
  // rank's share of the step's arithmetic problems — engine::GrpoStep with an
  // exact-match reward, the frozen reference made at creation (the starting weights: a
  // train.checkpoint.load warm start or the initialization). Its statistics as JSON:
  // reward (= accuracy of the samples), response_length, loss, kl, clip_fraction,
  // grad_norm, samples, the phase times generate_s, ref_s, old_s, update_s, and
  // checkpoint_seconds (-1: none). With train.checkpoint.dir, a checkpoint after every
  // save_every steps and the last one, named by the GRPO step (step + 1), and a resumed
  // session (start_step() = N) loads the directory's latest into the actor — weights,
  // AdamW moments, the optimizer's step count (N x epochs x mini-batches) — while the
  // reference stays the warm start: steps N.. then repeat an uninterrupted run's.
  // ppo jobs: engine::PpoStep instead, with the critic (checkpointed under dir/critic,
  // saved before the actor and resumed at the actor's step); the JSON
  // also has value_loss, value_clip_fraction, value, critic_grad_norm, values_s, critic_s.
  absl::StatusOr<std::string> RlStep(int64_t step);
  // grpo jobs: greedy exact-match accuracy of the current policy on this DP rank's share
  // of held-out problems [0, problems) (engine::ArithmeticData::held_out: operand pairs
  // that no job trains on): {"correct": k, "problems": m} for this rank's m problems.
  absl::StatusOr<std::string> RlEval(int64_t problems);

 private:
  TrainSession() = default;
  absl::Status Resume(const v1::CheckpointSpec& ck);
  absl::StatusOr<double> SaveAfter(int64_t done);
  absl::Status MakeRl(const v1::JobSpec& spec, int dp_rank, int dps, const engine::OptimizerOptions& actor_options);
  std::unique_ptr<runtime::Backend> backend_;
  std::unique_ptr<model::Llama> model_;
  std::unique_ptr<engine::Trainer> trainer_;
  engine::ArithmeticData data_;
  std::unique_ptr<engine::JsonlData> jsonl_;  // train.data.kind jsonl
  int64_t micro_per_rank_ = 0, micro_per_step_ = 0, first_micro_ = 0;
  int sequences_ = 0;
  int64_t pad_to_ = 1;
  double peak_flops_ = 0;  // this rank's device, dense, for its compute dtype (0: unknown)
  int tp_size_ = 1;  // micro-batches padded to a multiple of this many tokens (tp under SP)
  int cp_ = 1, cp_rank_ = 0;  // context parallelism: this rank's split of every micro-batch
  comm::Communicator* tp_ = nullptr;
  comm::Communicator* dp_ = nullptr;
  comm::Communicator* pp_ = nullptr;
  v1::CheckpointSpec checkpoint_;
  std::string export_hf_;      // train.export_hf
  v1::ModelShape model_shape_;  // the job's model section (its tokenizer goes with an export)
  bool first_replica_ = false;  // TP rank 0 of DP x CP rank 0: writes the export
  int64_t total_steps_ = 0, start_step_ = 0;
  // grpo
  v1::RlSpec rl_;
  std::unique_ptr<model::Llama> reference_;
  std::unique_ptr<engine::RolloutEngine> rollout_;
  // ppo: the critic (the actor's shape with a value head, started from the actor's
  // weights and a fresh head) and its trainer (rl.critic_lr; the actor's other options).
  std::unique_ptr<model::Llama> critic_;
  std::unique_ptr<engine::Trainer> critic_trainer_;
  int rl_dp_rank_ = 0, rl_dps_ = 1;
  std::vector<engine::PromptAnswer> prompts_;  // train.data.kind jsonl (empty: the arithmetic problems)
  std::vector<std::vector<int32_t>> prompt_ids_;  // prompts_ through the model's tokenizer
  std::vector<std::string> prompt_texts_;         // ... and as text (a conversation: the template's)
  tokenizer::ModelText text_;                     // jsonl: the model's tokenizer; else bytes
  std::vector<int32_t> stop_tokens_;           // rl.stop (one token each), and with a tokenizer.json the EOS ids
  std::string job_name_;
  std::unique_ptr<v1::RewardService::Stub> reward_;  // rl.reward_service (TP rank 0 calls it)
  // The rewards of this rank's completions from the reward service: TP rank 0 calls it
  // and broadcasts the rewards (or the failure) over TP, so TP peers never disagree.
  engine::SamplingParams Sampling() const;
  rl::PolicyLossOptions PolicyLoss() const;
  absl::StatusOr<std::string> PpoStep(int64_t step, const std::vector<std::vector<int32_t>>& prompts,
                                      const engine::BatchRewardFn& reward, uint64_t seed, int64_t per_rank);
  absl::StatusOr<std::vector<double>> ServiceRewards(int64_t step, const std::vector<std::string>& prompts,
                                                     const std::vector<std::string>& answers,
                                                     const std::vector<engine::Completion>& completions,
                                                     const std::vector<std::string>& texts);
  // A completion's text: its tokens decoded without special tokens (bytes for the byte
  // tokenizer); ids past the tokenizer's vocabulary have none.
  std::string CompletionText(const engine::Completion& c) const;
};

}  // namespace tessera::executor
