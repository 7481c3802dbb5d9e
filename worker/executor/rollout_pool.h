// Split pools (docs/design.md §7): a grpo job whose rollout group has its own devices.
// The rollout pool's executors hold the model (their own TP layout), the rollout engine
// and the prompts; the actor's executors train on what the pool generates; after every
// update the actor's weights go to the pool over a `bridge` communicator spanning both
// groups (actor ranks first, then rollout ranks), built when the job starts.
//
// The samples travel through the driver as a TensorBatch, whole groups in prompt order:
//   prompt [N, Lp] i32 and prompt_len [N]; completion [N, Lc] i32 and completion_len [N]
//   (rows padded with 0); reward [N] f32 — N = prompts x group_size; multi-turn samples
//   also completion_mask [N, Lc] i32 (rl_batch.h).
// Threading: one call at a time (the executor serializes them).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/v1/common.pb.h"
#include "tessera/v1/executor_service.pb.h"
#include "worker/rl/rl_samples.h"
#include "worker/rollout/rollout.h"
#include "worker/executor/environment_client.h"
#include "worker/executor/executor.h"
#include "worker/executor/rl_prompts.h"

namespace tessera::executor {

class RolloutPoolSession {
 public:
  static absl::StatusOr<std::unique_ptr<RolloutPoolSession>> Create(const v1::JobSpec& spec, GroupComms& comms,
                                                                    v1::DeviceType device, int device_index);
  // RL step `step`'s samples of this pool DP rank (GenerateSamples below, seeded as the
  // actor's DP ranks would); every TP rank returns them. On the actor's devices
  // (colocate_with) the KV cache is released after it and after Eval: training runs next.
  absl::StatusOr<v1::RolloutStats> Generate(int64_t step, int refill, v1::TensorBatch* out);
  // Greedy accuracy on this pool DP rank's share of the held-out problems (HeldOutEval).
  absl::StatusOr<v1::RlEvalResponse> Eval(int64_t problems);
  model::Llama& model() { return *model_; }
  runtime::Backend& backend() { return *backend_; }
  // While another group of its devices runs (groups[].offload): the rollout model's
  // tensors, for the executor to park in host memory (runtime::HostOffload), after the
  // KV cache and the decode graphs that point into the model are released.
  void ReleaseForOffload(std::vector<runtime::Tensor>* states);

 private:
  RolloutPoolSession() = default;
  v1::RlSpec rl_;
  int actor_dps_ = 1, dp_rank_ = 0, dps_ = 1;
  std::unique_ptr<runtime::Backend> backend_;
  std::unique_ptr<model::Llama> model_;
  std::unique_ptr<engine::RolloutEngine> rollout_;
  RlPrompts prompts_;
  std::unique_ptr<RewardServiceClient> rewards_;  // rl.reward_service (null: the built-in verifier)
  std::unique_ptr<EnvironmentClient> env_;        // rl.environment (null: single-turn)
  bool colocated_ = false;  // on the actor's devices: the KV cache is released after each call
};

// The rollout engine's options for an RL job's step on one of `dps` DP ranks: as many
// samples run at once as the rank has (at most 1024) and the cache's blocks allow, the
// cache at most every one of them at the longest prompt + rl.max_new_tokens, within
// rl.gpu_memory_utilization of the device.
engine::RolloutOptions RlRolloutOptions(const v1::RlSpec& rl, int dps, int64_t longest_prompt);

// One RL step's samples of DP rank `dp_rank` of `dps`: prompts [dp_rank·P/dps, (dp_rank+1)·P/dps)
// of step `step` (P = rl.prompts_per_step; refill k >= 1: the step's k-th refill batch of
// dynamic sampling, RefillPromptIndex), rl.group_size samples each, scored by the
// built-in verifier (of each completion's last model turn) or `rewards` (rl.reward_service;
// TP rank 0 calls it); with `env` (rl.environment) each sample is a multi-turn episode
// (RunEpisodes, environment_client.h). Prompt g of the
// step is sampled with the seed that the actor's DP rank training on it (of `actor_dps`)
// gives it, so a rollout group of any DP size samples what the actor's own engine does.
// The samples as above, rows padded to the longest prompt and rl.max_new_tokens.
absl::StatusOr<v1::RolloutStats> GenerateSamples(engine::RolloutEngine& rollout, const RlPrompts& prompts,
                                                 const v1::RlSpec& rl, RewardServiceClient* rewards, EnvironmentClient* env,
                                                 int64_t step, int refill, int dp_rank, int dps, int actor_dps,
                                                 v1::TensorBatch* out);
// Where refill k >= 1 of step s takes its prompts: a stream of its own past every step's
// (2^40 + (s·rl.max_gen_batches + k - 1)·P; JSONL files cycle), so that a step's prompts
// depend on its step alone (a resumed job draws the same).
int64_t RefillPromptIndex(const v1::RlSpec& rl, int64_t step, int refill);

// The samples' TensorBatch of `rollouts` (prompt ids per sample given) and back.
// Rows are padded to the given widths (at least each row's length), so that every pool
// rank's batch has the same shapes and the driver can concatenate them.
// With `sampled` (multi-turn: per completion token 1 where the model sampled it, 0 for an
// observation; an empty row: all sampled), also completion_mask [N, W] i32 (0 after each
// row's length). With `logprobs` (the rollout's, one per completion token), also
// rollout_logp [N, W] f32 — a token tensor (rl_batch.h): the sampled tokens' in order.
v1::TensorBatch SamplesToBatch(const std::vector<std::vector<int32_t>>& prompts,
                               const std::vector<std::vector<int32_t>>& completions, const std::vector<double>& rewards,
                               size_t prompt_width = 1, size_t completion_width = 1,
                               const std::vector<std::vector<float>>* logprobs = nullptr,
                               const std::vector<std::vector<uint8_t>>* sampled = nullptr);
// INVALID_ARGUMENT naming the tensor for a malformed batch. `sampled` (optional): each
// row's completion_mask (empty rows where the batch has none).
absl::Status BatchToSamples(const v1::TensorBatch& batch, std::vector<std::vector<int32_t>>* prompts,
                            std::vector<std::vector<int32_t>>* completions, std::vector<double>* rewards,
                            std::vector<std::vector<uint8_t>>* sampled = nullptr);

// A digest of the model's global weights (every parameter gathered over TP, in the
// model's parameter order, as f32): equal digests, equal weights. Every TP rank calls it.
absl::StatusOr<std::string> WeightsDigest(model::Llama& model);

// The bridge communicator of a split job: actor ranks 0..A-1, rollout ranks A..A+R-1.
absl::StatusOr<std::unique_ptr<comm::Communicator>> MakeBridge(const v1::ExecutorConfig& cfg, comm::KvStore* rdv,
                                                                const std::string& listen_host);

}  // namespace tessera::executor
