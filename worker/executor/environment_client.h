// rl.environment: the client of the user's EnvironmentService
// (proto/tessera/v1/environment_service.proto) for multi-turn rollouts. TP rank 0 of a DP
// rank calls it, with rl.environment_timeout_s as each call's deadline, and sends the
// answer — or its failure — to its TP peers, so that every TP rank appends the same
// observations. Errors name the environment: a failed call, a missed deadline, a wrong
// number of observations (UNAVAILABLE); a TP peer of a rank that failed answers ABORTED.
// Threading: one caller at a time (the executor's call).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tessera/v1/common.pb.h"
#include "tessera/v1/environment_service.grpc.pb.h"
#include "worker/comm/communicator.h"
#include "worker/executor/rl_prompts.h"
#include "worker/rollout/multi_turn.h"
#include "worker/rollout/rollout.h"
#include "worker/runtime/backend.h"

namespace tessera::executor {

class EnvironmentClient {
 public:
  // Null when the job has no environment. `tp` may be null (no tensor parallelism).
  static absl::StatusOr<std::unique_ptr<EnvironmentClient>> Create(const v1::JobSpec& spec, comm::Communicator* tp,
                                                                   runtime::Backend* backend);
  struct Observation {
    std::string text;
    bool done = false;
  };
  // One round's tool calls of DP rank `dp_rank` in RL step `step`: one observation each.
  absl::StatusOr<std::vector<Observation>> Step(int64_t step, int dp_rank, const std::vector<v1::EnvToolCall>& calls);
  // The round's episodes are over.
  absl::Status End(int64_t step, int dp_rank, const std::vector<std::string>& sessions);
  // Seconds spent in Step and End calls since the last ResetSeconds().
  double seconds() const { return seconds_; }
  void ResetSeconds() { seconds_ = 0; }

 private:
  // TP rank 0's `bytes` (an answer when *ok, else the error) on every TP rank.
  absl::Status ShareWithTp(bool* ok, std::string* bytes);
  // A call's outcome on every TP rank (ShareWithTp) and its time counted since `t0`: OK, or
  // the error — UNAVAILABLE on TP rank 0, ABORTED on its peers.
  absl::Status Shared(std::chrono::steady_clock::time_point t0, bool ok, std::string* bytes);
  void SetDeadline(grpc::ClientContext& ctx) const;  // rl.environment_timeout_s from now
  absl::Status Failure(const char* rpc, const grpc::Status& st) const;

  v1::RlSpec rl_;
  std::string job_;
  comm::Communicator* tp_ = nullptr;
  runtime::Backend* backend_ = nullptr;
  std::unique_ptr<v1::EnvironmentService::Stub> stub_;  // on TP rank 0
  double seconds_ = 0;
};

// Where a round of episodes belongs: its tool calls' sessions are
// "<phase>/<step>/<refill>/<first_prompt + request>/<sample>", and End names them after.
struct EpisodeRound {
  std::string phase;  // train | eval
  int64_t step = 0;
  int refill = 0;
  int dp_rank = 0;
  int64_t first_prompt = 0;
};

// The completions of `requests` (engine::GenerateEpisodes with prompts.multi_turn()), each
// tool call sent to `env` with its request's prompt text and answer; single-turn (Generate)
// without an environment. Observations go through the job's tokenizer. `stats`: the
// engine's over every round.
absl::StatusOr<std::vector<engine::Completion>> RunEpisodes(engine::RolloutEngine& rollout,
                                                            const std::vector<engine::GenerationRequest>& requests,
                                                            const RlPrompts& prompts, EnvironmentClient* env,
                                                            const EpisodeRound& round, const std::vector<std::string>& prompt_texts,
                                                            const std::vector<std::string>& answers,
                                                            engine::EpisodeStats* stats = nullptr);

}  // namespace tessera::executor
