// The training session of pretrain and sft jobs (train_session.h): the built-in data
// (engine::ArithmeticData; sft takes the loss on the answers only) or train.data's JSONL
// file, this data-parallel rank's micro-batches of each step, split for context
// parallelism and padded for sequence parallelism. Call: TrainStep, once per step.
#pragma once

#include <memory>

#include "tessera/v1/executor_service.pb.h"
#include "worker/executor/train_session.h"
#include "worker/train/data.h"

namespace tessera::executor {

class PretrainSession final : public TrainSession {
 public:
  static absl::StatusOr<std::unique_ptr<PretrainSession>> Create(const v1::JobSpec& spec, GroupComms& comms,
                                                                 v1::DeviceType device, int device_index);
  // One optimizer step and its statistics (v1::TrainStepResponse): the global loss,
  // grad_norm, lr, tokens (global); this rank's seconds, model_flops, peak_flops and
  // memory_peak_bytes; checkpoint_seconds when it saved. Steps are 0-based here (step s
  // makes the trainer's step count s + 1) and must follow on from start_step():
  // FAILED_PRECONDITION otherwise.
  absl::StatusOr<v1::TrainStepResponse> Step(int64_t step);

 private:
  PretrainSession() = default;
  engine::ArithmeticData data_;
  std::unique_ptr<engine::JsonlData> jsonl_;  // train.data.kind jsonl
  int64_t micro_per_rank_ = 0, micro_per_step_ = 0, first_micro_ = 0;
  int sequences_ = 0;
  int64_t pad_to_ = 1;
  double peak_flops_ = 0;  // this rank's device, dense, for its compute dtype (0: unknown)
  int tp_size_ = 1;        // micro-batches padded to a multiple of this many tokens (tp under SP)
  int cp_ = 1, cp_rank_ = 0;  // context parallelism: this rank's split of every micro-batch
};

}  // namespace tessera::executor
