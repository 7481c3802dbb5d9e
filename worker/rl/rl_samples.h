// The samples of one RL step on one rank (worker/rl/grpo.cc, ppo.cc): each completion
// as a sequence of its prompt and its tokens (CompletionSequence: entry t is the target
// of token t) with its per-token RL inputs, packed into micro-batches (varlen: each
// sample attends to itself) for the reference's and the old policy's log-probs, the
// critic's values and the updates.
#pragma once

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/rl/grpo.h"
#include "worker/rollout/rollout.h"
#include "worker/train/trainer.h"
#include "worker/model/llama.h"

namespace tessera::engine {

struct RlSample {
  model::TokenBatch batch;
  // Per token: mask (1: a response token that counts), the reference's and the old
  // policy's log-probs, the advantage, the critic's value before the update, the return.
  std::vector<double> mask, ref_logp, old_logp, advantage, old_value, returns;
  std::vector<double> rollout_logp;  // the rollout engine's log-probs of the sampled tokens (where known)
};

// The positions of a sample's response tokens (mask > 0), in order.
std::vector<size_t> ResponsePositions(const RlSample& s);

// `logprobs` (the rollout's, one per completion token; may be empty) land at the
// completion's positions of rollout_logp. `sampled` (multi-turn: per completion token, 0
// for an environment's observation; empty: all sampled) takes the observations out of the
// mask, so nothing counts them.
RlSample MakeRlSample(const std::vector<int32_t>& prompt, const std::vector<int32_t>& completion,
                      const std::vector<float>& logprobs = {}, const std::vector<uint8_t>& sampled = {});

// A step's generation and rewards: `n` samples of every prompt (prompt i's seed from
// `seed` and i), scored in one call; the samples in (prompt, sample) order with their
// rewards, the means and the time taken. `who` names the algorithm in errors (a wrong
// number of rewards, a reward that is not finite).
struct Rollouts {
  std::vector<RlSample> samples;
  std::vector<double> rewards;
  double reward = 0, response_length = 0, generate_s = 0;
};
absl::StatusOr<Rollouts> GenerateAndScore(RolloutEngine& rollout, const std::vector<std::vector<int32_t>>& prompts,
                                          const SamplingParams& sampling, int n, uint64_t seed,
                                          const BatchRewardFn& reward, const char* who);
// The same with each prompt's sampling seed given (`seeds[i]`, as PromptSeed makes them):
// a rollout pool reproduces what each actor rank would have sampled itself.
absl::StatusOr<Rollouts> GenerateAndScore(RolloutEngine& rollout, const std::vector<std::vector<int32_t>>& prompts,
                                          const SamplingParams& sampling, int n, const std::vector<uint64_t>& seeds,
                                          const BatchRewardFn& reward, const char* who);
// Prompt i's seed of a step's base seed (the first overload's).
inline uint64_t PromptSeed(uint64_t seed, size_t i) { return seed * 1000003ull + i * 7919ull; }
// Rollouts of samples made elsewhere: prompt + completion tokens and rewards, in order.
Rollouts MakeRollouts(const std::vector<std::vector<int32_t>>& prompts, const std::vector<std::vector<int32_t>>& completions,
                      const std::vector<double>& rewards, const std::vector<std::vector<uint8_t>>* sampled = nullptr);

// A step's samples split for the model's passes: `mini_batches` consecutive ranges (one
// optimizer step each), each packed into micro-batches of at most `max_tokens` tokens
// (0: one micro-batch per mini-batch; a longer sample goes alone), balanced by length —
// longest first onto the least loaded, each micro-batch's samples in their order. The
// passes accumulate over a mini-batch's micro-batches, so memory follows max_tokens, not
// the batch. Every rank of the trainer's data-parallel group (null: this rank alone)
// gets the same number of micro-batches per mini-batch — the group agrees on the largest,
// as ZeRO-3 gathers parameters per micro-batch; where a rank has fewer samples than
// that, a `pad` micro-batch repeats the mini-batch's shortest sample with nothing counted.
struct MicroBatch {
  std::vector<size_t> samples;
  bool pad = false;
};
using MicroBatchPlan = std::vector<std::vector<MicroBatch>>;  // [mini-batch][micro-batch]
absl::StatusOr<MicroBatchPlan> PlanMicroBatches(Trainer* trainer, const std::vector<RlSample>& samples, int mini_batches,
                                                int64_t max_tokens);

// The samples of a micro-batch packed into one batch (varlen).
model::TokenBatch PackSamples(const std::vector<RlSample>& samples, const MicroBatch& micro);
// One optimizer step of the actor (Trainer::PolicyStep) or the critic (ValueStep) on one
// mini-batch, its micro-batches packed with their per-token inputs.
absl::StatusOr<Trainer::PolicyStats> UpdateActor(Trainer& trainer, const std::vector<RlSample>& samples,
                                                 const std::vector<MicroBatch>& mini_batch, const rl::PolicyLossOptions& loss);
absl::StatusOr<Trainer::ValueStats> UpdateCritic(Trainer& trainer, const std::vector<RlSample>& samples,
                                                 const std::vector<MicroBatch>& mini_batch, double value_clip);

// `epochs` passes over the plan's mini-batches, one UpdateActor each: the last step's
// statistics; *optimizer_steps counts the steps.
absl::StatusOr<Trainer::PolicyStats> UpdateActorEpochs(Trainer& trainer, const std::vector<RlSample>& samples,
                                                       const MicroBatchPlan& plan, int epochs,
                                                       const rl::PolicyLossOptions& loss, int* optimizer_steps);

// samples[i].*field from the model's log-probs (TokenLogProbs) or, for a critic, its
// values (TokenValues): one forward per micro-batch of the plan, split back.
absl::Status FillLogProbs(model::Llama& m, std::vector<RlSample>& samples, const MicroBatchPlan& plan,
                          std::vector<double> RlSample::*field);
absl::Status FillValues(model::Llama& critic, std::vector<RlSample>& samples, const MicroBatchPlan& plan);
// A reward model's score of each sample (prompt + response): its value head at the
// sample's last token, as Hugging Face's *ForSequenceClassification reads it; one forward
// per micro-batch of the plan. In sample order.
absl::StatusOr<std::vector<double>> SequenceScores(model::Llama& reward_model, const std::vector<RlSample>& samples,
                                                   const MicroBatchPlan& plan);

}  // namespace tessera::engine
