// The rollout engine (worker/rollout/rollout.h) on the CPU backend against the training
// engine's own forward on the same weights: greedy generation is the argmax of the
// teacher-forced logits, sampled tokens' log-probabilities are the training engine's
// log-probs (within 1e-5: the decode attention sums in another order than the varlen
// one), continuous batching gives what one request at a time gives, and stops, lengths
// and bad requests behave.
#include "worker/rollout/rollout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "common/util.h"
#include "tests/common/mem_store.h"
#include "tests/worker/model/model_test_util.h"
#include "worker/comm/gloo_communicator.h"

namespace tessera::engine {
namespace {
using ::testing::HasSubstr;
using model::Llama;
using model::TokenBatch;

// A random tiny model with a larger head dim than TinyConfig (8), so that attention is
// not degenerate, and a vocabulary big enough for spread-out distributions.
model::LlamaConfig Config() {
  model::LlamaConfig c = model::test::TinyConfig(97, /*tied=*/false, /*bias=*/true);
  c.hidden = 32, c.heads = 4, c.kv_heads = 2, c.ffn = 48, c.layers = 2;
  return c;
}

std::vector<GenerationRequest> Requests(int64_t vocab, float temperature, int n, int64_t max_new) {
  std::vector<GenerationRequest> r;
  const std::vector<int> lengths = {5, 1, 17, 9, 33, 3};
  for (size_t i = 0; i < lengths.size(); ++i) {
    TokenBatch b = model::test::RandomBatch(vocab, 100 + i, {lengths[i]});
    GenerationRequest q;
    q.prompt = b.tokens;
    q.params.temperature = temperature, q.params.n = n, q.params.max_new_tokens = max_new + static_cast<int64_t>(i % 3);
    q.params.seed = 1000 + i;
    r.push_back(q);
  }
  return r;
}

// The training engine's log-probs of the completion's tokens (teacher forcing over
// prompt + completion), and its argmax at each of those positions.
void TeacherForced(Llama& m, const std::vector<int32_t>& prompt, const Completion& c, std::vector<float>* logprobs,
                   std::vector<int32_t>* argmax) {
  const TokenBatch b = CompletionSequence(prompt, c.tokens);
  const int64_t n = static_cast<int64_t>(b.size()), p = static_cast<int64_t>(prompt.size());
  auto stats = m.TokenLogProbs(b);
  ASSERT_TRUE(stats.ok()) << stats.status();
  auto logits = m.ForwardLogits(b);
  ASSERT_TRUE(logits.ok()) << logits.status();
  const int64_t v = m.config().vocab;
  for (int64_t i = p - 1; i + 1 < n; ++i) {
    logprobs->push_back(stats->logprob[i]);
    const float* z = logits->data() + i * v;
    argmax->push_back(static_cast<int32_t>(std::max_element(z, z + v) - z));
  }
}

class RolloutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    be_ = runtime::MakeCpuBackend();
    auto m = Llama::Create(Config(), be_.get());
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    ASSERT_TRUE(model_->InitRandom(3, 0.2f).ok());
  }
  std::unique_ptr<RolloutEngine> Engine(RolloutOptions o = {}) {
    auto e = RolloutEngine::Create(model_.get(), o);
    EXPECT_TRUE(e.ok()) << e.status();
    return std::move(*e);
  }
  std::unique_ptr<runtime::Backend> be_;
  std::unique_ptr<Llama> model_;
};

TEST_F(RolloutTest, GreedyIsTheArgmaxOfTheTrainingForward) {
  RolloutOptions o;
  o.block_size = 4, o.num_blocks = 64, o.max_running = 3;  // blocks cross often; 6 requests queue
  auto e = Engine(o);
  const auto reqs = Requests(Config().vocab, /*temperature=*/0.f, 1, 12);
  auto got = e->Generate(reqs);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), reqs.size());
  for (const Completion& c : *got) {
    SCOPED_TRACE(::testing::Message() << "request " << c.request);
    EXPECT_EQ(c.finish_reason, "length");
    EXPECT_EQ(static_cast<int64_t>(c.tokens.size()), reqs[c.request].params.max_new_tokens);
    std::vector<float> lp;
    std::vector<int32_t> arg;
    TeacherForced(*model_, reqs[c.request].prompt, c, &lp, &arg);
    EXPECT_EQ(c.tokens, arg);
    for (size_t i = 0; i < lp.size(); ++i) EXPECT_NEAR(c.logprobs[i], lp[i], 1e-5) << "token " << i;
  }
  EXPECT_GT(e->decode_steps(), 0);
  EXPECT_GT(e->prefills(), 1);  // max_running 3 of 6: later requests joined a running batch
}

TEST_F(RolloutTest, SampledLogProbsAreTheTrainingEnginesAndBatchingChangesNothing) {
  const auto reqs = Requests(Config().vocab, /*temperature=*/1.f, /*n=*/3, 10);
  RolloutOptions together;
  together.block_size = 8, together.num_blocks = 40, together.max_running = 5;  // the cache limits admission too
  auto all = Engine(together)->Generate(reqs);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), reqs.size() * 3);
  RolloutOptions alone;
  alone.block_size = 8, alone.num_blocks = 40, alone.max_running = 1;
  auto one = Engine(alone);
  for (size_t i = 0; i < all->size(); ++i) {
    const Completion& c = (*all)[i];
    SCOPED_TRACE(::testing::Message() << "request " << c.request << " sample " << c.sample);
    std::vector<float> lp;
    std::vector<int32_t> arg;
    TeacherForced(*model_, reqs[c.request].prompt, c, &lp, &arg);
    for (size_t k = 0; k < lp.size(); ++k) EXPECT_NEAR(c.logprobs[k], lp[k], 1e-5) << "token " << k;
    if (c.sample == 0) {  // the same request alone, samples in order
      auto solo = one->Generate({reqs[c.request]});
      ASSERT_TRUE(solo.ok()) << solo.status();
      for (int j = 0; j < 3; ++j) {
        EXPECT_EQ((*solo)[j].tokens, (*all)[i + j].tokens) << "sample " << j;
        for (size_t k = 0; k < (*solo)[j].logprobs.size(); ++k)
          EXPECT_NEAR((*solo)[j].logprobs[k], (*all)[i + j].logprobs[k], 1e-5);
      }
    }
  }
  // The samples of a request differ (different seeds), and a rerun repeats them exactly —
  // also after the cache is released (what a colocated executor does before training)
  // and made again.
  EXPECT_NE((*all)[0].tokens, (*all)[1].tokens);
  auto rerun = Engine(together);
  EXPECT_FALSE(rerun->holds_cache());
  for (int pass = 0; pass < 2; ++pass) {
    auto again = rerun->Generate(reqs);
    ASSERT_TRUE(again.ok());
    EXPECT_TRUE(rerun->holds_cache());
    for (size_t i = 0; i < all->size(); ++i) EXPECT_EQ((*again)[i].tokens, (*all)[i].tokens) << "pass " << pass;
    rerun->ReleaseCache();
    EXPECT_FALSE(rerun->holds_cache());
  }
}

// A step's prompt-token budget splits the prefill over steps — a prompt longer than what a
// step has left runs in chunks, its later chunks attending to the cache — and changes no
// token; a request's samples still share its prompt when it is chunked.
TEST_F(RolloutTest, APrefillTokenBudgetChunksPromptsAndChangesNothing) {
  const auto reqs = Requests(Config().vocab, /*temperature=*/1.f, /*n=*/3, 6);
  RolloutOptions o;
  o.block_size = 8, o.num_blocks = 200, o.max_running = 18;
  auto whole = Engine(o);
  auto all = whole->Generate(reqs);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(whole->prefills(), 1);
  for (int64_t budget : {20, 7, 1}) {
    SCOPED_TRACE(::testing::Message() << "budget " << budget);
    o.max_prefill_tokens = budget;
    auto split = Engine(o);
    auto got = split->Generate(reqs);
    ASSERT_TRUE(got.ok()) << got.status();
    // 68 prompt tokens (each request's prompt once: its samples share it), at most `budget`
    // a step: {5, 1, 14 of 17}, {3, 9, 8 of 33}, {20 of 33}, {5, 3} at 20.
    EXPECT_EQ(split->prefill_tokens(), 68);
    EXPECT_EQ(split->prefills(), (68 + budget - 1) / budget);
    for (size_t i = 0; i < all->size(); ++i) {
      EXPECT_EQ((*got)[i].tokens, (*all)[i].tokens) << "sample " << i;
      for (size_t k = 0; k < (*got)[i].logprobs.size(); ++k) EXPECT_NEAR((*got)[i].logprobs[k], (*all)[i].logprobs[k], 1e-5);
    }
  }
}

// Prefix sharing: a request's samples admitted together prefill its prompt once and hold
// its full blocks once — the tokens and log-probs are those of the same requests without
// sharing (each sample its own prompt; log-probs to 1e-5: the prefill's GEMMs see fewer
// rows), for a third of the prefill tokens and fewer blocks.
// Prompts of 1 to 33 tokens over blocks of 8: some end inside a block (copied per sample),
// one on a block's edge. Under cache pressure (blocks for two groups at a time) the samples
// that wait share among themselves when admitted.
TEST_F(RolloutTest, SamplesOfARequestShareItsPromptAndDrawWhatTheyWouldAlone) {
  auto reqs = Requests(Config().vocab, /*temperature=*/1.f, /*n=*/3, 12);
  reqs[2].prompt.resize(16);  // on a block's edge
  for (int64_t blocks : {200, 14}) {
    SCOPED_TRACE(::testing::Message() << blocks << " blocks");
    RolloutOptions o;
    o.block_size = 8, o.num_blocks = blocks, o.max_running = 18;
    o.prefix_sharing = false;
    auto own = Engine(o);
    auto alone = own->Generate(reqs);
    ASSERT_TRUE(alone.ok()) << alone.status();
    o.prefix_sharing = true;
    auto shared = Engine(o);
    auto got = shared->Generate(reqs);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), alone->size());
    for (size_t i = 0; i < got->size(); ++i) {
      EXPECT_EQ((*got)[i].tokens, (*alone)[i].tokens) << "sample " << i;
      ASSERT_EQ((*got)[i].logprobs.size(), (*alone)[i].logprobs.size());
      for (size_t k = 0; k < (*got)[i].logprobs.size(); ++k) EXPECT_NEAR((*got)[i].logprobs[k], (*alone)[i].logprobs[k], 1e-5);
    }
    if (blocks == 200) {
      EXPECT_EQ(own->prefill_tokens(), 3 * shared->prefill_tokens());
      EXPECT_LT(shared->peak_blocks(), own->peak_blocks());
    }
    // Every block came back: a second run finds the whole cache free and repeats the first.
    auto again = shared->Generate(reqs);
    ASSERT_TRUE(again.ok()) << again.status();
    for (size_t i = 0; i < got->size(); ++i) EXPECT_EQ((*again)[i].tokens, (*got)[i].tokens);
  }
}

// Paged KV on demand: samples take blocks as they grow, so a cache that holds only a few
// samples at their longest runs many at once, and when it runs out the latest admitted
// sample is preempted and later prefilled again (its prompt and what it had generated).
// Under heavy and light pressure the tokens are those of an unpressured cache (log-probs to
// 1e-5: the recomputed keys and values come from a prefill instead of decode steps), and
// every block comes back.
TEST_F(RolloutTest, PreemptedSamplesRecomputeAndDrawWhatTheyWouldHave) {
  auto reqs = Requests(Config().vocab, /*temperature=*/1.f, /*n=*/3, 20);
  RolloutOptions o;
  o.block_size = 4, o.num_blocks = 400, o.max_running = 18;
  auto roomy = Engine(o);
  auto want = roomy->Generate(reqs);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(roomy->preemptions(), 0);
  // The longest sample (33 + 22 tokens) needs 14 blocks; 18 samples at their longest, 140.
  for (int64_t blocks : {14, 40, 90}) {
    SCOPED_TRACE(::testing::Message() << blocks << " blocks");
    o.num_blocks = blocks;
    auto tight = Engine(o);
    for (int pass = 0; pass < 2; ++pass) {  // the second finds every block back
      auto got = tight->Generate(reqs);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_GT(tight->preemptions(), 0);
      EXPECT_LE(tight->peak_blocks(), blocks);
      for (size_t i = 0; i < got->size(); ++i) {
        EXPECT_EQ((*got)[i].tokens, (*want)[i].tokens) << "sample " << i;
        EXPECT_EQ((*got)[i].finish_reason, (*want)[i].finish_reason);
        ASSERT_EQ((*got)[i].logprobs.size(), (*want)[i].logprobs.size());
        for (size_t k = 0; k < (*got)[i].logprobs.size(); ++k) EXPECT_NEAR((*got)[i].logprobs[k], (*want)[i].logprobs[k], 1e-5);
      }
    }
  }
  // Blocks reserved up front for prompt + max_new_tokens would hold 90 / 14 = 6 samples at
  // once; on demand more run together: fewer decode steps than 18 samples 6 at a time take.
  o.num_blocks = 90;
  auto ninety = Engine(o);
  ASSERT_TRUE(ninety->Generate(reqs).ok());
  o.num_blocks = 400, o.max_running = 6;
  auto six = Engine(o);
  ASSERT_TRUE(six->Generate(reqs).ok());
  EXPECT_LT(ninety->decode_steps(), six->decode_steps());
}

// The cache's blocks within a memory budget: utilization x total less what is in use.
TEST(KvCacheBlocks, FitTheBudgetAndNeverExceedWhatIsWanted) {
  const runtime::Backend::DeviceMemory gpu{100 << 20, 60 << 20};  // 100 MiB, 40 in use
  EXPECT_EQ(KvCacheBlocks(1000, 1 << 20, gpu, 0.9), 50);   // 90 - 40 MiB of 1 MiB blocks
  EXPECT_EQ(KvCacheBlocks(20, 1 << 20, gpu, 0.9), 20);     // no more than wanted
  EXPECT_EQ(KvCacheBlocks(1000, 3 << 20, gpu, 0.5), 3);    // 10 MiB: three whole blocks
  EXPECT_EQ(KvCacheBlocks(1000, 1 << 20, gpu, 0.3), 0);    // already past the budget
}

TEST_F(RolloutTest, StopTokensEndASampleAndFreeItsBlocks) {
  // Greedy from one prompt: take its 4th generated token as a stop token; the rerun stops
  // there (the stop token kept), and the cache, one request's worth, serves both in turn.
  RolloutOptions o;
  o.block_size = 4, o.num_blocks = 6, o.max_running = 8;
  auto e = Engine(o);
  GenerationRequest r;
  r.prompt = model::test::RandomBatch(Config().vocab, 9, {7}).tokens;
  r.params.temperature = 0, r.params.max_new_tokens = 16;
  auto free_run = e->Generate({r});
  ASSERT_TRUE(free_run.ok()) << free_run.status();
  const std::vector<int32_t>& t = (*free_run)[0].tokens;
  const size_t first = std::find(t.begin(), t.end(), t[3]) - t.begin();  // its first occurrence
  r.params.stop_tokens = {t[3]};
  auto stopped = e->Generate({r, r});  // 2 x 23 tokens > 24 slots: the second waits for the first's blocks
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  for (const Completion& c : *stopped) {
    EXPECT_EQ(c.finish_reason, "stop");
    EXPECT_EQ(c.tokens, std::vector<int32_t>(t.begin(), t.begin() + first + 1));
  }
}

// A decode-only generation step (each row's key and value go to the cache within its
// attention) gives the logits of the same rows as an ordinary step, and refuses rows that
// are not each the next token of a sequence of its own.
TEST_F(RolloutTest, ADecodeOnlyStepEqualsAPlainOneAndRefusesDependentRows) {
  auto gen = model::Generator::Create(model_.get(), /*blocks=*/8, /*block_size=*/4);
  ASSERT_TRUE(gen.ok()) << gen.status();
  auto tokens = [&](std::vector<int32_t> v) {
    auto t = *be_->Empty({static_cast<int64_t>(v.size())}, DType::kI32);
    std::copy(v.begin(), v.end(), t.data_as<int32_t>());
    return t;
  };
  // Two sequences of 5 and 3 prompt tokens: blocks {0, 1} and {2}.
  model::Generator::StepRows pre;
  pre.tokens = tokens({5, 6, 7, 8, 9, 10, 11, 12});
  pre.positions = {0, 1, 2, 3, 4, 0, 1, 2};
  pre.slots = {0, 1, 2, 3, 4, 8, 9, 10};
  pre.cu_seqlens = {0, 5, 8};
  ASSERT_TRUE((*gen)->Step(pre).status().ok());
  model::Generator::StepRows step;
  step.tokens = tokens({13, 14});
  step.positions = {5, 3}, step.slots = {5, 11}, step.lens = {6, 4}, step.max_blocks = 2;
  step.tables = {0, 1, 2, -1};
  step.logits_of = {0, 1};
  auto plain = (*gen)->Step(step);  // writes the same slots again: equal keys and values
  ASSERT_TRUE(plain.ok()) << plain.status();
  const std::vector<float> want(plain->data_as<float>(), plain->data_as<float>() + plain->numel());
  step.decode_only = true;
  auto fused = (*gen)->Step(step);
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ(std::vector<float>(fused->data_as<float>(), fused->data_as<float>() + fused->numel()), want);
  auto refused = [&](model::Generator::StepRows r) { return std::string((*gen)->Step(r).status().message()); };
  model::Generator::StepRows wrong_slot = step;
  wrong_slot.slots = {6, 11};
  EXPECT_THAT(refused(wrong_slot), HasSubstr("decode-only step: row 0's slot 6 is not the last of its context (slot 5)"));
  model::Generator::StepRows chunk = step;  // two tokens of the first sequence
  chunk.positions = {5, 6}, chunk.slots = {5, 6}, chunk.lens = {6, 7}, chunk.tables = {0, 1, 0, 1};
  EXPECT_THAT(refused(chunk), HasSubstr("decode-only step: row 0's context holds block 1, where row 1 writes"));
}

TEST_F(RolloutTest, BadRequestsAreRefusedByName) {
  RolloutOptions o;
  o.block_size = 4, o.num_blocks = 4;
  auto e = Engine(o);
  GenerationRequest ok;
  ok.prompt = {1, 2, 3};
  ok.params.max_new_tokens = 4;
  auto with = [&](auto edit) {
    GenerationRequest r = ok;
    edit(r);
    auto s = e->Generate({ok, r});
    return std::string(s.status().message());
  };
  EXPECT_THAT(with([](GenerationRequest& r) { r.prompt.clear(); }), HasSubstr("requests[1]: empty prompt"));
  EXPECT_THAT(with([](GenerationRequest& r) { r.prompt[1] = 97; }), HasSubstr("prompt token 97 is not in the vocabulary"));
  EXPECT_THAT(with([](GenerationRequest& r) { r.params.max_new_tokens = 20; }),
              HasSubstr("prompt (3) + max_new_tokens (20) = 23 tokens; the KV cache holds 16"));
  EXPECT_THAT(with([](GenerationRequest& r) { r.params.top_p = 0; }), HasSubstr("top_p = 0"));
  EXPECT_THAT(with([](GenerationRequest& r) { r.params.n = 0; }), HasSubstr("n = 0"));
  EXPECT_THAT(with([](GenerationRequest& r) { r.params.temperature = -1; }), HasSubstr("temperature = -1"));
  // Nothing ran for a refused batch; a good one still runs (the cache was not disturbed).
  auto good = e->Generate({ok});
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ((*good)[0].tokens.size(), 4u);
}

// Tensor parallelism: `tp` ranks (threads, Gloo) hold their share of the heads and of the
// vocabulary each — the cache too — and gather the logits; all sample the same tokens,
// equal to one rank's, with log-probs within 1e-5.
void TpEqualsOneRank(const model::LlamaConfig& c, int tp) {
  auto reqs = Requests(c.vocab, /*temperature=*/1.f, /*n=*/2, 8);
  RolloutOptions o;
  o.block_size = 4, o.num_blocks = 48, o.max_running = 4;
  auto run = [&](comm::Communicator* group, std::vector<Completion>* out) {
    auto be = runtime::MakeCpuBackend();
    auto m = Llama::Create(c, be.get(), group);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE((*m)->InitRandom(3, 0.2f).ok());
    auto e = RolloutEngine::Create(m->get(), o);
    ASSERT_TRUE(e.ok()) << e.status();
    auto got = (*e)->Generate(reqs);
    ASSERT_TRUE(got.ok()) << got.status();
    *out = std::move(*got);
  };
  std::vector<Completion> one;
  std::vector<std::vector<Completion>> ranks(tp);
  run(nullptr, &one);
  tessera::testing::MemStore store;
  const std::string key = RandomHex(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r)
    threads.emplace_back([&, r] {
      auto group = comm::MakeGlooCommunicator("test/rollout/tp", key, r, tp, &store, {"127.0.0.1", 60000});
      ASSERT_TRUE(group.ok()) << group.status();
      run(group->get(), &ranks[r]);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < tp; ++r) {
    ASSERT_EQ(ranks[r].size(), one.size());
    for (size_t i = 0; i < one.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "tp " << tp << " rank " << r << " completion " << i);
      EXPECT_EQ(ranks[r][i].tokens, one[i].tokens);
      for (size_t k = 0; k < one[i].logprobs.size() && k < ranks[r][i].logprobs.size(); ++k)
        EXPECT_NEAR(ranks[r][i].logprobs[k], one[i].logprobs[k], 1e-5);
    }
  }
}

TEST(RolloutTp, Tp2EqualsOneRank) {
  model::LlamaConfig c = Config();
  c.vocab = 98;  // a multiple of tp
  TpEqualsOneRank(c, 2);
}

// More TP ranks than KV heads: each rank's cache holds the one KV head its query heads
// use (one head on both ranks at TP 2; two heads on two ranks each at TP 4).
TEST(RolloutTp, ReplicatedKvHeadsEqualOneRank) {
  model::LlamaConfig c = Config();
  c.vocab = 100;
  c.kv_heads = 1;
  TpEqualsOneRank(c, 2);
  c.kv_heads = 2;
  TpEqualsOneRank(c, 4);
}

}  // namespace
}  // namespace tessera::engine
