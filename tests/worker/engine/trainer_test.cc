// The optimizer step across layouts on the CPU backend (threads, Gloo over loopback):
// dp2, dp2 ZeRO-1/2/3, tp2 x dp2 ZeRO-1 and ZeRO-3, cp2 (ring attention), tp2 x cp2,
// cp2 x dp2 ZeRO-1, pipelines (pp2 1F1B and GPipe, pp2 vpp2, pp4 vpp2 interleaved 1F1B and
// GPipe) and the 8-rank tp2 x pp2 x dp2 ZeRO-1 and tp2 + sp x cp2 x pp2 against one rank that accumulates
// the same four micro-batches — per-step losses, gradient norms (clipping active) and
// the final weights within 1e-5 relative. Plus the learning-rate schedule and bad options.
#include "worker/engine/trainer.h"

#include <cmath>
#include <map>
#include <set>
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

LlamaConfig Tiny(bool tied = false, int64_t layers = 2) {
  auto c = model::test::TinyConfig(14, tied, true);
  c.layers = layers;
  return c;
}
// Two sequences (5 and 2-5 tokens).
TokenBatch MakeBatch(int64_t vocab, uint64_t seed) {
  return model::test::RandomBatch(vocab, seed, {5, 2 + static_cast<int>(seed % 4)});
}

struct Trace {
  std::vector<double> losses, norms;
  std::map<std::string, std::vector<float>> weights;  // what this rank holds
};

struct Layout {
  const char* name;
  int tp, dp, zero;
  bool tied = false;  // tied embeddings: the embedding is used by the first and the last block
  int cp = 1, pp = 1, vpp = 1;
  Schedule schedule = Schedule::kOneFOneB;
  bool sp = false;  // with cp (the split pads every sequence to a multiple of 2·cp·tp)
  int64_t layers = 2;
};

void PrintTo(const Layout& l, std::ostream* os) { *os << l.name; }

struct Comms {
  comm::Communicator *tp = nullptr, *dp = nullptr, *cp = nullptr, *pp = nullptr;
  int dp_size = 1, dp_rank = 0, pp_rank = 0;
};

// Three steps; the global batch of step s is micro-batches 4s .. 4s+3, split evenly over
// the DP ranks; CP ranks take their split of each, PP stages all of the DP rank's.
void Train(const Layout& l, const Comms& c, Trace& out) {
  auto be = runtime::MakeCpuBackend();
  auto model = Llama::Create(Tiny(l.tied, l.layers), be.get(), c.tp, l.sp, c.cp, model::StageSpec{l.pp, c.pp_rank, l.vpp});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE((*model)->InitRandom(9, 0.3f).ok());
  OptimizerOptions o;
  o.lr = 2e-2f, o.min_lr = 2e-3f, o.warmup_steps = 1, o.total_steps = 3, o.clip_norm = 0.5f, o.zero = l.zero;
  o.schedule = l.schedule;
  auto trainer = Trainer::Create(model->get(), be.get(), c.dp, c.tp, o, c.pp);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const int dps = c.dp_size, dpr = c.dp_rank;
  for (int s = 0; s < 3; ++s) {
    std::vector<TokenBatch> mine;
    for (int k = 0; k < 4 / dps; ++k) {
      mine.push_back(MakeBatch(14, 4 * s + dpr * (4 / dps) + k));
      if (c.cp != nullptr) {
        auto split = model::SplitForContextParallel(mine.back(), c.cp->size(), c.cp->rank(), l.sp ? l.tp : 1);
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
  if (c.dp != nullptr && l.zero >= 2)
    for (auto& p : (*model)->params()) {
      EXPECT_FALSE(p.grad.defined()) << p.name();
      EXPECT_EQ(p.value.defined(), l.zero < 3) << p.name();
    }
  ASSERT_TRUE((*trainer)->GatherParams().ok());
  for (auto& p : (*model)->params()) out.weights[p.name()] = *(*model)->GatherGlobal(p, false);
}

using model::test::RelDiff;

class TrainerLayoutTest : public ::testing::TestWithParam<Layout> {};

TEST_P(TrainerLayoutTest, EqualsOneRank) {
  const Layout l = GetParam();
  Trace one;
  Layout single{"one", 1, 1, 0, l.tied};
  single.layers = l.layers;
  Train(single, Comms{}, one);
  ASSERT_EQ(one.norms.size(), 3u);
  EXPECT_GT(one.norms[0], 0.5);  // clipping is exercised
  testing::MemStore store;
  const std::string key = RandomHex(4);
  const int world = l.tp * l.cp * l.dp * l.pp;
  std::vector<Trace> traces(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      // tp fastest, then cp, dp, pp (DESIGN §3); the gradient group is DP x CP.
      const int tpr = r % l.tp, cpr = (r / l.tp) % l.cp, dpr = (r / (l.tp * l.cp)) % l.dp, ppr = r / (l.tp * l.cp * l.dp);
      const int dpcp = cpr + l.cp * dpr;
      std::unique_ptr<comm::Communicator> tp, dp, cp, pp;
      auto make = [&](const std::string& group, int rank, int size, std::unique_ptr<comm::Communicator>& out) {
        if (size == 1) return;
        auto c = comm::MakeGlooCommunicator("test/" + group, absl::StrCat(key, "/", group), rank, size, &store,
                                            {"127.0.0.1", 60000});
        ASSERT_TRUE(c.ok()) << c.status();
        out = std::move(*c);
      };
      make(absl::StrCat("tp", cpr, ".", dpr, ".", ppr), tpr, l.tp, tp);
      make(absl::StrCat("dpcp", tpr, ".", ppr), dpcp, l.cp * l.dp, dp);
      make(absl::StrCat("cp", tpr, ".", dpr, ".", ppr), cpr, l.cp, cp);
      make(absl::StrCat("pp", tpr, ".", cpr, ".", dpr), ppr, l.pp, pp);
      Train(l, Comms{tp.get(), dp.get(), cp.get(), pp.get(), l.dp, dpr, ppr}, traces[r]);
    });
  for (auto& t : threads) t.join();
  std::set<std::string> covered;
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE(::testing::Message() << l.name << " rank " << r);
    ASSERT_EQ(traces[r].losses.size(), 3u);
    for (int s = 0; s < 3; ++s) {
      EXPECT_NEAR(traces[r].losses[s], one.losses[s], 1e-5 * one.losses[s]) << "loss, step " << s + 1;
      EXPECT_NEAR(traces[r].norms[s], one.norms[s], 1e-5 * one.norms[s]) << "grad norm, step " << s + 1;
    }
    for (auto& [name, w] : traces[r].weights) {
      // The key bias's gradient is exactly zero (softmax ignores a constant added to all of
      // a query's scores): only rounding noise reaches it, which AdamW scales up to lr-sized
      // steps, so its value depends on the layout's summation order (seen 1.1e-5 under tp2
      // sp cp2 pp2). Every other tensor: 1e-5.
      const double tol = name.find("k_proj.bias") != std::string::npos ? 1e-4 : 1e-5;
      EXPECT_LT(RelDiff(w, one.weights[name]), tol) << name;
      covered.insert(name);
    }
  }
  EXPECT_EQ(covered.size(), one.weights.size());  // the stages hold the whole model between them
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, TrainerLayoutTest,
    ::testing::Values(
        Layout{"dp2", 1, 2, 0}, Layout{"dp2_zero1", 1, 2, 1}, Layout{"dp2_zero2", 1, 2, 2}, Layout{"dp2_zero3", 1, 2, 3},
        Layout{"dp2_zero2_tied", 1, 2, 2, true}, Layout{"dp2_zero3_tied", 1, 2, 3, true},
        Layout{"tp2_dp2_zero1", 2, 2, 1}, Layout{"tp2_dp2_zero3", 2, 2, 3}, Layout{"cp2", 1, 1, 0, false, 2},
        Layout{"cp2_tied", 1, 1, 0, true, 2}, Layout{"tp2_cp2", 2, 1, 0, false, 2},
        Layout{"cp2_dp2_zero1", 1, 2, 1, false, 2},
        Layout{"pp2_1f1b", 1, 1, 0, false, 1, 2, 1, Schedule::kOneFOneB, false, 4},
        Layout{"pp2_gpipe_tied", 1, 1, 0, true, 1, 2, 1, Schedule::kGPipe, false, 4},
        Layout{"pp2_vpp2", 1, 1, 0, false, 1, 2, 2, Schedule::kOneFOneB, false, 8},
        Layout{"pp4_vpp2_1f1b", 1, 1, 0, true, 1, 4, 2, Schedule::kOneFOneB, false, 8},
        Layout{"pp4_vpp2_gpipe", 1, 1, 0, true, 1, 4, 2, Schedule::kGPipe, false, 8},
        Layout{"tp2_pp2_dp2_zero1", 2, 2, 1, false, 1, 2, 1, Schedule::kOneFOneB, false, 4},
        Layout{"pp2_dp2_zero1_tied", 1, 2, 1, true, 1, 2, 1, Schedule::kOneFOneB, false, 4},
        Layout{"tp2_sp_cp2_pp2", 2, 1, 0, false, 2, 2, 1, Schedule::kOneFOneB, true, 4}),
    [](const auto& info) { return std::string(info.param.name); });

// Every schedule runs each (chunk, micro-batch) forward once and backward once, the
// backward after the forward; 1F1B holds at most pp - rank forwards in flight (vpp 1);
// the interleaved warm-up follows Megatron's formula.
TEST(PipelineSchedule, ShapesAndBounds) {
  for (Schedule sched : {Schedule::kOneFOneB, Schedule::kGPipe})
    for (auto [pp, vpp, m] : {std::tuple{2, 1, 4}, std::tuple{4, 1, 8}, std::tuple{4, 2, 8}, std::tuple{2, 3, 4}})
      for (int r = 0; r < pp; ++r) {
        SCOPED_TRACE(::testing::Message() << "pp " << pp << " vpp " << vpp << " m " << m << " rank " << r);
        auto ops = PipelineSchedule(sched, pp, vpp, r, m);
        ASSERT_TRUE(ops.ok()) << ops.status();
        std::map<std::pair<int, int64_t>, int> state;  // 1 after the forward, 2 after the backward
        int in_flight = 0, most = 0;
        for (const PipeOp& op : *ops) {
          auto& st = state[{op.chunk, op.micro_batch}];
          EXPECT_EQ(st, op.forward ? 0 : 1);
          st = op.forward ? 1 : 2;
          in_flight += op.forward ? 1 : -1;
          most = std::max(most, in_flight);
        }
        EXPECT_EQ(state.size(), size_t(vpp * m));
        for (auto& [k, st] : state) EXPECT_EQ(st, 2);
        int expect = vpp * m;  // GPipe: everything in flight
        if (sched == Schedule::kOneFOneB) expect = vpp == 1 ? std::min(pp - r, m) : std::min((pp - r - 1) * 2 + (vpp - 1) * pp + 1, vpp * m);
        EXPECT_EQ(most, expect);
      }
  EXPECT_THAT(std::string(PipelineSchedule(Schedule::kOneFOneB, 4, 2, 0, 6).status().message()),
              HasSubstr("multiple of pp"));
  EXPECT_FALSE(ParseSchedule("zigzag").ok());
  EXPECT_EQ(*ParseSchedule("gpipe"), Schedule::kGPipe);
}

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
