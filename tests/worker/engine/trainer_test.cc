// The optimizer step across layouts on the CPU backend (threads, Gloo over loopback):
// dp2, dp2 ZeRO-1/2/3, tp2 x dp2 ZeRO-1 and ZeRO-3, cp2 (ring attention), tp2 x cp2 and
// cp2 x dp2 ZeRO-1 against one rank that accumulates
// the same four micro-batches — per-step losses, gradient norms (clipping active) and
// the final weights within 1e-5 relative. Plus the learning-rate schedule and bad options.
#include "worker/engine/trainer.h"

#include <cmath>
#include <map>
#include <random>
#include <thread>

#include "common/util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/mem_store.h"
#include "tests/worker/model/model_test_util.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/model/context_parallel.h"

namespace tessera::engine {
namespace {
using ::testing::HasSubstr;
using model::Llama;
using model::LlamaConfig;
using model::TokenBatch;

TEST(LearningRate, WarmupThenCosine) {
  OptimizerOptions o;
  o.lr = 1.f, o.min_lr = 0.1f, o.warmup_steps = 4, o.total_steps = 14;
  EXPECT_FLOAT_EQ(LearningRate(o, 1), 0.25f);
  EXPECT_FLOAT_EQ(LearningRate(o, 4), 1.f);
  EXPECT_NEAR(LearningRate(o, 9), 0.55f, 1e-6);  // half way down the cosine
  EXPECT_FLOAT_EQ(LearningRate(o, 14), 0.1f);
  EXPECT_FLOAT_EQ(LearningRate(o, 20), 0.1f);  // stays at min_lr
}

LlamaConfig Tiny(bool tied = false) { return model::test::TinyConfig(14, tied, true); }
// Two sequences (5 and 2-5 tokens).
TokenBatch MakeBatch(int64_t vocab, uint64_t seed) {
  return model::test::RandomBatch(vocab, seed, {5, 2 + static_cast<int>(seed % 4)});
}

struct Trace {
  std::vector<double> losses, norms;
  std::map<std::string, std::vector<float>> weights;
};

// Three steps; the global batch of step s is micro-batches 4s .. 4s+3, split evenly over
// the DP ranks.
// dp: the gradient-reduction group (DP x CP); cp: the context-parallel group, whose
// ranks each take their split of every micro-batch.
void Train(int zero, bool tied, comm::Communicator* tp, comm::Communicator* dp, comm::Communicator* cp, int dp_size,
           int dp_rank, Trace& out) {
  auto be = runtime::MakeCpuBackend();
  auto model = Llama::Create(Tiny(tied), be.get(), tp, false, cp);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE((*model)->InitRandom(9, 0.3f).ok());
  OptimizerOptions o;
  o.lr = 2e-2f, o.min_lr = 2e-3f, o.warmup_steps = 1, o.total_steps = 3, o.clip_norm = 0.5f, o.zero = zero;
  auto trainer = Trainer::Create(model->get(), be.get(), dp, tp, o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const int dps = dp_size, dpr = dp_rank;
  for (int s = 0; s < 3; ++s) {
    std::vector<TokenBatch> mine;
    for (int k = 0; k < 4 / dps; ++k) {
      mine.push_back(MakeBatch(14, 4 * s + dpr * (4 / dps) + k));
      if (cp != nullptr) {
        auto split = model::SplitForContextParallel(mine.back(), cp->size(), cp->rank());
        ASSERT_TRUE(split.ok()) << split.status();
        mine.back() = *split;
      }
    }
    auto st = (*trainer)->Step(mine);
    ASSERT_TRUE(st.ok()) << st.status();
    out.losses.push_back(st->loss);
    out.norms.push_back(st->grad_norm);
  }
  // What each stage keeps between steps: ZeRO-2 no gradient buffers, ZeRO-3 no values either.
  if (dp != nullptr && zero >= 2)
    for (auto& p : (*model)->params()) {
      EXPECT_FALSE(p.grad.defined()) << p.name();
      EXPECT_EQ(p.value.defined(), zero < 3) << p.name();
    }
  ASSERT_TRUE((*trainer)->GatherParams().ok());
  for (auto& p : (*model)->params()) out.weights[p.name()] = *(*model)->GatherGlobal(p, false);
}

using model::test::RelDiff;

struct Layout {
  const char* name;
  int tp, dp, zero;
  bool tied = false;  // tied embeddings: the embedding is used by the first and the last block
  int cp = 1;
};

void PrintTo(const Layout& l, std::ostream* os) { *os << l.name; }

class TrainerLayoutTest : public ::testing::TestWithParam<Layout> {};

TEST_P(TrainerLayoutTest, EqualsOneRank) {
  const Layout l = GetParam();
  Trace one;
  Train(0, l.tied, nullptr, nullptr, nullptr, 1, 0, one);
  ASSERT_EQ(one.norms.size(), 3u);
  EXPECT_GT(one.norms[0], 0.5);  // clipping is exercised
  testing::MemStore store;
  const std::string key = RandomHex(4);
  const int world = l.tp * l.cp * l.dp;
  std::vector<Trace> traces(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      // tp fastest, then cp, then dp (DESIGN §3); the gradient group is DP x CP.
      const int tpr = r % l.tp, cpr = (r / l.tp) % l.cp, dpr = r / (l.tp * l.cp), dpcp = cpr + l.cp * dpr;
      std::unique_ptr<comm::Communicator> tp, dp, cp;
      auto make = [&](const std::string& group, int rank, int size, std::unique_ptr<comm::Communicator>& out) {
        if (size == 1) return;
        auto c = comm::MakeGlooCommunicator("test/" + group, absl::StrCat(key, "/", group), rank, size, &store,
                                            {"127.0.0.1", 60000});
        ASSERT_TRUE(c.ok()) << c.status();
        out = std::move(*c);
      };
      make(absl::StrCat("tp", cpr, ".", dpr), tpr, l.tp, tp);
      make(absl::StrCat("dpcp", tpr), dpcp, l.cp * l.dp, dp);
      make(absl::StrCat("cp", tpr, ".", dpr), cpr, l.cp, cp);
      Train(l.zero, l.tied, tp.get(), dp.get(), cp.get(), l.dp, dpr, traces[r]);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE(::testing::Message() << l.name << " rank " << r);
    ASSERT_EQ(traces[r].losses.size(), 3u);
    for (int s = 0; s < 3; ++s) {
      EXPECT_NEAR(traces[r].losses[s], one.losses[s], 1e-5 * one.losses[s]) << "loss, step " << s + 1;
      EXPECT_NEAR(traces[r].norms[s], one.norms[s], 1e-5 * one.norms[s]) << "grad norm, step " << s + 1;
    }
    for (auto& [name, w] : one.weights) EXPECT_LT(RelDiff(traces[r].weights[name], w), 1e-5) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, TrainerLayoutTest,
                         ::testing::Values(Layout{"dp2", 1, 2, 0}, Layout{"dp2_zero1", 1, 2, 1},
                                           Layout{"dp2_zero2", 1, 2, 2}, Layout{"dp2_zero3", 1, 2, 3},
                                           Layout{"dp2_zero2_tied", 1, 2, 2, true}, Layout{"dp2_zero3_tied", 1, 2, 3, true},
                                           Layout{"tp2_dp2_zero1", 2, 2, 1}, Layout{"tp2_dp2_zero3", 2, 2, 3},
                                           Layout{"cp2", 1, 1, 0, false, 2}, Layout{"cp2_tied", 1, 1, 0, true, 2},
                                           Layout{"tp2_cp2", 2, 1, 0, false, 2},
                                           Layout{"cp2_dp2_zero1", 1, 2, 1, false, 2}),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(TrainerTest, RejectsBadOptions) {
  auto be = runtime::MakeCpuBackend();
  auto model = Llama::Create(Tiny(), be.get());
  ASSERT_TRUE(model.ok());
  OptimizerOptions o;
  o.zero = 4;
  EXPECT_THAT(std::string(Trainer::Create(model->get(), be.get(), nullptr, nullptr, o).status().message()),
              HasSubstr("zero must be 0, 1, 2 or 3"));
  o = OptimizerOptions();
  o.min_lr = 1.f;
  EXPECT_THAT(std::string(Trainer::Create(model->get(), be.get(), nullptr, nullptr, o).status().message()),
              HasSubstr("min_lr <= lr"));
  o = OptimizerOptions();
  auto t = Trainer::Create(model->get(), be.get(), nullptr, nullptr, o);
  ASSERT_TRUE(t.ok());
  TokenBatch b = MakeBatch(14, 1);
  for (auto& x : b.targets) x = -1;
  EXPECT_THAT(std::string((*t)->Step({b}).status().message()), HasSubstr("no target tokens"));
}

}  // namespace
}  // namespace tessera::engine
