// The training oracle's harness, shared by the CPU test (threads, Gloo; trainer_test)
// and the GPU test (a process per rank, one GPU each, NCCL; tests/gpu/trainer_gpu_test
// with tests/gpu/rank_processes.h): run a layout's ranks, three optimizer steps each, and compare every rank's
// per-step losses, gradient norms and final (gathered) weights with one rank's.
#pragma once

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/util.h"
#include "gtest/gtest.h"
#include "tests/common/mem_store.h"
#include "tests/worker/model/model_test_util.h"
#include "worker/comm/communicator.h"
#include "worker/runtime/offload.h"
#include "worker/train/trainer.h"
#include "worker/model/context_parallel.h"

namespace tessera::engine::test {

struct Trace {
  std::vector<double> losses, norms;
  std::map<std::string, std::vector<float>> weights;  // what this rank holds (gathered over TP)
  struct Held {
    model::TpSplit split;
    std::vector<int64_t> shape;  // global
    std::vector<float> value;    // this rank's slice as it holds it
  };
  std::map<std::string, Held> held;  // the TP-split parameters' slices (replicated KV heads: every copy)
};

struct Layout {
  const char* name;
  int tp, dp, zero;
  bool tied = false;  // tied embeddings: the embedding is used by the first and the last block
  int cp = 1, pp = 1, vpp = 1;
  parallel::Schedule schedule = parallel::Schedule::kOneFOneB;
  bool sp = false;  // with cp (the split pads every sequence to a multiple of 2·cp·tp)
  int64_t layers = 2;
  int last_stage_layers = 0;      // an uneven pipeline split (ParallelLayout.last_stage_layers)
  std::vector<int> stage_layers{};  // or every virtual stage's layers (ParallelLayout.stage_layers)
  bool recompute_swiglu = false;  // Llama::set_recompute_swiglu (set by name in tests)
  int world() const { return tp * cp * dp * pp; }
};
inline void PrintTo(const Layout& l, std::ostream* os) { *os << l.name; }

// Initialization and optimizer. The defaults make the f32 oracle sensitive (large weights,
// large steps, clipping active); mixed-precision checks use Gentle(), a realistic regime
// where bf16 rounding is not amplified by a chaotic trajectory.
struct Hyper {
  float init_std = 0.3f, lr = 2e-2f, min_lr = 2e-3f, clip = 0.5f;
  // Between steps, the model's and the optimizer's states leave the backend's memory and
  // come back (runtime::HostOffload over Trainer::AppendStates), as an idle group's do.
  bool offload = false;
  static Hyper Gentle() { return {0.02f, 2e-3f, 2e-4f, 1.f}; }
};

struct Comms {
  comm::Communicator *tp = nullptr, *dp = nullptr, *cp = nullptr, *pp = nullptr;
  int dp_size = 1, dp_rank = 0, pp_rank = 0;
};

// Two sequences (5 and 2-5 tokens).
inline model::TokenBatch MakeBatch(int64_t vocab, uint64_t seed) {
  return model::test::RandomBatch(vocab, seed, {5, 2 + static_cast<int>(seed % 4)});
}

// Three steps; the global batch of step s is micro-batches 4s .. 4s+3, split evenly over
// the DP ranks; CP ranks take their split of each, PP stages all of the DP rank's.
// `config` gives the dims and the dtype; the layout its tied embeddings and layers.
inline void TrainLayout(const Layout& l, const Comms& c, runtime::Backend* be, model::LlamaConfig config, Trace& out,
                        const Hyper& h = {}) {
  config.tie_embeddings = l.tied, config.layers = l.layers;
  auto model = model::Llama::Create(config, be, c.tp, l.sp, c.cp, model::StageSpec{l.pp, c.pp_rank, l.vpp, l.last_stage_layers, l.stage_layers});
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE((*model)->InitRandom(9, h.init_std).ok());
  (*model)->set_recompute_swiglu(l.recompute_swiglu);
  OptimizerOptions o;
  o.lr = h.lr, o.min_lr = h.min_lr, o.warmup_steps = 1, o.total_steps = 3, o.clip_norm = h.clip, o.zero = l.zero;
  o.schedule = l.schedule;
  auto trainer = Trainer::Create(model->get(), be, c.dp, c.tp, o, c.pp);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const int dps = c.dp_size, dpr = c.dp_rank;
  for (int s = 0; s < 3; ++s) {
    std::vector<model::TokenBatch> mine;
    for (int k = 0; k < 4 / dps; ++k) {
      mine.push_back(MakeBatch(config.vocab, 4 * s + dpr * (4 / dps) + k));
      if (c.cp != nullptr) {
        auto split = model::SplitForContextParallel(mine.back(), c.cp->size(), c.cp->rank(), l.sp ? l.tp : 1);
        ASSERT_TRUE(split.ok()) << split.status();
        mine.back() = *split;
      }
    }
    auto st = (*trainer)->Step(mine);
    ASSERT_TRUE(st.ok()) << st.status();
    if (c.pp != nullptr) {  // the schedule's time, and the part outside receives and the final send wait
      EXPECT_GT(st->pipeline_s, 0);
      EXPECT_GT(st->pipeline_busy_s, 0);
      EXPECT_LE(st->pipeline_busy_s, st->pipeline_s);
    } else {
      EXPECT_EQ(st->pipeline_s, 0);
    }
    out.losses.push_back(st->loss);
    out.norms.push_back(st->grad_norm);
    if (h.offload) {
      std::vector<runtime::Tensor> states;
      (*trainer)->AppendStates(&states);
      runtime::HostOffload parked(be);
      ASSERT_TRUE(parked.Offload(states).ok());
      EXPECT_GT(parked.bytes(), 0);
      for (auto& p : (*model)->params()) {
        if (p.value.defined()) {
          EXPECT_TRUE(p.value.storage()->detached()) << p.name() << " still has its memory";
        }
      }
      ASSERT_TRUE(parked.Restore().ok());
      EXPECT_FALSE(parked.offloaded());
    }
  }
  // What each stage keeps between steps: ZeRO-2 no gradient buffers, ZeRO-3 no values
  // either; under mixed precision ZeRO-1/2 keep only their slices of the f32 values.
  if (c.dp != nullptr && l.zero >= 1)
    for (auto& p : (*model)->params()) {
      EXPECT_EQ(p.grad.defined(), l.zero < 2) << p.name();
      EXPECT_EQ(p.value.defined(), l.zero < 3 && config.dtype == tessera::DType::kF32) << p.name();
    }
  ASSERT_TRUE((*trainer)->GatherParams().ok());
  for (auto& p : (*model)->params()) {
    if (config.dtype != tessera::DType::kF32) {  // the compute copy follows the master weights
      ASSERT_TRUE(p.compute.defined()) << p.name();
      std::vector<float> lowp(p.compute.numel()), master(p.value.numel());
      auto host = runtime::MakeCpuBackend();
      auto f32 = *be->Empty(p.compute.shape(), tessera::DType::kF32);
      ASSERT_TRUE(be->Cast(p.compute, f32).ok());
      ASSERT_TRUE(be->CopyToHost(f32, lowp.data()).ok());
      ASSERT_TRUE(be->CopyToHost(p.value, master.data()).ok());
      for (size_t i = 0; i < master.size(); ++i)
        ASSERT_LE(std::abs(lowp[i] - master[i]), std::abs(master[i]) * 0x1p-8f) << p.name() << " element " << i;
    }
    out.weights[p.name()] = *(*model)->GatherGlobal(p, false);
    const model::TpSplit split = (*model)->SplitOf(p);
    if (split.dim < 0) continue;
    std::vector<float> local(p.value.numel());
    ASSERT_TRUE(be->CopyToHost(p.value, local.data()).ok());
    out.held[p.name()] = {split, p.spec.shape, std::move(local)};
  }
}

// (group name, rendezvous key, rank, size) -> a communicator of that group.
using MakeComm =
    std::function<std::unique_ptr<comm::Communicator>(const std::string&, const std::string&, int rank, int size)>;
// Global rank -> the backend that rank runs on.
using MakeBackend = std::function<std::unique_ptr<runtime::Backend>(int rank)>;

// Global rank r of the layout: its communicators (keys under `key`, one per run) and
// backend, three steps (TrainLayout) into `out`.
inline void RunRank(const Layout& l, const model::LlamaConfig& config, int r, const MakeComm& make_comm,
                    const MakeBackend& make_backend, const Hyper& h, const std::string& key, Trace& out) {
  // tp fastest, then cp, dp, pp (docs/design.md §3); the gradient group is DP x CP.
  const int tpr = r % l.tp, cpr = (r / l.tp) % l.cp, dpr = (r / (l.tp * l.cp)) % l.dp, ppr = r / (l.tp * l.cp * l.dp);
  const int dpcp = cpr + l.cp * dpr;
  std::unique_ptr<runtime::Backend> be = make_backend(r);
  ASSERT_NE(be, nullptr);
  std::unique_ptr<comm::Communicator> tp, dp, cp, pp;
  auto make = [&](const std::string& group, int rank, int size, std::unique_ptr<comm::Communicator>& c) {
    if (size == 1) return;
    c = make_comm("test/" + group, absl::StrCat(key, "/", group), rank, size);
    ASSERT_NE(c, nullptr) << group;
  };
  make(absl::StrCat("tp", cpr, ".", dpr, ".", ppr), tpr, l.tp, tp);
  make(absl::StrCat("dpcp", tpr, ".", ppr), dpcp, l.cp * l.dp, dp);
  make(absl::StrCat("cp", tpr, ".", dpr, ".", ppr), cpr, l.cp, cp);
  make(absl::StrCat("pp", tpr, ".", cpr, ".", dpr), ppr, l.pp, pp);
  for (comm::Communicator* c : {tp.get(), dp.get(), cp.get(), pp.get()})
    if (c != nullptr) {
      ASSERT_TRUE(c->OrderWith(be->stream()).ok());
    }
  TrainLayout(l, Comms{tp.get(), dp.get(), cp.get(), pp.get(), l.dp, dpr, ppr}, be.get(), config, out, h);
  // Communicators go before the backend whose stream they wait on.
  tp.reset(), dp.reset(), cp.reset(), pp.reset();
}

// Every rank of the layout on its own thread; their traces in rank order.
inline std::vector<Trace> RunLayout(const Layout& l, const model::LlamaConfig& config, const MakeComm& make_comm,
                                    const MakeBackend& make_backend, const Hyper& h = {}) {
  const std::string key = RandomHex(4);
  const int world = l.world();
  std::vector<Trace> traces(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] { RunRank(l, config, r, make_comm, make_backend, h, key, traces[r]); });
  for (auto& t : threads) t.join();
  return traces;
}

struct Tolerance {
  double loss = 1e-5, norm = 1e-5, weight = 1e-5;
  // The key bias's gradient is exactly zero (softmax ignores a constant added to all of a
  // query's scores): only rounding noise reaches it, which AdamW scales up to lr-sized
  // steps, so its value depends on the layout's summation order.
  double key_bias = 1e-4;
  // Every other bias (0: as weights). Biases start at zero, so after three steps they are
  // a few AdamW steps whose signs follow small gradients: under bf16 rounding a relative
  // difference says little (mixed-precision checks pass 1: a sanity bound).
  double bias = 0;
};

// Every rank's trace against one rank's; every parameter is held by some rank. Returns
// the largest relative differences seen (loss, norm, weight) for the record.
inline std::array<double, 3> ExpectSameAsOneRank(const Layout& l, const std::vector<Trace>& traces, const Trace& one,
                                                 const Tolerance& tol) {
  std::set<std::string> covered;
  std::array<double, 3> worst{0, 0, 0};
  for (size_t r = 0; r < traces.size(); ++r) {
    SCOPED_TRACE(::testing::Message() << l.name << " rank " << r);
    EXPECT_EQ(traces[r].losses.size(), 3u);
    if (traces[r].losses.size() != 3u) continue;
    for (int s = 0; s < 3; ++s) {
      EXPECT_NEAR(traces[r].losses[s], one.losses[s], tol.loss * one.losses[s]) << "loss, step " << s + 1;
      EXPECT_NEAR(traces[r].norms[s], one.norms[s], tol.norm * one.norms[s]) << "grad norm, step " << s + 1;
      worst[0] = std::max(worst[0], std::abs(traces[r].losses[s] - one.losses[s]) / one.losses[s]);
      worst[1] = std::max(worst[1], std::abs(traces[r].norms[s] - one.norms[s]) / one.norms[s]);
    }
    for (auto& [name, w] : traces[r].weights) {
      const bool kbias = name.find("k_proj.bias") != std::string::npos;
      const bool bias = !kbias && name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
      const double d = model::test::RelDiff(w, one.weights.at(name));
      EXPECT_LT(d, kbias ? tol.key_bias : bias && tol.bias > 0 ? tol.bias : tol.weight) << name;
      if (!kbias && !(bias && tol.bias > 0)) worst[2] = std::max(worst[2], d);
      covered.insert(name);
    }
    // Each rank's slice is its part of one rank's tensor — every copy of a replicated KV
    // head too (the gathered weights above show one copy per head).
    for (auto& [name, h] : traces[r].held) {
      const auto want = model::TpShardOf(one.weights.at(name), h.shape, h.split.dim, h.split.parts, h.split.index);
      const bool bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
      EXPECT_LT(model::test::RelDiff(h.value, want), bias ? std::max(tol.key_bias, tol.bias) : tol.weight)
          << name << " (slice " << h.split.index << " of " << h.split.parts << ", copy " << h.split.replica << ")";
    }
  }
  EXPECT_EQ(covered.size(), one.weights.size());  // the stages hold the whole model between them
  return worst;
}

}  // namespace tessera::engine::test
