// What an RL step's per-token tensors look like on the wire, beside the samples'
// (rollout_pool.h: prompt, completion, reward, and multi-turn completion_mask): each is
// [N, W] f32, W the batch's completion width, row i the values at sample i's response
// tokens in order (its sampled tokens: completion_len[i] of them, fewer where observations
// are masked out), 0 after:
//   old_logp   the actor's log-probs before the update (RlForward on the actor)
//   ref_logp   the reference's (RlForward on a reference group)
//   old_value  the critic's values (RlForward on a critic group)
//   advantage, returns   PPO's, made by the driver (rl::ComputePpoAdvantages)
//   rollout_logp  the rollout engine's log-probs of the sampled tokens (RolloutGenerate;
//                 rl.tis_cap's importance weights)
// The actor's RlUpdate takes ref_logp (and, with a critic group, old_logp and advantage)
// instead of making them; a critic group's RlUpdate takes old_value and returns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/v1/common.pb.h"
#include "tessera/v1/executor_service.pb.h"
#include "worker/model/llama.h"
#include "worker/rl/rl_samples.h"
#include "worker/runtime/backend.h"
#include "worker/train/trainer.h"

namespace tessera::executor {

inline constexpr char kOldLogp[] = "old_logp";
inline constexpr char kRefLogp[] = "ref_logp";
inline constexpr char kOldValue[] = "old_value";
inline constexpr char kAdvantage[] = "advantage";
inline constexpr char kRolloutLogp[] = "rollout_logp";
inline constexpr char kReturns[] = "returns";
// Multi-turn samples: [N, W] i32 over the completion's tokens, 1 where the model sampled the
// token, 0 where it is an environment's observation (out of the loss and the log-probs; the
// token tensors above skip it). Absent: every token sampled.
inline constexpr char kCompletionMask[] = "completion_mask";
// A reward group's answer: one score per sample, [N] f32 (it replaces the samples' reward).
inline constexpr char kScore[] = "score";

// The samples of a batch (BatchToSamples) as engine::Rollouts, checked: `want` samples,
// every token inside the vocabulary; INVALID_ARGUMENT naming `op` otherwise.
absl::StatusOr<engine::Rollouts> RolloutsOfBatch(const v1::TensorBatch& batch, int64_t want, int64_t vocab, const char* op);

// Tensor `name` of the samples' `field` at their response tokens, rows `width` wide.
v1::NamedTensor TokenTensor(const std::string& name, const std::vector<engine::RlSample>& samples,
                            std::vector<double> engine::RlSample::*field, int64_t width);
// Tensor `name` of `batch` into samples[i].*field (0 off the response tokens): false when
// the batch has no such tensor; INVALID_ARGUMENT for one of another shape or dtype.
absl::StatusOr<bool> TakeTokenTensor(const v1::TensorBatch& batch, const std::string& name,
                                     std::vector<engine::RlSample>& samples, std::vector<double> engine::RlSample::*field);

// RlForward on one rank: `model`'s log-probs (or, with a value head, values) of the
// batch's samples, micro-batched as the update plans them (rl.mini_batches,
// rl.max_tokens_per_micro_batch; `trainer` makes the DP ranks agree on the count, null:
// this rank alone), as tensor `name` of `out`.
absl::StatusOr<v1::RlForwardStats> ForwardSamples(model::Llama& model, engine::Trainer* trainer, runtime::Backend& backend,
                                                  const v1::RlSpec& rl, int64_t want, const v1::TensorBatch& batch,
                                                  const std::string& name, v1::TensorBatch* out);

}  // namespace tessera::executor
