// An RL job's prompts, shared by the actor's session (colocated generation) and a rollout
// pool's (split pools): the built-in arithmetic problems, or a JSONL file's prompts /
// conversations with answers through the model's tokenizer (and rl.eval_data's held-out
// ones); the stop tokens; the built-in verifier. Immutable after Load (a shuffled pass's
// order is made under a lock): thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/v1/executor_service.pb.h"
#include "tessera/v1/common.pb.h"
#include "tessera/v1/reward_service.grpc.pb.h"
#include "worker/comm/communicator.h"
#include "worker/runtime/backend.h"
#include "worker/train/data.h"
#include "worker/rollout/multi_turn.h"
#include "worker/rollout/rollout.h"
#include "worker/tokenizer/model_text.h"

namespace tessera::executor {

class EnvironmentClient;  // environment_client.h

class RlPrompts {
 public:
  // `model_vocab`: the model's vocabulary (a tokenizer with more tokens is refused).
  absl::Status Load(const v1::JobSpec& spec, int64_t model_vocab);

  struct Prompt {
    std::vector<int32_t> ids;
    std::string text;    // what a reward service sees (a conversation: the template's text)
    std::string answer;  // what a completion must match
  };
  // Prompt `index` of the run (global numbering; JSONL prompts cycle through the file,
  // with train.data.shuffle each pass in ShuffledOrder(lines, train.seed, pass)).
  Prompt At(int64_t index) const;
  // rl.eval_data's problems (JSONL jobs; none without it), in the file's order.
  const std::vector<Prompt>& held_out() const { return held_; }
  // A completion's text: decoded without special tokens (bytes for the byte tokenizer);
  // ids past the tokenizer's vocabulary have none.
  std::string CompletionText(const std::vector<int32_t>& tokens) const;
  // The built-in verifier: an exact match (JSONL: rl::ExactAnswerReward — the final
  // answer in \boxed{} or after "####", compared as math answers).
  double Reward(const std::string& completion_text, const std::string& answer) const;
  // The verifier's reward of a completion: of its last model turn's text (multi-turn: the
  // answer comes after the last observation; single-turn: the whole completion).
  double Reward(const engine::Completion& c, const std::string& answer) const;
  // Multi-turn: tokens as an environment reads them (special tokens kept), and an
  // observation's text as tokens (text naming a special token encodes to it).
  std::string RawText(const std::vector<int32_t>& tokens, size_t begin = 0) const;
  absl::StatusOr<std::vector<int32_t>> EncodeText(const std::string& text) const;
  // rl.environment's settings: max_turns and rl.tool_stop's tokens (single-turn without).
  const engine::MultiTurnOptions& multi_turn() const { return multi_turn_; }

  bool jsonl() const { return !file_.empty(); }
  int64_t longest_prompt() const { return longest_; }  // held-out prompts included
  const std::vector<int32_t>& stop_tokens() const { return stops_; }
  const engine::ArithmeticData& arithmetic() const { return data_; }

 private:
  engine::ArithmeticData data_;
  // A JSONL file's lines through the tokenizer, INVALID_ARGUMENT naming the file and line.
  absl::StatusOr<std::vector<Prompt>> Encode(const std::string& path);

  std::vector<Prompt> file_;  // train.data.kind jsonl (empty: the arithmetic problems)
  tokenizer::ModelText text_;
  std::vector<int32_t> stops_;  // rl.stop (one token each), and with a tokenizer.json the EOS ids
  engine::MultiTurnOptions multi_turn_;
  int64_t longest_ = 0;
  std::vector<Prompt> held_;
  bool shuffle_ = false;
  uint64_t seed_ = 0;
  mutable std::mutex order_mu_;  // the current pass's order, made on first use
  mutable int64_t order_pass_ = -1;
  mutable std::vector<uint32_t> order_;
};

// A pass's order of n lines: a permutation of 0..n-1 from the seed and the pass (a
// Fisher-Yates shuffle over SplitMix64), the same on every rank and after a restart.
std::vector<uint32_t> ShuffledOrder(size_t n, uint64_t seed, int64_t pass);

// A channel to a service the user runs (`field`: rl.reward_service, rl.environment): TLS
// checked with the CA in the file `ca_cert`, or plaintext where none is given (MakeChannel
// refuses that unless the address is loopback); errors prefixed with the field.
absl::StatusOr<std::shared_ptr<grpc::Channel>> UserServiceChannel(const std::string& field, const std::string& address,
                                                                  const std::string& ca_cert);

// rl.reward_service: the rewards of one DP rank's completions from the user's service.
// TP rank 0 calls it (with the deadline) and broadcasts the rewards — or its failure —
// over TP, so TP peers never disagree. Errors name the service: a failed call, a missed
// deadline, a wrong number of rewards (UNAVAILABLE).
class RewardServiceClient {
 public:
  // Null when the job has no reward service. `tp` may be null (no tensor parallelism).
  static absl::StatusOr<std::unique_ptr<RewardServiceClient>> Create(const v1::JobSpec& spec, comm::Communicator* tp,
                                                                     runtime::Backend* backend);
  // prompts / answers per request; completions and their decoded texts in order.
  absl::StatusOr<std::vector<double>> Score(int64_t step, int dp_rank, const std::vector<std::string>& prompts,
                                            const std::vector<std::string>& answers,
                                            const std::vector<engine::Completion>& completions,
                                            const std::vector<std::string>& texts);

 private:
  v1::RlSpec rl_;
  std::string job_;
  comm::Communicator* tp_ = nullptr;
  runtime::Backend* backend_ = nullptr;
  std::unique_ptr<v1::RewardService::Stub> stub_;  // on TP rank 0
};

// RlEval: greedy exact-match answers to this DP rank's share of `problems` held-out
// arithmetic problems (pairs no job trains on): correct and problems of this DP rank.
// Greedy accuracy on this DP rank's share of held-out problems [0, problems): the
// built-in arithmetic's (an exact match), or on JSONL prompts rl.eval_data's first
// `problems` (all where the file has fewer), checked by the rule verifier.
// FAILED_PRECONDITION for a JSONL job without rl.eval_data.
// With `env` (rl.environment) each problem is a multi-turn episode (sessions "eval/<k>/0/<problem>/0",
// k counting this executor's evaluations) and the verifier reads its last model turn.
absl::StatusOr<v1::RlEvalResponse> HeldOutEval(engine::RolloutEngine& rollout, const RlPrompts& prompts, EnvironmentClient* env,
                                               int64_t max_new_tokens, int64_t problems, int dp_rank, int dps);

}  // namespace tessera::executor
