// Sharded checkpoints on the CPU backend (threads, Gloo over loopback):
// - resume: 3 steps straight equal 1 step, save, a fresh model and trainer (other
//   initial weights) loaded from the checkpoint, 2 more steps — identical losses;
// - reshard: a checkpoint saved by tp2 x dp2 ZeRO-1 loads into one rank, dp2 ZeRO-3 and
//   tp2 ZeRO-0, and their next steps equal the saving layout's within 1e-5; a pipeline's
//   (pp2, tied embeddings on both stages) loads into one rank, tp2 and pp2;
// - damage: a flipped byte, a truncated shard, a missing shard, a broken `latest`, a
//   model of another shape — each an error naming what is wrong; an unfinished save
//   (a leftover .tmp directory) leaves `latest` at the previous checkpoint.
#include "worker/checkpoint/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/mem_store.h"
#include "tests/worker/model/model_test_util.h"
#include "worker/checkpoint/checkpoint_reader.h"
#include "worker/comm/gloo_communicator.h"

namespace tessera::checkpoint {
namespace {
using ::testing::HasSubstr;
using model::Llama;
using model::TokenBatch;

model::LlamaConfig Config(int64_t hidden = 16) {
  auto c = model::test::TinyConfig(14, /*tied=*/true, /*bias=*/true);
  c.hidden = hidden;
  return c;
}

// The global batch of step s (1-based): micro-batches 4(s-1) .. 4(s-1)+3, split over DP.
std::vector<TokenBatch> Batches(int64_t step, int dp, int dp_rank) {
  std::vector<TokenBatch> mine;
  for (int k = 0; k < 4 / dp; ++k) {
    const uint64_t seed = 4 * (step - 1) + dp_rank * (4 / dp) + k;
    mine.push_back(model::test::RandomBatch(14, seed, {5, 2 + static_cast<int>(seed % 4)}));
  }
  return mine;
}

struct Rank {
  std::unique_ptr<runtime::Backend> backend;
  std::unique_ptr<comm::Communicator> tp, dp, pp;
  std::unique_ptr<Llama> model;
  std::unique_ptr<engine::Trainer> trainer;
  Group group() { return {model.get(), trainer.get(), tp.get(), dp.get(), pp.get()}; }
  int dp_size() const { return dp ? dp->size() : 1; }
  int dp_rank() const { return dp ? dp->rank() : 0; }
  // Steps first..last; returns their losses.
  std::vector<double> Train(int64_t first, int64_t last) {
    std::vector<double> losses;
    for (int64_t s = first; s <= last; ++s) {
      auto st = trainer->Step(Batches(s, dp_size(), dp_rank()));
      EXPECT_TRUE(st.ok()) << st.status();
      if (!st.ok()) break;
      losses.push_back(st->loss);
    }
    return losses;
  }
};

// Runs fn on every rank of a tp x dp (x pp) layout (tp fastest), each with a fresh model
// initialized from `seed` and its trainer.
void RunLayout(int tp, int dp, int zero, uint64_t seed, const std::function<void(int, Rank&)>& fn,
               model::LlamaConfig config = Config(), int pp = 1, int last_stage_layers = 0,
               const std::vector<int>& stage_layers = {}) {
  testing::MemStore store;
  const std::string key = RandomHex(4);
  std::vector<std::thread> threads;
  for (int r = 0; r < tp * dp * pp; ++r)
    threads.emplace_back([&, r] {
      const int tpr = r % tp, dpr = (r / tp) % dp, ppr = r / (tp * dp);
      Rank k;
      k.backend = runtime::MakeCpuBackend();
      if (tp > 1) {
        auto c = comm::MakeGlooCommunicator(absl::StrCat("tp", dpr), absl::StrCat(key, "/tp", dpr, ".", ppr), tpr, tp,
                                            &store, {"127.0.0.1", 60000});
        ASSERT_TRUE(c.ok()) << c.status();
        k.tp = std::move(*c);
      }
      if (dp > 1) {
        auto c = comm::MakeGlooCommunicator(absl::StrCat("dp", tpr), absl::StrCat(key, "/dp", tpr, ".", ppr), dpr, dp,
                                            &store, {"127.0.0.1", 60000});
        ASSERT_TRUE(c.ok()) << c.status();
        k.dp = std::move(*c);
      }
      if (pp > 1) {
        auto c = comm::MakeGlooCommunicator(absl::StrCat("pp", tpr), absl::StrCat(key, "/pp", tpr, ".", dpr), ppr, pp,
                                            &store, {"127.0.0.1", 60000});
        ASSERT_TRUE(c.ok()) << c.status();
        k.pp = std::move(*c);
      }
      auto m = Llama::Create(config, k.backend.get(), k.tp.get(), false, nullptr, model::StageSpec{pp, ppr, 1, last_stage_layers, stage_layers});
      ASSERT_TRUE(m.ok()) << m.status();
      k.model = std::move(*m);
      ASSERT_TRUE(k.model->InitRandom(seed, 0.3f).ok());
      engine::OptimizerOptions o;
      o.lr = 2e-2f, o.min_lr = 2e-3f, o.warmup_steps = 1, o.total_steps = 3, o.clip_norm = 0.5f, o.zero = zero;
      auto t = engine::Trainer::Create(k.model.get(), k.backend.get(), k.dp.get(), k.tp.get(), o, k.pp.get());
      ASSERT_TRUE(t.ok()) << t.status();
      k.trainer = std::move(*t);
      fn(r, k);
    });
  for (auto& t : threads) t.join();
}

std::string TempDir() {
  const std::string d = absl::StrCat(::testing::TempDir(), "/ckpt-", getpid(), "-", RandomHex(4));
  EXPECT_TRUE(MakeDirs(d).ok());
  return d;
}

TEST(Checkpoint, ResumeEqualsTrainingStraight) {
  for (auto [tp, dp, zero, pp] : {std::tuple{1, 1, 0, 1}, std::tuple{2, 2, 1, 1}, std::tuple{1, 2, 3, 1},
                                  std::tuple{1, 2, 1, 2}, std::tuple{1, 2, 3, 2}}) {
    SCOPED_TRACE(::testing::Message() << "tp" << tp << " dp" << dp << " zero" << zero << " pp" << pp);
    const std::string dir = TempDir();
    const int world = tp * dp * pp;
    std::vector<std::vector<double>> straight(world), resumed(world);
    RunLayout(tp, dp, zero, 9, [&](int r, Rank& k) { straight[r] = k.Train(1, 3); }, Config(), pp);
    RunLayout(tp, dp, zero, 9, [&](int r, Rank& k) {
      resumed[r] = k.Train(1, 1);
      EXPECT_TRUE(SaveCheckpoint(dir, 1, k.group()).ok());
    }, Config(), pp);
    auto latest = LatestCheckpoint(dir);
    ASSERT_TRUE(latest.ok()) << latest.status();
    EXPECT_EQ(*latest, dir + "/step-00000001");
    RunLayout(tp, dp, zero, /*other weights*/ 77, [&](int r, Rank& k) {
      auto step = LoadCheckpoint(*latest, k.group());
      ASSERT_TRUE(step.ok()) << step.status();
      EXPECT_EQ(*step, 1);
      EXPECT_EQ(k.trainer->step(), 1);
      for (double l : k.Train(2, 3)) resumed[r].push_back(l);
    }, Config(), pp);
    for (int r = 0; r < world; ++r) EXPECT_EQ(resumed[r], straight[r]) << "rank " << r;  // bit for bit
  }
}

// ZeRO-1/2 under mixed precision keep only each rank's slice of the f32 values (the bf16
// compute copies are whole, gathered by the next forward after a step): a save writes
// each rank's value slice, a resume sets the slices and gathers the compute copies, and
// the run goes on bit for bit.
TEST(Checkpoint, MixedPrecisionZero12ResumeEqualsTrainingStraight) {
  model::LlamaConfig bf16 = Config();
  bf16.dtype = tessera::DType::kBF16;
  for (int zero : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "zero " << zero);
    const std::string dir = TempDir();
    std::vector<std::vector<double>> straight(2), resumed(2);
    RunLayout(1, 2, zero, 9, [&](int r, Rank& k) { straight[r] = k.Train(1, 3); }, bf16);
    RunLayout(1, 2, zero, 9, [&](int r, Rank& k) {
      resumed[r] = k.Train(1, 1);
      EXPECT_TRUE(k.trainer->values_sliced());
      const auto sl = k.trainer->SlicesOf(0);
      auto piece = k.trainer->ReadPiece(0);
      ASSERT_TRUE(piece.ok()) << piece.status();
      EXPECT_EQ(piece->value_begin, r * ((sl.n + 1) / 2));  // this rank's slice, not the whole value
      EXPECT_EQ(static_cast<int64_t>(piece->value.size()), sl.value_len);
      EXPECT_LT(sl.value_len, sl.n);
      EXPECT_TRUE(SaveCheckpoint(dir, 1, k.group()).ok());
    }, bf16);
    auto latest = LatestCheckpoint(dir);
    ASSERT_TRUE(latest.ok()) << latest.status();
    RunLayout(1, 2, zero, /*other weights*/ 77, [&](int r, Rank& k) {
      auto step = LoadCheckpoint(*latest, k.group());
      ASSERT_TRUE(step.ok()) << step.status();
      for (double l : k.Train(2, 3)) resumed[r].push_back(l);
    }, bf16);
    for (int r = 0; r < 2; ++r) EXPECT_EQ(resumed[r], straight[r]) << "rank " << r;
  }
}

// Loads dir's step 2 into a tp x dp layout (ZeRO `zero`) of `config` and trains step 3:
// its loss must be `want` (the saving layout's step 3).
void ExpectStep3AfterLoad(const std::string& dir, int tp, int dp, int zero, double want,
                          const model::LlamaConfig& config = Config()) {
  SCOPED_TRACE(::testing::Message() << "into tp" << tp << " dp" << dp << " zero" << zero);
  RunLayout(tp, dp, zero, 5, [&](int, Rank& k) {
    auto step = LoadCheckpoint(dir + "/step-00000002", k.group());
    ASSERT_TRUE(step.ok()) << step.status();
    auto l = k.Train(3, 3);
    ASSERT_EQ(l.size(), 1u);
    EXPECT_NEAR(l[0], want, 1e-5 * want);
  }, config);
}

TEST(Checkpoint, LoadsIntoAnotherLayout) {
  const std::string dir = TempDir();
  std::vector<double> saver_next;  // step 3 of the saving layout
  RunLayout(2, 2, 1, 9, [&](int r, Rank& k) {
    k.Train(1, 2);
    EXPECT_TRUE(SaveCheckpoint(dir, 2, k.group()).ok());
    auto l = k.Train(3, 3);
    if (r == 0) saver_next = l;
  });
  ASSERT_EQ(saver_next.size(), 1u);
  for (auto [tp, dp, zero] : {std::tuple{1, 1, 0}, std::tuple{1, 2, 3}, std::tuple{2, 1, 0}, std::tuple{1, 2, 2}})
    ExpectStep3AfterLoad(dir, tp, dp, zero, saver_next[0]);
}

// More TP ranks than KV heads (two heads at TP 4, each on two ranks): the first rank
// holding a head writes it (the metadata lists two slices of the k/v projections, not
// four), and the checkpoint loads into layouts without replication and back into TP 4.
TEST(Checkpoint, ReplicatedKvHeadsLoadIntoOtherLayouts) {
  model::LlamaConfig c = Config();
  c.vocab = 16;  // split 4 ways (the batches' tokens stay below 14)
  const std::string dir = TempDir();
  std::vector<double> saver_next;
  RunLayout(4, 1, 0, 9, [&](int r, Rank& k) {
    k.Train(1, 2);
    EXPECT_TRUE(SaveCheckpoint(dir, 2, k.group()).ok());
    auto l = k.Train(3, 3);
    if (r == 0) saver_next = l;
  }, c);
  ASSERT_EQ(saver_next.size(), 1u);
  auto reader = CheckpointReader::Open(dir + "/step-00000002");
  ASSERT_TRUE(reader.ok()) << reader.status();
  const auto& shards = (*reader)->metadata()["tensors"]["model.layers.0.self_attn.k_proj.weight"]["value"];
  ASSERT_EQ(shards.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(shards[i]["tp_size"], 2);
    EXPECT_EQ(shards[i]["tp_rank"], i);
    EXPECT_EQ(shards[i]["file"], i == 0 ? "rank-00000.safetensors" : "rank-00002.safetensors");
  }
  for (auto [tp, dp, zero] : {std::tuple{1, 1, 0}, std::tuple{2, 1, 0}, std::tuple{4, 1, 0}, std::tuple{2, 2, 1}})
    ExpectStep3AfterLoad(dir, tp, dp, zero, saver_next[0], c);
  // And one rank's checkpoint into TP 4 with replicated heads.
  const std::string dir1 = TempDir();
  std::vector<double> one_next;
  RunLayout(1, 1, 0, 9, [&](int, Rank& k) {
    k.Train(1, 2);
    EXPECT_TRUE(SaveCheckpoint(dir1, 2, k.group()).ok());
    one_next = k.Train(3, 3);
  }, c);
  ASSERT_EQ(one_next.size(), 1u);
  ExpectStep3AfterLoad(dir1, 4, 1, 0, one_next[0], c);
}

struct Into {
  int tp, pp, last_stage_layers;
  std::vector<int> stage_layers{};
};

// A pp2 checkpoint (split as `last_stage_layers` or `stage_layers` says) of `config`,
// saved after step 2, loads into each of `into`, and the next step matches the pipeline's.
void PipelineCheckpointLoadsInto(const model::LlamaConfig& config, int last_stage_layers, const std::vector<Into>& into,
                                 const std::vector<int>& stage_layers = {}) {
  const std::string dir = TempDir();
  std::vector<double> saver_next(2);
  RunLayout(1, 1, 0, 9, [&](int r, Rank& k) {
    k.Train(1, 2);
    EXPECT_TRUE(SaveCheckpoint(dir, 2, k.group()).ok());
    auto l = k.Train(3, 3);
    saver_next[r] = l.empty() ? -1 : l[0];
  }, config, /*pp=*/2, last_stage_layers, stage_layers);
  EXPECT_EQ(saver_next[0], saver_next[1]);
  for (const Into& to : into) {
    SCOPED_TRACE(::testing::Message() << "into tp" << to.tp << " pp" << to.pp << " last " << to.last_stage_layers);
    RunLayout(to.tp, 1, 0, 5, [&](int, Rank& k) {
      auto step = LoadCheckpoint(dir + "/step-00000002", k.group());
      ASSERT_TRUE(step.ok()) << step.status();
      auto l = k.Train(3, 3);
      ASSERT_EQ(l.size(), 1u);
      EXPECT_NEAR(l[0], saver_next[0], 1e-5 * saver_next[0]);
    }, config, to.pp, to.last_stage_layers, to.stage_layers);
  }
}

// A pipeline's checkpoint (pp2, tied embeddings held by both stages) loads into one rank
// and into tp2, and the next step matches the pipeline's.
TEST(Checkpoint, PipelineCheckpointLoadsIntoOtherLayouts) {
  PipelineCheckpointLoadsInto(Config(), 0, {{1, 1, 0}, {2, 1, 0}, {1, 2, 0}});
}

// An uneven pipeline split (ParallelLayout.last_stage_layers): three layers saved as 2 + 1
// load into one rank, into tp2 and into the opposite split 1 + 2, and train on alike.
TEST(Checkpoint, AnUnevenPipelineSplitLoadsIntoOtherLayouts) {
  model::LlamaConfig c = Config();
  c.layers = 3;
  PipelineCheckpointLoadsInto(c, 1, {{1, 1, 0}, {2, 1, 0}, {1, 2, 2}});
}

// Every stage's layers given (ParallelLayout.stage_layers): three layers saved as 3 + 0
// (the last stage only the head) load into one rank, into tp2 and into 0 + 3 (the first
// stage only the embedding), and train on alike.
TEST(Checkpoint, AnExplicitStageSplitLoadsIntoOtherLayouts) {
  model::LlamaConfig c = Config();
  c.layers = 3;
  PipelineCheckpointLoadsInto(c, 0, {{1, 1, 0}, {2, 1, 0}, {1, 2, 0, {0, 3}}}, {3, 0});
}

std::string Flip(const std::string& path, size_t at) {
  auto bytes = *ReadFile(path);
  bytes[at] = static_cast<char>(bytes[at] ^ 0x40);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return bytes;
}

// train.checkpoint.keep: saves with keep 2 (two DP ranks, ZeRO-1: rank 0 prunes after its
// commit) leave the newest two, and the newest loads; PruneCheckpoints keeps what `latest`
// names even when it is older, and touches nothing but committed step directories.
TEST(Checkpoint, KeepRemovesAllButTheNewestAfterEachCommit) {
  const std::string dir = TempDir();
  RunLayout(1, 2, 1, 9, [&](int, Rank& k) {
    for (int step = 1; step <= 4; ++step) {
      k.Train(step, step);
      EXPECT_TRUE(SaveCheckpoint(dir, step, k.group(), /*keep=*/2).ok());
    }
  });
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_THAT(names, ::testing::ElementsAre("latest", "step-00000003", "step-00000004"));
  RunLayout(1, 2, 1, 5, [&](int, Rank& k) {
    auto step = LoadCheckpoint(dir + "/step-00000004", k.group());
    ASSERT_TRUE(step.ok()) << step.status();
    EXPECT_EQ(*step, 4);
  });

  const std::string d2 = TempDir();  // fabricated: steps 1..5, latest -> 2, a save in progress, a stray file
  for (int s = 1; s <= 5; ++s) ASSERT_TRUE(MakeDirs(absl::StrCat(d2, "/", StepDirName(s))).ok());
  ASSERT_TRUE(MakeDirs(d2 + "/step-00000006.tmp").ok());
  ASSERT_TRUE(MakeDirs(d2 + "/step-notes").ok());
  ASSERT_TRUE(WriteFileAtomic(d2 + "/latest", "step-00000002\n").ok());
  auto removed = PruneCheckpoints(d2, 2);
  ASSERT_TRUE(removed.ok()) << removed.status();
  EXPECT_THAT(*removed, ::testing::ElementsAre("step-00000001", "step-00000003"));
  names.clear();
  for (const auto& e : std::filesystem::directory_iterator(d2)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_THAT(names, ::testing::ElementsAre("latest", "step-00000002", "step-00000004", "step-00000005",
                                            "step-00000006.tmp", "step-notes"));
  auto none = PruneCheckpoints(d2, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  EXPECT_FALSE(PruneCheckpoints(d2 + "/missing", 1).ok());
  ASSERT_TRUE(WriteFileAtomic(d2 + "/latest", "../elsewhere\n").ok());  // unreadable: nothing goes
  EXPECT_EQ(PruneCheckpoints(d2, 1).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(std::filesystem::exists(d2 + "/step-00000004"));
}

// A checkpoint loaded with the TP split it was saved with reads each rank's own shards
// only, straight into place: every parameter's slice equals the global tensor's, and a
// corrupt file of TP rank 1 fails rank 1 (and any reshard) but not rank 0, which never
// opens it.
TEST(Checkpoint, ASameSplitLoadReadsOnlyTheRanksOwnShards) {
  const std::string dir = TempDir();
  RunLayout(2, 1, 0, 9, [&](int, Rank& k) {
    k.Train(1, 1);
    EXPECT_TRUE(SaveCheckpoint(dir, 1, k.group()).ok());
  });
  const std::string ck = dir + "/step-00000001";
  const auto specs = model::LlamaParamSpecs(Config());
  std::set<int> dims;
  {
    auto reader = CheckpointReader::Open(ck);
    ASSERT_TRUE(reader.ok()) << reader.status();
    for (const auto& p : specs)
      for (const char* part : {"value", "exp_avg", "exp_avg_sq"}) {
        auto global = (*reader)->Read(p.name, part, p.shape);
        ASSERT_TRUE(global.ok()) << global.status();
        for (int r = 0; r < 2; ++r) {
          auto mine = (*reader)->ReadTpShard(p.name, part, p.shape, p.shard_dim, 2, r);
          ASSERT_TRUE(mine.ok()) << mine.status();
          const auto want = model::TpShardOf(*global, p.shape, p.shard_dim, 2, r);
          EXPECT_EQ(*mine, want) << p.name << " " << part << " rank " << r;
          // A range of it (a ZeRO slice): the same elements.
          const int64_t n = static_cast<int64_t>(want.size()), b = n / 3, len = n - n / 3 - b;
          auto range = (*reader)->ReadTpShard(p.name, part, p.shape, p.shard_dim, 2, r, b, len);
          ASSERT_TRUE(range.ok()) << range.status();
          EXPECT_EQ(*range, std::vector<float>(want.begin() + b, want.begin() + b + len)) << p.name << " " << part;
        }
        dims.insert(p.shard_dim);
      }
  }
  EXPECT_EQ(dims, (std::set<int>{-1, 0, 1}));  // replicated, row- and column-split parameters
  const std::string other = ck + "/rank-00001.safetensors";
  Flip(other, ReadFile(other)->size() - 3);
  auto reader = CheckpointReader::Open(ck);
  ASSERT_TRUE(reader.ok()) << reader.status();
  const auto& q = specs[2];  // a layer's q projection: split by rows
  ASSERT_EQ(q.shard_dim, 0) << q.name;
  EXPECT_TRUE((*reader)->ReadTpShard(q.name, "value", q.shape, q.shard_dim, 2, 0).ok());
  EXPECT_THAT(std::string((*reader)->ReadTpShard(q.name, "value", q.shape, q.shard_dim, 2, 1).status().message()),
              HasSubstr("rank-00001.safetensors: SHA-256 mismatch"));
  EXPECT_THAT(std::string((*reader)->ReadTpShard(q.name, "value", q.shape, q.shard_dim, 1, 0).status().message()),
              HasSubstr("rank-00001.safetensors: SHA-256 mismatch"));  // a reshard reads both ranks' shards
}

TEST(Checkpoint, DamageIsAnErrorAndAnUnfinishedSaveLeavesLatest) {
  const std::string dir = TempDir();
  RunLayout(1, 2, 1, 9, [&](int, Rank& k) {
    k.Train(1, 1);
    EXPECT_TRUE(SaveCheckpoint(dir, 1, k.group()).ok());
  });
  const std::string ck = dir + "/step-00000001", shard = ck + "/rank-00001.safetensors";
  auto load_error = [&](int dp, int zero, const std::string& path, model::LlamaConfig config = Config()) {
    std::vector<std::string> errors(dp);
    RunLayout(1, dp, zero, 5, [&](int r, Rank& k) { errors[r] = std::string(LoadCheckpoint(path, k.group()).status().message()); },
              config);
    return errors;
  };
  // A model of another shape: the tensor and both shapes are named.
  EXPECT_THAT(load_error(1, 0, ck, Config(32))[0], HasSubstr("model.embed_tokens.weight has shape [14, 16], the model expects [14, 32]"));
  // A flipped byte in rank 1's shard: one rank reads it (all of the moments), naming the
  // file; loaded as saved (dp2 ZeRO-1), rank 1 reads it and rank 0 — which reads only its
  // own slice, from its own file — fails because rank 1 did.
  const std::string good = *ReadFile(shard);
  Flip(shard, good.size() - 3);
  EXPECT_THAT(load_error(1, 0, ck)[0], HasSubstr("rank-00001.safetensors: SHA-256 mismatch"));
  auto both = load_error(2, 1, ck);
  EXPECT_THAT(both[0], HasSubstr("checkpoint load failed on another rank"));
  EXPECT_THAT(both[1], HasSubstr("rank-00001.safetensors: SHA-256 mismatch"));
  // Truncated, then missing.
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << good.substr(0, good.size() / 2);
  EXPECT_THAT(load_error(1, 0, ck)[0], HasSubstr("(truncated?)"));
  std::filesystem::remove(shard);
  EXPECT_THAT(load_error(1, 0, ck)[0], HasSubstr("rank-00001.safetensors: missing"));
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << good;
  EXPECT_THAT(load_error(1, 0, ck)[0], ::testing::IsEmpty());  // restored: loads again
  // Broken metadata.
  const std::string meta = *ReadFile(ck + "/metadata.json");
  std::ofstream(ck + "/metadata.json", std::ios::trunc) << meta.substr(0, meta.size() / 2);
  EXPECT_THAT(load_error(1, 0, ck)[0], HasSubstr("not a tessera-checkpoint-1 metadata file"));
  std::ofstream(ck + "/metadata.json", std::ios::trunc) << meta;
  // `latest` naming something else.
  std::ofstream(dir + "/latest", std::ios::trunc) << "../../etc\n";
  EXPECT_THAT(std::string(LatestCheckpoint(dir).status().message()), HasSubstr("expected a step-N directory name"));
  std::ofstream(dir + "/latest", std::ios::trunc) << "step-00000001\n";
  // A save that died before its commit leaves only step-N.tmp: latest is unchanged, and
  // the next save of that step clears it.
  ASSERT_TRUE(MakeDirs(dir + "/step-00000002.tmp").ok());
  std::ofstream(dir + "/step-00000002.tmp/rank-00000.safetensors") << "partial";
  EXPECT_EQ(*LatestCheckpoint(dir), ck);
  RunLayout(1, 2, 1, 9, [&](int, Rank& k) {
    ASSERT_TRUE(LoadCheckpoint(ck, k.group()).ok());
    k.Train(2, 2);
    EXPECT_TRUE(SaveCheckpoint(dir, 2, k.group()).ok());
  });
  EXPECT_EQ(*LatestCheckpoint(dir), dir + "/step-00000002");
  EXPECT_FALSE(std::filesystem::exists(dir + "/step-00000002.tmp"));
  EXPECT_THAT(load_error(1, 0, dir + "/step-00000002")[0], ::testing::IsEmpty());
}

}  // namespace
}  // namespace tessera::checkpoint
