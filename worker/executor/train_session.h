// The executor side of a training worker group: one session per group on this executor,
// of the job's kind — PretrainSession (pretrain, sft: pretrain_session.h) or
// RlActorSession (the actor of grpo and ppo: rl_actor_session.h) — or of its role in an
// RL job (RlReferenceSession, RlCriticSession: rl_role_sessions.h). What they share lives
// here: a backend on the executor's device, the Llama sharded over the group's TP
// communicator (and its pipeline stage), the Trainer reducing over its DP x CP
// communicator, and checkpoints (train.checkpoint: after every save_every-th and the
// last step every rank saves its shard, worker/checkpoint/checkpoint.h) and the Hugging
// Face export after the last step (train.export_hf, bf16, with the tokenizer's files).
// model.hf_dir starts from a Hugging Face directory; train.recompute and
// train.recompute_swiglu turn on activation recomputation.
//
// Threading: the driver calls one method at a time per executor.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tessera/v1/common.pb.h"
#include "worker/executor/executor.h"
#include "worker/train/trainer.h"

namespace tessera::executor {

class TrainSession {
 public:
  // The session of the job's kind: pretrain and sft make a PretrainSession, grpo and ppo
  // an RlActorSession. Each starts from model.hf_dir, a checkpoint (its own directory's
  // latest when resuming, else train.checkpoint.load) or a seeded initialization.
  static absl::StatusOr<std::unique_ptr<TrainSession>> Create(const v1::JobSpec& spec, GroupComms& comms,
                                                              v1::DeviceType device, int device_index);
  virtual ~TrainSession() = default;

  // The job kind trained ("pretrain", "sft", "grpo", "ppo").
  const std::string& kind() const { return kind_; }
  // The step count of the checkpoint the session started from (0: none).
  int64_t start_step() const { return start_step_; }
  // The next step saves a checkpoint whatever save_every says (the driver's save when a
  // node of the job is leaving; needs train.checkpoint.dir).
  void RequestSave() { save_requested_ = true; }
  model::Llama& model() { return *model_; }
  runtime::Backend& backend() { return *backend_; }
  // Before reading the model's parameter values outside a step (a weight sync, a
  // digest): the whole values on the model where the trainer keeps slices
  // (engine::Trainer::GatherParams; every DP rank calls it).
  absl::Status GatherParams() { return trainer_ != nullptr ? trainer_->GatherParams() : absl::OkStatus(); }
  // While another group of its devices runs (groups[].offload): what the session keeps on
  // its device between calls — the model's and the optimizer's states (Trainer::
  // AppendStates), and a kind's companions (the actor's own reference and critic) — for
  // the executor to park in host memory (runtime::HostOffload); first, whatever holds
  // those tensors' addresses (a rollout engine's KV cache and decode graphs) is released.
  virtual void ReleaseForOffload(std::vector<runtime::Tensor>* states);

 protected:
  TrainSession() = default;
  // The backend, the model (its weights from model.hf_dir or the seed) and — with
  // `make_trainer` — the trainer; then the starting checkpoint of `start` (Resume; without
  // a trainer, its weights only). `o` gets the optimizer's options.
  absl::Status Init(const v1::JobSpec& spec, GroupComms& comms, v1::DeviceType device, int device_index,
                    const v1::CheckpointSpec& start, engine::OptimizerOptions* o, bool make_trainer = true);
  // The directory's latest checkpoint if resuming and there is one, else `load` (a step-N
  // directory, or a checkpoint directory whose latest is taken); sets start_step().
  absl::Status Resume(const v1::CheckpointSpec& ck);
  // After `done` steps (of total_steps_): a checkpoint every save_every steps, after the
  // last and when RequestSave() asked for one, named by `done`; the Hugging Face export
  // after the last. Returns the checkpoint's seconds (-1: none this step).
  absl::StatusOr<double> SaveAfter(int64_t done);
  // What a kind saves beside the model's checkpoint of step `done`, before it (so that
  // the model's `latest` never names a step whose companion is missing).
  virtual absl::Status SaveCompanions(int64_t /*done*/) { return absl::OkStatus(); }

  std::string kind_;
  std::unique_ptr<runtime::Backend> backend_;
  std::unique_ptr<model::Llama> model_;
  std::unique_ptr<engine::Trainer> trainer_;
  comm::Communicator* tp_ = nullptr;
  comm::Communicator* dp_ = nullptr;  // DP x CP: the gradient reduction
  comm::Communicator* cp_comm_ = nullptr;
  comm::Communicator* pp_ = nullptr;
  int dp_rank_ = 0, dps_ = 1;  // this rank's data-parallel index (CP peers share it) and the DP size
  v1::CheckpointSpec checkpoint_;
  int64_t total_steps_ = 0, start_step_ = 0;
  std::string export_hf_;       // train.export_hf

 private:
  bool save_requested_ = false;
  v1::ModelShape model_shape_;  // the job's model section (its tokenizer goes with an export)
  bool first_replica_ = false;  // TP rank 0 of DP x CP rank 0: writes the export
};

}  // namespace tessera::executor
