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

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "tessera/v1/common.pb.h"
#include "worker/engine/data.h"
#include "worker/engine/trainer.h"
#include "worker/executor/executor.h"

namespace tessera::executor {

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

 private:
  TrainSession() = default;
  absl::Status Resume(const v1::CheckpointSpec& ck);
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
  bool first_replica_ = false;  // TP rank 0 of DP x CP rank 0: writes the export
  int64_t total_steps_ = 0, start_step_ = 0;
};

}  // namespace tessera::executor
