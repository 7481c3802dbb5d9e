// Multi-turn rollouts with tools (docs/rl.md, "Multi-turn rollouts with tools"): each sample
// of a request runs as an episode of model turns and an environment's observations.
//   - turn 1 is the request as Generate runs it, with `tool_stop` as a stop sequence: a
//     sample whose new tokens end with it made a tool call (finish "tool");
//   - every call of a round goes to `observe` at once; each observation's tokens are
//     appended to the sample's response (Completion::sampled 0, log-prob 0: masked out of
//     the loss and the log-probs) — or the environment ends the episode (finish
//     "environment");
//   - the samples that go on run their next turn together: the prompt and the response
//     so far as the new prompt (prefilled again), the rest of the request's
//     max_new_tokens as theirs — max_new_tokens bounds the whole response, observations
//     included (an observation is cut where it would pass it: finish "length");
//   - up to max_turns model turns; a sample still calling after its last keeps "tool".
// Turn t >= 2 of sample j of a request draws with TurnSeed(seed, j, t), so an episode does
// not depend on which other samples share its rounds (the same rule as Generate's).
// Threading: as the engine's (one caller at a time); `observe` runs on the caller's thread.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/rollout/rollout.h"

namespace tessera::engine {

struct ToolCall {
  int64_t request = 0;  // index into the requests
  int sample = 0;
  int turn = 1;  // the model turn that ended with the call, from 1
  const std::vector<int32_t>* response = nullptr;  // the response so far, this call's tokens included
  size_t call_begin = 0;  // where this turn's tokens start in *response
};

struct Observation {
  std::vector<int32_t> tokens;  // appended to the response
  bool done = false;            // the episode ends (tokens not appended)
};

// The environment: one observation per call, in order. An error (or a wrong count) ends
// the whole generation with it.
using ObserveFn = std::function<absl::StatusOr<std::vector<Observation>>(const std::vector<ToolCall>&)>;

struct MultiTurnOptions {
  int max_turns = 1;
  std::vector<int32_t> tool_stop;  // the tokens that end a tool call (empty: single-turn)
};

// The engine's statistics over every round of GenerateEpisodes (the engine's own are its
// last Generate()'s): times and steps summed, the peak the largest.
struct EpisodeStats {
  int rounds = 0;  // Generate() calls
  double prefill_s = 0, decode_s = 0;
  int64_t prefills = 0, decode_steps = 0, graph_steps = 0, peak_bytes = 0;
  void Add(const RolloutEngine& e);
};

// Completions ordered by (request, sample), as Generate's; with no tool calls made they
// equal Generate's (Completion::sampled empty). Requests are checked as Generate checks them.
absl::StatusOr<std::vector<Completion>> GenerateEpisodes(RolloutEngine& rollout, const std::vector<GenerationRequest>& requests,
                                                         const MultiTurnOptions& options, const ObserveFn& observe,
                                                         EpisodeStats* stats = nullptr);

// Where a completion's last model turn starts: after its last observation token (0 for a
// single-turn completion).
size_t LastTurnBegin(const Completion& c);

// The sampling seed of turn `turn` (>= 2) of sample `sample` of a request seeded `seed`.
uint64_t TurnSeed(uint64_t seed, int sample, int turn);

}  // namespace tessera::engine
