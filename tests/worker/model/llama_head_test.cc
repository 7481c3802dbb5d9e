// The LM head in chunks of tokens (Llama::set_head_chunk_tokens) on the CPU backend:
// every head path — training's loss and gradients, the eval loss, the logits, RL's
// per-token log-probs and entropies, and the backward of a loss given through
// dL/dlogprob and dL/dentropy — equals one chunk's, at one rank and at TP 2 (threads,
// Gloo over loopback; with and without sequence parallelism), for chunks that divide
// the batch and one that leaves a short last chunk; and the activation peak falls.
#include <functional>
#include <map>
#include <thread>

#include "common/util.h"
#include "gtest/gtest.h"
#include "tests/common/mem_store.h"
#include "tests/worker/model/model_test_util.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/model/llama.h"

namespace tessera::model {
namespace {
using test::RelDiff;

// Everything the head gives for one batch (global gradients: gathered over TP).
struct HeadRun {
  double loss = 0, eval_loss = 0, rl_loss = 0;
  int64_t tokens = 0;
  std::vector<float> logits, logprob, entropy;
  std::map<std::string, std::vector<float>> grads, rl_grads;
};

// An RL-style loss through the log-probs and entropies: L = sum_t (w_t logp_t - 0.01 H_t).
Llama::TokenGrads RlGrads(const Llama::TokenStats& s) {
  Llama::TokenGrads g;
  for (size_t i = 0; i < s.logprob.size(); ++i) g.dlogprob.push_back(0.5f - 0.1f * static_cast<float>(i % 7));
  g.dentropy.assign(s.logprob.size(), -0.01f);
  return g;
}

void RunHead(const LlamaConfig& c, const TokenBatch& batch, int64_t chunk, comm::Communicator* tp, bool sp,
             HeadRun& out) {
  auto be = runtime::MakeCpuBackend();
  auto made = Llama::Create(c, be.get(), tp, sp);
  ASSERT_TRUE(made.ok()) << made.status();
  Llama& m = **made;
  ASSERT_TRUE(m.InitRandom(11, 0.3f).ok());
  m.set_head_chunk_tokens(chunk);
  ASSERT_TRUE(m.ZeroGrads().ok());
  auto l = m.ForwardBackward(batch, 0.25f);
  ASSERT_TRUE(l.ok()) << l.status();
  out.loss = l->sum, out.tokens = l->tokens;
  for (auto& p : m.params()) out.grads[p.name()] = *m.GatherGlobal(p, /*grad=*/true);
  auto e = m.Forward(batch);
  ASSERT_TRUE(e.ok()) << e.status();
  out.eval_loss = e->sum;
  auto z = m.ForwardLogits(batch);
  ASSERT_TRUE(z.ok()) << z.status();
  out.logits = *z;
  auto s = m.TokenLogProbs(batch);
  ASSERT_TRUE(s.ok()) << s.status();
  out.logprob = s->logprob, out.entropy = s->entropy;
  ASSERT_TRUE(m.ZeroGrads().ok());
  auto r = m.ForwardBackwardLogProbs(batch, [](const Llama::TokenStats& st) { return RlGrads(st); });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LT(RelDiff(r->logprob, out.logprob), 1e-6);
  for (auto& p : m.params()) out.rl_grads[p.name()] = *m.GatherGlobal(p, /*grad=*/true);
}

void ExpectSame(const HeadRun& got, const HeadRun& want) {
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_NEAR(got.loss, want.loss, 1e-5 * std::abs(want.loss));
  EXPECT_NEAR(got.eval_loss, want.eval_loss, 1e-5 * std::abs(want.eval_loss));
  EXPECT_LT(RelDiff(got.logits, want.logits), 1e-6);
  EXPECT_LT(RelDiff(got.logprob, want.logprob), 1e-6);
  EXPECT_LT(RelDiff(got.entropy, want.entropy), 1e-6);
  for (auto& [name, g] : want.grads) EXPECT_LT(RelDiff(got.grads.at(name), g), 1e-5) << name << " (loss gradient)";
  for (auto& [name, g] : want.rl_grads) EXPECT_LT(RelDiff(got.rl_grads.at(name), g), 1e-5) << name << " (RL gradient)";
}

// 26 tokens in three sequences.
TokenBatch Batch(int64_t vocab) { return test::RandomBatch(vocab, 5, {11, 6, 9}); }

TEST(HeadChunks, EveryHeadPathEqualsOneChunk) {
  for (bool tied : {false, true}) {
    const LlamaConfig c = test::TinyConfig(40, tied, /*bias=*/true);
    const TokenBatch batch = Batch(c.vocab);
    HeadRun whole;
    RunHead(c, batch, 0, nullptr, false, whole);  // the default: one chunk for so small a batch
    ASSERT_EQ(whole.logits.size(), size_t(26 * 40));
    for (int64_t chunk : {1, 5, 13}) {
      SCOPED_TRACE(::testing::Message() << (tied ? "tied" : "untied") << ", chunks of " << chunk << " tokens");
      HeadRun chunked;
      RunHead(c, batch, chunk, nullptr, false, chunked);
      ExpectSame(chunked, whole);
    }
  }
}

TEST(HeadChunks, Tp2ChunkedEqualsOneRank) {
  const LlamaConfig c = test::TinyConfig(40, /*tied=*/true, /*bias=*/false);
  const TokenBatch batch = Batch(c.vocab);
  HeadRun one;
  RunHead(c, batch, 0, nullptr, false, one);
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "tensor parallel");
    testing::MemStore store;
    const std::string key = RandomHex(4);
    HeadRun ranks[2];
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        auto comm = comm::MakeGlooCommunicator("test/tp/0", key, r, 2, &store, {"127.0.0.1", 60000});
        ASSERT_TRUE(comm.ok()) << comm.status();
        RunHead(c, batch, 7, comm->get(), sp, ranks[r]);
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < 2; ++r) {
      SCOPED_TRACE(::testing::Message() << "rank " << r);
      HeadRun want = one;
      want.logits.clear();  // each rank's logits are its half of the vocabulary
      for (int64_t i = 0; i < 26; ++i)
        want.logits.insert(want.logits.end(), one.logits.begin() + i * 40 + r * 20, one.logits.begin() + i * 40 + r * 20 + 20);
      ExpectSame(ranks[r], want);
    }
  }
}

// A vocabulary large beside the batch: chunks of 16 tokens hold ~1/12 of the logits the
// whole batch would, and the forward-backward's peak above the weights falls.
TEST(HeadChunks, ChunksLowerThePeak) {
  LlamaConfig c = test::TinyConfig(2048, /*tied=*/false, /*bias=*/false);
  const TokenBatch batch = test::RandomBatch(c.vocab, 3, {100, 90});
  int64_t peak[2];
  for (int k = 0; k < 2; ++k) {
    auto be = runtime::MakeCpuBackend();
    auto made = Llama::Create(c, be.get());
    ASSERT_TRUE(made.ok()) << made.status();
    ASSERT_TRUE((*made)->InitRandom(1, 0.1f).ok());
    (*made)->set_head_chunk_tokens(k == 0 ? 0 : 16);
    ASSERT_TRUE((*made)->ZeroGrads().ok());
    be->allocator()->ResetPeak();
    const int64_t base = be->allocator()->stats().current_bytes;
    ASSERT_TRUE((*made)->ForwardBackwardLogProbs(batch, [](const Llama::TokenStats& s) { return RlGrads(s); }).ok());
    peak[k] = be->allocator()->stats().peak_bytes - base;
  }
  const int64_t logits_bytes = 190 * 2048 * 4;
  EXPECT_LT(peak[1], peak[0] - logits_bytes) << "peak " << peak[1] << " chunked vs " << peak[0] << " whole";
}

}  // namespace
}  // namespace tessera::model
