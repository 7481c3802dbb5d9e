// Multi-turn rollouts (worker/rollout/multi_turn.h) on the CPU backend, with an environment
// written here: samples that never call a tool are Generate's own; a sample that calls is
// its first turn up to the marker, the observation (sampled 0, log-prob 0), then what
// Generate draws from the prompt and the response so far with the turn's seed; the whole
// response stays within max_new_tokens; max_turns, an environment's "done", its errors and
// a wrong number of observations behave; the statistics sum every round.
#include "worker/rollout/multi_turn.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "tests/worker/model/model_test_util.h"

namespace tessera::engine {
namespace {
using ::testing::HasSubstr;

model::LlamaConfig Config() {
  model::LlamaConfig c = model::test::TinyConfig(97, /*tied=*/false, /*bias=*/false);
  c.hidden = 32, c.heads = 4, c.kv_heads = 2, c.ffn = 48, c.layers = 2;
  return c;
}

class MultiTurnTest : public ::testing::Test {
 protected:
  void SetUp() override {
    be_ = runtime::MakeCpuBackend();
    auto m = model::Llama::Create(Config(), be_.get());
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    ASSERT_TRUE(model_->InitRandom(3, 0.2f).ok());
    auto e = RolloutEngine::Create(model_.get(), RolloutOptions{});
    ASSERT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    for (int i = 0; i < 4; ++i) {
      GenerationRequest q;
      q.prompt = model::test::RandomBatch(97, 200 + i, {3 + 2 * i}).tokens;
      q.params.temperature = 1.f, q.params.n = 4, q.params.max_new_tokens = 24, q.params.seed = 50 + i;
      requests_.push_back(q);
    }
    // The marker: the token these samples draw most often, so that many of them call.
    auto plain = engine_->Generate(requests_);
    ASSERT_TRUE(plain.ok()) << plain.status();
    plain_ = *plain;
    std::map<int32_t, int> count;
    for (const Completion& c : plain_)
      for (int32_t t : c.tokens) ++count[t];
    int best = 0;
    for (auto [t, n] : count)
      if (n > best) best = n, marker_ = t;
  }
  // An environment answering each call with `obs` tokens (the turn number repeated), or done.
  ObserveFn Env(size_t obs, bool done = false) {
    return [this, obs, done](const std::vector<ToolCall>& calls) -> absl::StatusOr<std::vector<Observation>> {
      std::vector<Observation> out;
      for (const ToolCall& c : calls) {
        seen_.push_back(c);
        EXPECT_EQ(c.response->back(), marker_);
        Observation o;
        o.tokens.assign(obs, static_cast<int32_t>(c.turn));
        o.done = done;
        out.push_back(o);
      }
      return out;
    };
  }
  std::unique_ptr<runtime::Backend> be_;
  std::unique_ptr<model::Llama> model_;
  std::unique_ptr<RolloutEngine> engine_;
  std::vector<GenerationRequest> requests_;
  std::vector<Completion> plain_;
  int32_t marker_ = -1;
  std::vector<ToolCall> seen_;
};

TEST_F(MultiTurnTest, ACallGetsItsObservationAndTheModelGoesOn) {
  MultiTurnOptions o;
  o.max_turns = 2, o.tool_stop = {marker_};
  EpisodeStats stats;
  auto got = GenerateEpisodes(*engine_, requests_, o, Env(3), &stats);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), plain_.size());
  // The statistics cover both rounds (the engine's own, only the last).
  EXPECT_EQ(stats.rounds, 2);
  EXPECT_GT(stats.decode_steps, engine_->decode_steps());
  EXPECT_GT(stats.prefills, engine_->prefills());
  int calls = 0;
  for (size_t i = 0; i < got->size(); ++i) {
    const Completion& c = (*got)[i];
    const Completion& p = plain_[i];
    EXPECT_LE(static_cast<int64_t>(c.tokens.size()), requests_[c.request].params.max_new_tokens);
    ASSERT_EQ(c.logprobs.size(), c.tokens.size());
    const auto first = std::find(p.tokens.begin(), p.tokens.end(), marker_);
    if (first == p.tokens.end()) {  // no call: Generate's sample, untouched
      EXPECT_EQ(c.tokens, p.tokens);
      EXPECT_EQ(c.tool_calls, 0);
      EXPECT_TRUE(c.sampled.empty());
      continue;
    }
    ++calls;
    // Turn 1: Generate's tokens up to and including the marker (the same draws).
    const size_t t1 = static_cast<size_t>(first - p.tokens.begin()) + 1;
    ASSERT_GE(c.tokens.size(), t1);
    EXPECT_EQ(std::vector<int32_t>(c.tokens.begin(), c.tokens.begin() + t1), std::vector<int32_t>(p.tokens.begin(), first + 1));
    EXPECT_EQ(c.tool_calls, 1);
    const size_t budget = static_cast<size_t>(requests_[c.request].params.max_new_tokens);
    const size_t obs = std::min<size_t>(3, budget - t1);
    if (obs == 0) {  // the call took the last token: no room for an observation
      EXPECT_EQ(c.tokens.size(), t1);
      EXPECT_EQ(c.finish_reason, "length");
      continue;
    }
    ASSERT_EQ(c.sampled.size(), c.tokens.size());
    for (size_t k = 0; k < c.tokens.size(); ++k) {
      const bool observed = k >= t1 && k < t1 + obs;
      EXPECT_EQ(c.sampled[k], observed ? 0 : 1) << k;
      if (observed) {
        EXPECT_EQ(c.tokens[k], 1);
        EXPECT_EQ(c.logprobs[k], 0.0f);
      }
    }
    EXPECT_EQ(LastTurnBegin(c), t1 + obs);
    if (t1 + obs >= budget) {
      EXPECT_EQ(c.finish_reason, "length");
      continue;
    }
    // Turn 2: what Generate draws from prompt + response so far with the turn's seed.
    GenerationRequest g = requests_[c.request];
    g.prompt.insert(g.prompt.end(), c.tokens.begin(), c.tokens.begin() + t1 + obs);
    g.params.n = 1, g.params.max_new_tokens = static_cast<int64_t>(budget - t1 - obs);
    g.params.seed = TurnSeed(requests_[c.request].params.seed, c.sample, 2);
    g.params.stop_sequences = {{marker_}};
    auto second = engine_->Generate({g});
    ASSERT_TRUE(second.ok()) << second.status();
    EXPECT_EQ(std::vector<int32_t>(c.tokens.begin() + t1 + obs, c.tokens.end()), (*second)[0].tokens);
    EXPECT_EQ(c.finish_reason, (*second)[0].finish_reason);
  }
  EXPECT_GE(calls, 3) << "too few samples called the tool: the test shows little";
  EXPECT_EQ(seen_.size(), static_cast<size_t>(calls));  // one round: max_turns 2
  for (const ToolCall& t : seen_) EXPECT_EQ(t.turn, 1);
}

TEST_F(MultiTurnTest, TurnsAreBoundedAndTheEnvironmentCanEndAnEpisode) {
  MultiTurnOptions o;
  o.max_turns = 4, o.tool_stop = {marker_};
  auto got = GenerateEpisodes(*engine_, requests_, o, Env(1));
  ASSERT_TRUE(got.ok()) << got.status();
  int most = 0;
  for (const Completion& c : *got) {
    EXPECT_LE(c.tool_calls, 3);  // at most max_turns - 1 observations
    most = std::max(most, c.tool_calls);
    if (c.tool_calls == 3) {
      EXPECT_NE(c.finish_reason, "environment");
    }
  }
  EXPECT_GE(most, 2) << "no sample called twice: the test shows little";
  for (const ToolCall& t : seen_) EXPECT_LE(t.turn, 3);

  seen_.clear();
  got = GenerateEpisodes(*engine_, requests_, o, Env(1, /*done=*/true));
  ASSERT_TRUE(got.ok()) << got.status();
  for (size_t i = 0; i < got->size(); ++i) {
    const Completion& c = (*got)[i];
    if (c.tool_calls == 0) continue;
    EXPECT_EQ(c.tool_calls, 1);
    EXPECT_EQ(c.finish_reason, "environment");
    EXPECT_EQ(c.tokens.back(), marker_);  // nothing appended after the call
    EXPECT_TRUE(c.sampled.empty());
  }
}

TEST_F(MultiTurnTest, EnvironmentErrorsEndTheGeneration) {
  MultiTurnOptions o;
  o.max_turns = 2, o.tool_stop = {marker_};
  auto failed = GenerateEpisodes(*engine_, requests_, o, [](const std::vector<ToolCall>&) -> absl::StatusOr<std::vector<Observation>> {
    return absl::UnavailableError("calculator is down");
  });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(failed.status().message(), HasSubstr("calculator is down"));
  auto wrong = GenerateEpisodes(*engine_, requests_, o, [](const std::vector<ToolCall>&) -> absl::StatusOr<std::vector<Observation>> {
    return std::vector<Observation>(1);
  });
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("observations for"));
  // Single-turn (max_turns 1): Generate's completions, no environment called.
  o.max_turns = 1;
  auto single = GenerateEpisodes(*engine_, requests_, o, Env(3));
  ASSERT_TRUE(single.ok());
  for (size_t i = 0; i < single->size(); ++i) EXPECT_EQ((*single)[i].tokens, plain_[i].tokens);
  EXPECT_TRUE(seen_.empty());
}

}  // namespace
}  // namespace tessera::engine
