// The training engine on the CUDA backend (one GPU, f32): three optimizer steps of the
// Llama (GQA, tied embeddings, QKV bias; plain and with recomputation) give the CPU
// oracle's losses, gradient norms and weights within 1e-4 relative (f32 GEMMs without
// TF32; the CUDA reductions sum in other orders). Skips where there is no GPU.
#include <map>

#include "gtest/gtest.h"
#include "tests/worker/model/model_test_util.h"
#include "worker/train/trainer.h"

namespace tessera::engine {
namespace {

struct Result {
  std::vector<double> losses, norms;
  std::map<std::string, std::vector<float>> weights;
};

Result Train(runtime::Backend* be, bool recompute) {
  model::LlamaConfig c = model::test::TinyConfig(256, /*tied=*/true, /*bias=*/true);
  c.hidden = 64, c.heads = 4, c.kv_heads = 2, c.ffn = 128, c.layers = 2;
  Result r;
  auto m = model::Llama::Create(c, be);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return r;
  EXPECT_TRUE((*m)->InitRandom(3, 0.1f).ok());
  (*m)->set_recompute(recompute);
  OptimizerOptions o;
  o.lr = 1e-2f, o.min_lr = 1e-3f, o.warmup_steps = 1, o.total_steps = 3, o.clip_norm = 1.f;
  auto t = Trainer::Create(m->get(), be, nullptr, nullptr, o);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return r;
  for (int s = 0; s < 3; ++s) {
    std::vector<model::TokenBatch> mbs;
    for (int k = 0; k < 2; ++k) mbs.push_back(model::test::RandomBatch(256, 10 * s + k, {37, 64, 5}));
    auto st = (*t)->Step(mbs);
    EXPECT_TRUE(st.ok()) << st.status();
    if (!st.ok()) return r;
    r.losses.push_back(st->loss);
    r.norms.push_back(st->grad_norm);
  }
  for (auto& p : (*m)->params()) r.weights[p.name()] = *(*m)->GatherGlobal(p, false);
  return r;
}

TEST(LlamaCuda, TrainingEqualsTheCpuOracle) {
  auto gpu = runtime::MakeCudaBackend(0);
  if (!gpu.ok()) GTEST_SKIP() << gpu.status();
  auto cpu = runtime::MakeCpuBackend();
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "recompute" : "plain");
    const Result want = Train(cpu.get(), recompute), got = Train(gpu->get(), recompute);
    ASSERT_EQ(got.losses.size(), 3u);
    for (int s = 0; s < 3; ++s) {
      EXPECT_NEAR(got.losses[s], want.losses[s], 1e-4 * want.losses[s]) << "step " << s + 1;
      EXPECT_NEAR(got.norms[s], want.norms[s], 1e-4 * want.norms[s]) << "step " << s + 1;
    }
    for (auto& [name, w] : want.weights) EXPECT_LT(model::test::RelDiff(got.weights.at(name), w), 1e-4) << name;
  }
}

}  // namespace
}  // namespace tessera::engine
