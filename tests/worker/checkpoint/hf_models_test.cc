// Hugging Face directories of the architectures RL users train, as transformers saves
// them, against what transformers computes on them (tests/worker/checkpoint/hf_models/:
// gen_fixtures.py made each directory and its reference.safetensors in float64): Llama 3.2
// with llama3 RoPE scaling (bf16 weights, tied), Llama with linear and dynamic NTK
// scaling, Qwen2 with YaRN (QKV bias, tied) and Qwen3 (per-head q/k RMSNorm, head_dim
// independent of hidden / heads, bf16, tied). On the CPU oracle in f32: the RoPE
// frequencies, the logits of a 100-token sequence within 1e-4 of their scale, the
// gradients of the mean cross-entropy, and greedy decoding token for token (through the
// rollout engine's prefill and paged decode); Qwen3 also under TP 2; and an export reads
// back as the same family, RoPE scaling and logits.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "common/model/hf_config.h"
#include "common/model/rope.h"
#include "tests/common/mem_store.h"
#include "worker/checkpoint/hf.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/rollout/rollout.h"

namespace tessera::checkpoint {
namespace {

// A fixture's directory (or, given a path, that path).
std::string CaseDir(const std::string& name) {
  if (!name.empty() && name[0] == '/') return name;
  return absl::StrCat(TESSERA_SOURCE_DIR, "/tests/worker/checkpoint/hf_models/", name);
}

struct Reference {
  std::unique_ptr<SafetensorsReader> file;
  std::vector<float> Get(const std::string& name) const {
    auto v = file->ReadF32(name);
    EXPECT_TRUE(v.ok()) << name << ": " << v.status();
    return v.ok() ? *v : std::vector<float>{};
  }
  bool Has(const std::string& name) const { return file->tensors().count(name) > 0; }
};

Reference Load(const std::string& name) {
  auto r = SafetensorsReader::Open(CaseDir(name) + "/reference.safetensors");
  EXPECT_TRUE(r.ok()) << r.status();
  return {r.ok() ? std::move(*r) : nullptr};
}

std::vector<int32_t> Ints(const std::vector<float>& v) { return std::vector<int32_t>(v.begin(), v.end()); }

model::TokenBatch Sequence(const std::vector<int32_t>& tokens) { return model::TokenBatch::NextTokenSequence(tokens); }

double MaxAbs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

std::unique_ptr<model::Llama> Import(const std::string& name, runtime::Backend* be, comm::Communicator* tp = nullptr) {
  auto config = model::ReadHfConfig(CaseDir(name));
  EXPECT_TRUE(config.ok()) << config.status();
  if (!config.ok()) return nullptr;
  auto m = model::Llama::Create(*config, be, tp);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  auto st = ImportHf(CaseDir(name), **m);
  EXPECT_TRUE(st.ok()) << st;
  return std::move(*m);
}

class HfModels : public ::testing::TestWithParam<const char*> {};

TEST_P(HfModels, EqualTransformers) {
  const std::string name = GetParam();
  const Reference ref = Load(name);
  ASSERT_NE(ref.file, nullptr);
  auto be = runtime::MakeCpuBackend();
  auto m = Import(name, be.get());
  ASSERT_NE(m, nullptr);
  const std::vector<int32_t> tokens = Ints(ref.Get("tokens"));
  const int64_t t = static_cast<int64_t>(tokens.size()), vocab = m->config().vocab;

  // The rotary frequencies of this sequence's length, as transformers' rotary embedding holds them.
  const model::RopeFrequencies f = model::ComputeRopeFrequencies(m->config(), t);
  const std::vector<float> inv = ref.Get("inv_freq");
  ASSERT_EQ(f.inv_freq.size(), inv.size());
  for (size_t i = 0; i < inv.size(); ++i) EXPECT_NEAR(f.inv_freq[i], inv[i], 4e-7 * inv[i]) << "inv_freq[" << i << "]";
  EXPECT_NEAR(f.attention_scaling, ref.Get("attention_scaling")[0], 1e-6);

  // Logits, f32 against float64: within 1e-4 of their scale.
  auto logits = m->ForwardLogits(Sequence(tokens));
  ASSERT_TRUE(logits.ok()) << logits.status();
  const std::vector<float> want = ref.Get("logits");
  ASSERT_EQ(logits->size(), want.size());
  ASSERT_EQ(static_cast<int64_t>(want.size()), t * vocab);
  double diff = 0;
  for (size_t i = 0; i < want.size(); ++i) diff = std::max(diff, std::fabs(static_cast<double>((*logits)[i]) - want[i]));
  const double scale = MaxAbs(want);
  EXPECT_LE(diff, 1e-4 * scale) << "max |ours - transformers| " << diff << " at logits scale " << scale;

  // Gradients of the mean next-token cross-entropy (transformers' loss with labels = tokens).
  if (ref.Has("grad.model.norm.weight")) {
    ASSERT_TRUE(m->ZeroGrads().ok());
    auto loss = m->ForwardBackward(Sequence(tokens), 1.f / static_cast<float>(t - 1));
    ASSERT_TRUE(loss.ok()) << loss.status();
    int checked = 0;
    for (model::Param& p : m->params()) {
      const std::string key = "grad." + p.name();
      if (!ref.Has(key)) continue;
      ASSERT_TRUE(m->FreshenGrad(p).ok());
      auto got = m->GatherGlobal(p, /*grad=*/true);
      ASSERT_TRUE(got.ok()) << got.status();
      const std::vector<float> g = ref.Get(key);
      ASSERT_EQ(got->size(), g.size()) << p.name();
      double err = 0;
      for (size_t i = 0; i < g.size(); ++i) err = std::max(err, std::fabs(static_cast<double>((*got)[i]) - g[i]));
      EXPECT_LE(err, 1e-4 * MaxAbs(g)) << p.name() << ": max difference " << err << " at gradient scale " << MaxAbs(g);
      ++checked;
    }
    EXPECT_GE(checked, 5);
  }

  // Greedy decoding through prefill and paged decode, token for token.
  if (ref.Has("greedy")) {
    engine::RolloutOptions o;
    o.block_size = 4, o.num_blocks = 16, o.max_running = 1;
    auto e = engine::RolloutEngine::Create(m.get(), o);
    ASSERT_TRUE(e.ok()) << e.status();
    engine::GenerationRequest r;
    r.prompt = Ints(ref.Get("prompt"));
    r.params.temperature = 0;
    const std::vector<int32_t> greedy = Ints(ref.Get("greedy"));
    r.params.max_new_tokens = static_cast<int64_t>(greedy.size());
    auto got = (*e)->Generate({r});
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got)[0].tokens, greedy);
  }
}

// Export keeps the family and the RoPE scaling: the directory written back reads as the
// same config and gives the same logits.
TEST_P(HfModels, ExportKeepsTheFamilyAndTheRopeScaling) {
  const std::string name = GetParam();
  auto be = runtime::MakeCpuBackend();
  auto m = Import(name, be.get());
  ASSERT_NE(m, nullptr);
  const std::string out = absl::StrCat(::testing::TempDir(), "/hf-export-", name, "-", getpid());
  ASSERT_TRUE(ExportHf(out, *m, "F32", true).ok());
  auto back = model::ReadHfConfig(out);
  ASSERT_TRUE(back.ok()) << back.status();
  const model::LlamaConfig& a = m->config();
  EXPECT_EQ(back->qk_norm, a.qk_norm);
  EXPECT_EQ(back->qkv_bias, a.qkv_bias);
  EXPECT_EQ(back->tie_embeddings, a.tie_embeddings);
  EXPECT_EQ(back->HeadDim(), a.HeadDim());
  EXPECT_EQ(back->max_positions, a.max_positions);
  EXPECT_EQ(back->rope_base, a.rope_base);
  EXPECT_EQ(back->rope_scaling.type, a.rope_scaling.type);
  EXPECT_EQ(back->rope_scaling.factor, a.rope_scaling.factor);
  EXPECT_EQ(back->rope_scaling.original_max_positions, a.rope_scaling.original_max_positions);
  const std::vector<int32_t> tokens = Ints(Load(name).Get("tokens"));
  auto again = Import(out, be.get());
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(*again->ForwardLogits(Sequence(tokens)), *m->ForwardLogits(Sequence(tokens)));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, HfModels,
                         ::testing::Values("llama32_rope_llama3", "llama_rope_linear", "llama_rope_dynamic",
                                           "qwen2_rope_yarn", "qwen3"),
                         [](const auto& info) { return std::string(info.param); });

// Qwen3 (4 query heads, 2 KV heads) under TP 2 and TP 4 (Gloo threads): each rank holds
// its share of the heads — at TP 4 one KV head that two ranks hold alike — and its q/k
// norm weights whole; the logits and every parameter's gradient (the k/v projections'
// summed over the ranks sharing a head, the norms' over all) equal one rank's; a TP 4
// export writes each head once and re-imports to the same logits.
class HfModelsTp : public ::testing::TestWithParam<int> {};

TEST_P(HfModelsTp, Qwen3EqualsOneRank) {
  const int tp = GetParam();
  const std::string name = "qwen3";
  const Reference ref = Load(name);
  ASSERT_NE(ref.file, nullptr);
  const std::vector<int32_t> tokens = Ints(ref.Get("tokens"));
  auto be1 = runtime::MakeCpuBackend();
  auto one = Import(name, be1.get());
  ASSERT_NE(one, nullptr);
  auto want = one->ForwardLogits(Sequence(tokens));
  ASSERT_TRUE(want.ok());
  ASSERT_TRUE(one->ZeroGrads().ok());
  ASSERT_TRUE(one->ForwardBackward(Sequence(tokens), 1.f).ok());
  std::map<std::string, std::vector<float>> grads;
  for (model::Param& p : one->params()) {
    ASSERT_TRUE(one->FreshenGrad(p).ok());
    grads[p.name()] = *one->GatherGlobal(p, true);
  }
  const int64_t vocab = one->config().vocab, t = static_cast<int64_t>(tokens.size());
  const std::string out = absl::StrCat(::testing::TempDir(), "/hf-export-tp", tp, "-", getpid());
  testing::MemStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < tp; ++r)
    threads.emplace_back([&, r] {
      auto comm = comm::MakeGlooCommunicator("tp", absl::StrCat("qwen3-tp", tp), r, tp, &store, {"127.0.0.1", 60000});
      ASSERT_TRUE(comm.ok()) << comm.status();
      auto be = runtime::MakeCpuBackend();
      auto m = Import(name, be.get(), comm->get());
      ASSERT_NE(m, nullptr);
      auto got = m->ForwardLogits(Sequence(tokens));  // this rank's vocabulary shard
      ASSERT_TRUE(got.ok()) << got.status();
      const int64_t shard = vocab / tp;
      double diff = 0;
      for (int64_t i = 0; i < t; ++i)
        for (int64_t v = 0; v < shard; ++v)
          diff = std::max(diff, std::fabs(static_cast<double>((*got)[i * shard + v]) - (*want)[i * vocab + r * shard + v]));
      EXPECT_LE(diff, 1e-5 * MaxAbs(*want)) << "rank " << r;
      ASSERT_TRUE(m->ZeroGrads().ok());
      ASSERT_TRUE(m->ForwardBackward(Sequence(tokens), 1.f).ok());
      for (model::Param& p : m->params()) {
        ASSERT_TRUE(m->FreshenGrad(p).ok());
        auto g = m->GatherGlobal(p, true);
        ASSERT_TRUE(g.ok());
        const std::vector<float>& g1 = grads.at(p.name());
        const model::TpSplit split = m->SplitOf(p);
        // This rank's own slice too (GatherGlobal shows one copy of a replicated head).
        std::vector<float> local(p.grad.numel());
        ASSERT_TRUE(be->CopyToHost(p.grad, local.data()).ok());
        const auto mine = model::TpShardOf(g1, p.spec.shape, split.dim, split.parts, split.index);
        for (size_t i = 0; i < g1.size(); ++i) ASSERT_NEAR((*g)[i], g1[i], 1e-5 * MaxAbs(g1)) << p.name() << " rank " << r;
        for (size_t i = 0; i < mine.size(); ++i) ASSERT_NEAR(local[i], mine[i], 1e-5 * MaxAbs(g1)) << p.name() << " rank " << r;
      }
      ASSERT_TRUE(ExportHf(out, *m, "F32", r == 0).ok());
    });
  for (auto& th : threads) th.join();
  auto again = Import(out, be1.get());
  ASSERT_NE(again, nullptr);
  auto back = again->ForwardLogits(Sequence(tokens));
  ASSERT_TRUE(back.ok());
  double diff = 0;
  for (size_t i = 0; i < want->size(); ++i) diff = std::max(diff, std::fabs(double((*back)[i]) - (*want)[i]));
  EXPECT_LE(diff, 1e-5 * MaxAbs(*want));
}

INSTANTIATE_TEST_SUITE_P(Tp, HfModelsTp, ::testing::Values(2, 4), [](const auto& info) {
  return absl::StrCat("tp", info.param);
});

}  // namespace
}  // namespace tessera::checkpoint
