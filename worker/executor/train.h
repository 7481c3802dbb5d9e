// The executor side of pretrain jobs: one training session per worker group on this
// executor — a backend on the executor's device, the Llama sharded over the group's TP
// communicator, the Trainer reducing over its DP x CP communicator, and the built-in
// data for this data-parallel rank. Calls: train_init (once), train_step (per step).
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
  absl::StatusOr<std::string> Step(int64_t step);

 private:
  TrainSession() = default;
  std::unique_ptr<runtime::Backend> backend_;
  std::unique_ptr<model::Llama> model_;
  std::unique_ptr<engine::Trainer> trainer_;
  engine::ArithmeticData data_;
  int64_t micro_per_rank_ = 0, micro_per_step_ = 0, first_micro_ = 0;
  int sequences_ = 0;
  int64_t pad_to_ = 1;
  int tp_size_ = 1;  // micro-batches padded to a multiple of this many tokens (tp under SP)
};

}  // namespace tessera::executor
