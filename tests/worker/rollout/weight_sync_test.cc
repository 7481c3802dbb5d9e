// Weight sync actor -> rollout (worker/rollout/weight_sync.h) on the CPU backend, ranks on
// threads with Gloo: after a sync the rollout model's weights (gathered) equal the
// actor's bit for bit, for colocated TP 2 -> 1, 2 -> 2 (a separate copy), 4 -> 2 and a
// split pool (actor TP 2 on two ranks, rollout TP 1 on a third, bucketed broadcasts), and
// a rollout engine on the synced model generates what one on the actor generates.
#include <map>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/util.h"
#include "tests/common/mem_store.h"
#include "tests/worker/model/model_test_util.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/rollout/rollout.h"
#include "worker/rollout/weight_sync.h"

namespace tessera::engine {
namespace {
using ::testing::HasSubstr;
using model::Llama;
using Weights = std::map<std::string, std::vector<float>>;

model::LlamaConfig Config(int64_t kv_heads = 4) {
  model::LlamaConfig c = model::test::TinyConfig(64, /*tied=*/false, /*bias=*/true);
  c.hidden = 32, c.heads = 4, c.kv_heads = kv_heads, c.ffn = 48;  // every sharded dim splits 4 ways
  return c;
}

Weights Gather(Llama& m) {
  Weights w;
  for (auto& p : m.params()) w[p.name()] = *m.GatherGlobal(p, /*grad=*/false);
  return w;
}

std::unique_ptr<comm::Communicator> Gloo(tessera::testing::MemStore& store, const std::string& name, int rank, int size) {
  if (size == 1) return nullptr;
  auto c = comm::MakeGlooCommunicator(name, name, rank, size, &store, {"127.0.0.1", 60000});
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

std::vector<int32_t> Greedy(Llama& m) {
  auto e = RolloutEngine::Create(&m, {});
  GenerationRequest r;
  r.prompt = {1, 2, 3, 4, 5};
  r.params.temperature = 0, r.params.max_new_tokens = 8;
  auto got = (*e)->Generate({r});
  EXPECT_TRUE(got.ok()) << got.status();
  return got.ok() ? (*got)[0].tokens : std::vector<int32_t>{};
}

// world ranks; actor TP = actor_tp over all of them, rollout TP groups of rollout_tp
// consecutive ranks; both models start from different weights.
void Colocated(int world, int actor_tp, int rollout_tp, bool same_object, int64_t kv_heads = 4) {
  tessera::testing::MemStore store;
  const std::string key = RandomHex(4);
  std::vector<Weights> actor(world), rollout(world);
  std::vector<std::vector<int32_t>> from_actor(world), from_rollout(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      auto atp = Gloo(store, absl::StrCat(key, "/actor"), r % actor_tp, actor_tp);
      auto rtp = Gloo(store, absl::StrCat(key, "/rollout", r / rollout_tp), r % rollout_tp, rollout_tp);
      auto be = runtime::MakeCpuBackend();
      auto a = Llama::Create(Config(kv_heads), be.get(), atp.get());
      ASSERT_TRUE(a.ok()) << a.status();
      ASSERT_TRUE((*a)->InitRandom(1, 0.2f).ok());
      std::unique_ptr<Llama> own;
      Llama* ro = a->get();
      if (!same_object) {
        auto m = Llama::Create(Config(kv_heads), be.get(), rtp.get());
        ASSERT_TRUE(m.ok()) << m.status();
        ASSERT_TRUE((*m)->InitRandom(2, 0.2f).ok());  // stale weights
        own = std::move(*m);
        ro = own.get();
      }
      ASSERT_TRUE(SyncColocated(**a, *ro).ok());
      actor[r] = Gather(**a);
      rollout[r] = Gather(*ro);
      from_actor[r] = Greedy(**a);
      from_rollout[r] = Greedy(*ro);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE(::testing::Message() << "rank " << r);
    EXPECT_EQ(rollout[r], actor[r]);
    EXPECT_EQ(from_rollout[r], from_actor[r]);
    EXPECT_EQ(from_rollout[r].size(), 8u);
  }
}

TEST(WeightSync, ColocatedTp2To1) { Colocated(2, 2, 1, false); }
TEST(WeightSync, ColocatedTp2To2SameModelIsNoCopy) { Colocated(2, 2, 2, true); }
TEST(WeightSync, ColocatedTp2To2SeparateCopy) { Colocated(2, 2, 2, false); }
TEST(WeightSync, ColocatedTp4To2) { Colocated(4, 4, 2, false); }
// One KV head: four copies on the actor's ranks, two on each rollout group's.
TEST(WeightSync, ColocatedTp4To2ReplicatedKvHeads) { Colocated(4, 4, 2, false, /*kv_heads=*/1); }
TEST(WeightSync, ColocatedTp2To1ReplicatedKvHeads) { Colocated(2, 2, 1, false, /*kv_heads=*/1); }

// Split pools: ranks 0-1 hold the actor (TP 2), rank 2 the rollout model (TP 1); the
// bridge spans all three; buckets of 4 KiB, so most tensors travel in buckets of several.
TEST(WeightSync, SplitPoolsBroadcastInBuckets) {
  tessera::testing::MemStore store;
  const std::string key = RandomHex(4);
  Weights actor, rollout;
  int64_t bytes[3] = {0, 0, 0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      auto bridge = Gloo(store, absl::StrCat(key, "/bridge"), r, 3);
      auto atp = r < 2 ? Gloo(store, absl::StrCat(key, "/actor"), r, 2) : nullptr;
      auto be = runtime::MakeCpuBackend();
      auto m = Llama::Create(Config(), be.get(), atp.get());
      ASSERT_TRUE(m.ok()) << m.status();
      ASSERT_TRUE((*m)->InitRandom(r < 2 ? 1 : 2, 0.2f).ok());
      auto sent = SyncSplit(r < 2 ? m->get() : nullptr, r < 2 ? nullptr : m->get(), *bridge, 0, *be, 4096);
      ASSERT_TRUE(sent.ok()) << sent.status();
      bytes[r] = *sent;
      Weights w = Gather(**m);
      if (r == 0) actor = w;
      if (r == 2) rollout = w;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(rollout, actor);
  int64_t params = 0;
  for (auto& [name, v] : actor) params += static_cast<int64_t>(v.size());
  EXPECT_EQ(bytes[2], 4 * params);
  EXPECT_EQ(bytes[0], bytes[2]);
}

TEST(WeightSync, RefusesMismatchedModels) {
  auto be = runtime::MakeCpuBackend();
  model::LlamaConfig other = Config();
  other.layers = 3;
  auto a = Llama::Create(Config(), be.get());
  auto b = Llama::Create(other, be.get());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_THAT(std::string(SyncColocated(**a, **b).message()), HasSubstr("weight sync: the actor has"));
}

}  // namespace
}  // namespace tessera::engine
