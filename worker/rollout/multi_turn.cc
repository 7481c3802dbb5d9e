#include "worker/rollout/multi_turn.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tessera::engine {

size_t LastTurnBegin(const Completion& c) {
  for (size_t i = c.sampled.size(); i > 0; --i)
    if (c.sampled[i - 1] == 0) return i;
  return 0;
}

uint64_t TurnSeed(uint64_t seed, int sample, int turn) {
  uint64_t z = seed ^ (static_cast<uint64_t>(sample) * 0x9e3779b97f4a7c15ull) ^ (static_cast<uint64_t>(turn) << 48);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

namespace {
void AppendTokens(Completion& c, const std::vector<int32_t>& tokens, const std::vector<float>* logprobs, size_t count) {
  const bool sampled = logprobs != nullptr;
  if (!sampled && c.sampled.empty()) c.sampled.assign(c.tokens.size(), 1);  // the first observation
  for (size_t k = 0; k < count; ++k) {
    c.tokens.push_back(tokens[k]);
    c.logprobs.push_back(sampled ? (*logprobs)[k] : 0.0f);
    if (!c.sampled.empty()) c.sampled.push_back(sampled ? 1 : 0);
  }
}
}  // namespace

void EpisodeStats::Add(const RolloutEngine& e) {
  ++rounds;
  prefill_s += e.prefill_seconds(), decode_s += e.decode_seconds();
  prefills += e.prefills(), decode_steps += e.decode_steps(), graph_steps += e.graph_steps();
  peak_bytes = std::max(peak_bytes, e.peak_bytes());
}

absl::StatusOr<std::vector<Completion>> GenerateEpisodes(RolloutEngine& rollout, const std::vector<GenerationRequest>& requests,
                                                         const MultiTurnOptions& options, const ObserveFn& observe,
                                                         EpisodeStats* stats) {
  EpisodeStats unused;
  if (stats == nullptr) stats = &unused;
  *stats = {};
  if (options.max_turns < 1) return absl::InvalidArgumentError(absl::StrCat("max_turns ", options.max_turns, "; need at least 1"));
  const bool tools = options.max_turns > 1 && !options.tool_stop.empty();
  std::vector<GenerationRequest> first = requests;
  if (tools)
    for (GenerationRequest& r : first) r.params.stop_sequences.push_back(options.tool_stop);
  TESSERA_ASSIGN_OR_RETURN(std::vector<Completion> out, rollout.Generate(first));
  stats->Add(rollout);
  if (!tools) return out;
  for (int turn = 1; turn < options.max_turns; ++turn) {
    std::vector<size_t> calling;
    std::vector<ToolCall> calls;
    for (size_t i = 0; i < out.size(); ++i) {
      // A call of this round: its last model turn (the turn-th) ended with the tool marker.
      if (out[i].finish_reason != "tool" || out[i].tool_calls != turn - 1) continue;
      calling.push_back(i);
      calls.push_back({out[i].request, out[i].sample, turn, &out[i].tokens, LastTurnBegin(out[i])});
    }
    if (calls.empty()) break;
    TESSERA_ASSIGN_OR_RETURN(std::vector<Observation> seen, observe(calls));
    if (seen.size() != calls.size())
      return absl::InvalidArgumentError(absl::StrCat("environment: ", seen.size(), " observations for ", calls.size(), " tool calls"));
    std::vector<GenerationRequest> next;
    std::vector<size_t> going;
    for (size_t k = 0; k < calling.size(); ++k) {
      Completion& c = out[calling[k]];
      const GenerationRequest& r = requests[c.request];
      ++c.tool_calls;
      if (seen[k].done) {
        c.finish_reason = "environment";
        continue;
      }
      const size_t budget = static_cast<size_t>(r.params.max_new_tokens);
      const size_t room = budget - std::min(budget, c.tokens.size());
      const size_t take = std::min(room, seen[k].tokens.size());
      AppendTokens(c, seen[k].tokens, nullptr, take);
      if (c.tokens.size() >= budget) {
        c.finish_reason = "length";
        continue;
      }
      GenerationRequest g;
      g.prompt = r.prompt;
      g.prompt.insert(g.prompt.end(), c.tokens.begin(), c.tokens.end());
      g.params = r.params;
      g.params.n = 1;
      g.params.max_new_tokens = static_cast<int64_t>(budget - c.tokens.size());
      g.params.seed = TurnSeed(r.params.seed, c.sample, turn + 1);
      g.params.stop_sequences.push_back(options.tool_stop);
      next.push_back(std::move(g));
      going.push_back(calling[k]);
    }
    if (next.empty()) continue;
    TESSERA_ASSIGN_OR_RETURN(std::vector<Completion> more, rollout.Generate(next));
    stats->Add(rollout);
    for (const Completion& m : more) {
      Completion& c = out[going[m.request]];
      AppendTokens(c, m.tokens, &m.logprobs, m.tokens.size());
      c.finish_reason = m.finish_reason;
    }
  }
  return out;
}

}  // namespace tessera::engine
