// Tensor parallelism of the Llama on the CPU backend: tp = 2 ranks (threads, Gloo over
// loopback) against one rank on the same model and data — per-step losses and the
// gathered weights after three AdamW steps within 1e-5 relative, the gathered gradients
// of the first step too. Plain and tied + QKV bias, GQA, with and without sequence
// parallelism.
#include <cmath>
#include <random>
#include <thread>

#include "common/util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/mem_store.h"
#include "tests/worker/model/model_test_util.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/model/llama.h"

namespace tessera::model {
namespace {
using runtime::Tensor;

LlamaConfig Tiny(bool tied, bool bias) { return test::TinyConfig(14, tied, bias); }
// Three sequences (6, 3, 5 tokens): 11 targets.
TokenBatch MakeBatch(int64_t vocab, uint64_t seed) { return test::RandomBatch(vocab, seed, {6, 3, 5}); }

// What one run records: per-step losses, first-step gradients and final weights (global).
struct Trace {
  std::vector<double> losses;
  std::map<std::string, std::vector<float>> grads, weights;
};

// Three steps of token-mean loss + AdamW on `comm`'s rank (comm null: one rank).
void Train(const LlamaConfig& config, comm::Communicator* tp, bool sp, Trace& out) {
  auto be = runtime::MakeCpuBackend();
  auto made = Llama::Create(config, be.get(), tp, sp);
  ASSERT_TRUE(made.ok()) << made.status();
  Llama& m = **made;
  ASSERT_TRUE(m.InitRandom(3, 0.3f).ok());
  std::vector<Tensor> mom, var;
  for (auto& p : m.params()) {
    mom.push_back(*be->Empty(p.value.shape(), tessera::DType::kF32));
    var.push_back(*be->Empty(p.value.shape(), tessera::DType::kF32));
    ASSERT_TRUE(be->Fill(mom.back(), 0).ok() && be->Fill(var.back(), 0).ok());
  }
  for (int step = 1; step <= 3; ++step) {
    const TokenBatch batch = MakeBatch(config.vocab, 100 + step);
    ASSERT_TRUE(m.ZeroGrads().ok());
    auto l = m.ForwardBackward(batch, 1.f / 11);
    ASSERT_TRUE(l.ok()) << l.status();
    ASSERT_EQ(l->tokens, 11);
    out.losses.push_back(l->sum / l->tokens);
    if (step == 1)
      for (auto& p : m.params()) out.grads[p.name()] = *m.GatherGlobal(p, /*grad=*/true);
    runtime::AdamWParams hp{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, step};
    for (size_t i = 0; i < m.params().size(); ++i)
      ASSERT_TRUE(be->AdamW(m.params()[i].value, m.params()[i].grad, mom[i], var[i], hp).ok());
  }
  for (auto& p : m.params()) out.weights[p.name()] = *m.GatherGlobal(p, /*grad=*/false);
}

using test::RelDiff;

struct Variant {
  bool tied, bias, sp;
};
void PrintTo(const Variant& v, std::ostream* os) { *os << v.tied << v.bias << v.sp; }

class LlamaTpTest : public ::testing::TestWithParam<Variant> {};

TEST_P(LlamaTpTest, Tp2EqualsOneRank) {
  const Variant v = GetParam();
  const LlamaConfig config = Tiny(v.tied, v.bias);
  Trace one;
  Train(config, nullptr, false, one);
  testing::MemStore store;
  const std::string key = RandomHex(4);
  Trace ranks[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      auto c = comm::MakeGlooCommunicator("test/tp/0", key, r, 2, &store, {"127.0.0.1", 60000});
      ASSERT_TRUE(c.ok()) << c.status();
      Train(config, c->get(), v.sp, ranks[r]);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    ASSERT_EQ(ranks[r].losses.size(), 3u);
    for (int s = 0; s < 3; ++s) EXPECT_NEAR(ranks[r].losses[s], one.losses[s], 1e-5 * one.losses[s]) << "step " << s + 1;
    for (auto& [name, g] : one.grads) EXPECT_LT(RelDiff(ranks[r].grads[name], g), 1e-5) << name << " (gradient)";
    for (auto& [name, w] : one.weights) EXPECT_LT(RelDiff(ranks[r].weights[name], w), 1e-5) << name << " (weight)";
  }
  EXPECT_GT(one.losses[0], one.losses[2]);  // the steps did something
}

// Per-token log-probs and entropies over a vocabulary split in two (the shards' partial
// sums rescaled to the global max and added) equal one rank's.
TEST_P(LlamaTpTest, Tp2TokenLogProbsEqualOneRank) {
  const Variant v = GetParam();
  const LlamaConfig config = Tiny(v.tied, v.bias);
  const TokenBatch batch = MakeBatch(config.vocab, 7);
  auto run = [&](comm::Communicator* tp, bool sp, Llama::TokenStats& out) {
    auto be = runtime::MakeCpuBackend();
    auto m = Llama::Create(config, be.get(), tp, sp);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE((*m)->InitRandom(3, 0.3f).ok());
    auto s = (*m)->TokenLogProbs(batch);
    ASSERT_TRUE(s.ok()) << s.status();
    out = *s;
  };
  Llama::TokenStats one, ranks[2];
  run(nullptr, false, one);
  testing::MemStore store;
  const std::string key = RandomHex(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      auto c = comm::MakeGlooCommunicator("test/tp/0", key, r, 2, &store, {"127.0.0.1", 60000});
      ASSERT_TRUE(c.ok()) << c.status();
      run(c->get(), v.sp, ranks[r]);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_LT(RelDiff(ranks[r].logprob, one.logprob), 1e-5) << "rank " << r;
    EXPECT_LT(RelDiff(ranks[r].entropy, one.entropy), 1e-5) << "rank " << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, LlamaTpTest,
                         ::testing::Values(Variant{false, false, false}, Variant{true, true, false},
                                           Variant{false, false, true}, Variant{true, true, true}),
                         [](const auto& info) {
                           return std::string(info.param.tied ? "tied" : "untied") + (info.param.bias ? "_bias" : "") +
                                  (info.param.sp ? "_sp" : "");
                         });

}  // namespace
}  // namespace tessera::model
