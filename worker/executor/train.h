// The executor side of pretrain jobs: one training session per worker group on this
// executor — a backend on the executor's device, the Llama sharded over the group's TP
// communicator, the Trainer reducing over its DP x CP communicator, and the built-in
// data for this data-parallel rank. Calls: TrainInit (once), TrainStep (per step).
// Checkpoints (train.checkpoint): at creation the session resumes from the directory's
// latest checkpoint (or starts from `load`), in any layout; after every save_every-th
// and the last step every rank saves its shard (worker/checkpoint/checkpoint.h).
// model.hf_dir starts from a Hugging Face directory, train.export_hf writes one after the
// last step (bf16), train.recompute turns on activation recomputation.
//
// Threading: the driver calls one method at a time per executor.
#pragma once

#include "worker/tokenizer/model_text.h"
#include "worker/executor/rl_prompts.h"

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tessera/v1/common.pb.h"
#include "tessera/v1/executor_service.pb.h"
#include "tessera/v1/reward_service.grpc.pb.h"
#include "worker/train/data.h"
#include "worker/rl/grpo.h"
#include "worker/rl/ppo.h"
#include "worker/rl/rl_samples.h"
#include "worker/rollout/rollout.h"
#include "worker/train/trainer.h"
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
  // One optimizer step and its statistics (v1::TrainStepResponse): the global loss,
  // grad_norm, lr, tokens (global); this rank's seconds, model_flops, peak_flops and
  // memory_peak_bytes; checkpoint_seconds when it saved. Steps are 0-based here (step s
  // makes the trainer's step count s + 1) and must follow on from start_step():
  // FAILED_PRECONDITION otherwise.
  absl::StatusOr<v1::TrainStepResponse> Step(int64_t step);
  // The next step (Step or RlUpdate) saves a checkpoint whatever save_every says
  // (the driver's save when a node of the job is leaving; needs train.checkpoint.dir).
  void RequestSave() { save_requested_ = true; }
  // The step count of the checkpoint the session started from (0: none).
  int64_t start_step() const { return start_step_; }
  // grpo and ppo jobs (source: rl_step.cc). At creation: the frozen reference (the
  // starting weights: a train.checkpoint.load warm start or the initialization), ppo's
  // critic, and — when the job has no rollout group — a rollout engine on the actor's own
  // model. With train.checkpoint.dir, a checkpoint after every save_every steps and the
  // last one, named by the RL step (step + 1), and a resumed session (start_step() = N)
  // loads the directory's latest into the actor — weights, AdamW moments, the optimizer's
  // step count (N x epochs x mini-batches) — while the reference stays the warm start:
  // steps N.. then repeat an uninterrupted run's.
  //
  // Whether the session generates its own samples (no rollout group in the job).
  bool has_rollout() const { return rollout_ != nullptr; }
  // RL step `step`'s samples of this DP rank, from the session's own rollout engine
  // (GenerateSamples, rollout_pool.h); FAILED_PRECONDITION without one.
  absl::StatusOr<v1::RolloutStats> RolloutGenerate(int64_t step, v1::TensorBatch* out);
  // Greedy exact-match accuracy of the current policy on this DP rank's share of
  // held-out problems [0, problems) (engine::ArithmeticData::held_out: operand pairs
  // that no job trains on), from the session's own rollout engine.
  absl::StatusOr<v1::RlEvalResponse> RlEval(int64_t problems);
  // The update of RL step `step` (advantages, reference and old log-probs, the epochs of
  // mini-batch updates — engine::GrpoUpdate, or engine::PpoUpdate with the critic — and
  // the checkpoint) on this DP rank's samples (rollout_pool.h has the batch's tensors).
  // INVALID_ARGUMENT for a malformed batch or the wrong number of samples.
  absl::StatusOr<v1::RlUpdateResponse> RlUpdate(int64_t step, const v1::TensorBatch& batch);
  model::Llama& model() { return *model_; }
  runtime::Backend& backend() { return *backend_; }
  // Before reading the model's parameter values outside a step (a weight sync, a digest):
  // The whole values on the model where the trainer keeps slices (engine::Trainer::
  // GatherParams; every DP rank calls it).
  absl::Status GatherParams() { return trainer_->GatherParams(); }

 private:
  TrainSession() = default;
  absl::Status Resume(const v1::CheckpointSpec& ck);
  absl::StatusOr<double> SaveAfter(int64_t done);
  bool save_requested_ = false;
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
  RlPrompts prompts_;
  std::string job_name_;
  std::unique_ptr<RewardServiceClient> rewards_;  // rl.reward_service (null: the built-in verifier)
  engine::SamplingParams Sampling() const;
  rl::PolicyLossOptions PolicyLoss() const;
  engine::PpoOptions PpoOpts() const;
};

}  // namespace tessera::executor
