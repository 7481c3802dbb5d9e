// The rollout engine on one GPU (label gpu; skips without one) against the training
// engine on the same GPU and weights:
//  - f32: greedy tokens are the argmax of the training forward's teacher-forced logits,
//    and sampled tokens' log-probs equal the training engine's within 1e-4 (CUDA's decode
//    attention, the split-KV kernel, sums in another order than the flash forward);
//  - bf16 (head_dim 64: the flash and tensor-core paged kernels): the mean and largest
//    absolute difference of sampled tokens' log-probs are printed for docs/perf.md and
//    bounded loosely (mean 2e-2: bf16 logits of a random model over 512 tokens);
//  - weight sync between two models on two streams of the GPU copies every weight;
//  - (2 GPUs) a backend's host copies and fills work from a thread with another device
//    current, as an executor's calls arrive on any RPC thread.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "common/status.h"
#include "common/gpu_devices.h"
#include "kernels/common/cuda_arch.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/rollout/rollout.h"
#include "worker/rollout/weight_sync.h"
#include "tests/worker/model/model_test_util.h"

namespace tessera::engine {
namespace {
using model::Llama;
using model::TokenBatch;

model::LlamaConfig Config(tessera::DType dtype) {
  model::LlamaConfig c = model::test::TinyConfig(512, /*tied=*/true, /*bias=*/false);
  c.hidden = 256, c.layers = 4, c.heads = 4, c.kv_heads = 2, c.ffn = 512;  // head_dim 64
  c.dtype = dtype;
  return c;
}

struct Check {
  double mean_abs = 0, max_abs = 0;
  int64_t tokens = 0, argmax_equal = 0;
};

Check Compare(tessera::DType dtype, float temperature) {
  Check out;
  auto be = runtime::MakeCudaBackend(0);
  EXPECT_TRUE(be.ok()) << be.status();
  if (!be.ok()) return out;
  auto m = Llama::Create(Config(dtype), be->get());
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return out;
  EXPECT_TRUE((*m)->InitRandom(3, 0.05f).ok());
  RolloutOptions o;
  o.block_size = 16, o.num_blocks = 128, o.max_running = 8;
  auto e = RolloutEngine::Create(m->get(), o);
  EXPECT_TRUE(e.ok());
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r;
    r.prompt = model::test::RandomBatch(512, 50 + i, {20 + 37 * i}).tokens;
    r.params.temperature = temperature, r.params.n = 2, r.params.max_new_tokens = 40, r.params.seed = 7 + i;
    reqs.push_back(r);
  }
  auto got = (*e)->Generate(reqs);
  EXPECT_TRUE(got.ok()) << got.status();
  if (!got.ok()) return out;
  for (const Completion& c : *got) {
    const auto& prompt = reqs[c.request].prompt;
    const TokenBatch b = CompletionSequence(prompt, c.tokens);
    const std::vector<int32_t>& all = b.tokens;
    const int64_t n = static_cast<int64_t>(all.size()), p = static_cast<int64_t>(prompt.size());
    auto stats = (*m)->TokenLogProbs(b);
    auto logits = (*m)->ForwardLogits(b);
    EXPECT_TRUE(stats.ok() && logits.ok());
    if (!stats.ok() || !logits.ok()) return out;
    for (int64_t i = p - 1; i + 1 < n; ++i) {
      const double d = std::abs(double(c.logprobs[i - p + 1]) - stats->logprob[i]);
      out.mean_abs += d, out.max_abs = std::max(out.max_abs, d), ++out.tokens;
      const float* z = logits->data() + i * 512;
      out.argmax_equal += (std::max_element(z, z + 512) - z) == all[i + 1];
    }
  }
  out.mean_abs /= std::max<int64_t>(out.tokens, 1);
  return out;
}

TEST(RolloutGpu, EqualsTheTrainingEngine) {
  if (static_cast<int>(VisibleGpus().size()) < 1) GTEST_SKIP() << "no GPU";
  const Check greedy = Compare(tessera::DType::kF32, 0.f);
  EXPECT_EQ(greedy.argmax_equal, greedy.tokens) << "greedy tokens that are not the training forward's argmax";
  const Check f32 = Compare(tessera::DType::kF32, 1.f);
  EXPECT_LT(f32.max_abs, 1e-4);
  const Check bf16 = Compare(tessera::DType::kBF16, 1.f);
  EXPECT_LT(bf16.mean_abs, 2e-2);
  std::cout << "RESULT rollout_vs_training greedy_f32 argmax_equal=" << greedy.argmax_equal << "/" << greedy.tokens
            << " | sampled_f32 mean_abs_logprob=" << f32.mean_abs << " max=" << f32.max_abs
            << " | sampled_bf16 mean_abs_logprob=" << bf16.mean_abs << " max=" << bf16.max_abs << " tokens=" << bf16.tokens
            << "\n";
}

absl::StatusOr<std::unique_ptr<Llama>> RandomModel(runtime::Backend* be, tessera::DType dtype, uint64_t seed,
                                                   bool qkv_bias = false) {
  model::LlamaConfig c = Config(dtype);
  c.qkv_bias = qkv_bias;
  TESSERA_ASSIGN_OR_RETURN(auto m, Llama::Create(c, be));
  TESSERA_RETURN_IF_ERROR(m->InitRandom(seed, 0.05f));
  return m;
}

// How two runs of the same requests agree: completions with identical tokens, and the
// largest log-prob difference over the tokens both share from the start.
std::pair<int, double> Agreement(const std::vector<Completion>& a, const std::vector<Completion>& b) {
  int identical = 0;
  double max_abs = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    identical += a[i].tokens == b[i].tokens;
    for (size_t t = 0; t < std::min(a[i].tokens.size(), b[i].tokens.size()) && a[i].tokens[t] == b[i].tokens[t]; ++t)
      max_abs = std::max(max_abs, std::abs(double(a[i].logprobs[t]) - b[i].logprobs[t]));
  }
  return {identical, max_abs};
}

// Sampling on the GPU (the default without TP: logits never leave the device) draws
// what the host draws from the same logits: the same counter-based u per (seed, step)
// and the same truncation. Over 12 samples (f32 and bf16 models; greedy, temperature 1,
// top-k and top-p) the sequences are identical, except where a draw falls within float
// rounding of a CDF boundary (the device sums in another order): at most one sequence
// of each run may diverge, and the log-probs of identical tokens agree within 1e-4.
TEST(RolloutGpu, DeviceSamplingEqualsHostSampling) {
  if (static_cast<int>(VisibleGpus().size()) < 1) GTEST_SKIP() << "no GPU";
  auto be = runtime::MakeCudaBackend(0);
  ASSERT_TRUE(be.ok()) << be.status();
  for (tessera::DType dtype : {tessera::DType::kF32, tessera::DType::kBF16}) {
    auto m = RandomModel(be->get(), dtype, 5);
    ASSERT_TRUE(m.ok()) << m.status();
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 4; ++i) {
      GenerationRequest r;
      r.prompt = model::test::RandomBatch(512, 90 + i, {16 + 29 * i}).tokens;
      r.params.n = 3, r.params.max_new_tokens = 32, r.params.seed = 100 + i;
      r.params.temperature = i == 0 ? 0.f : 1.f;
      if (i == 2) r.params.top_k = 20;
      if (i == 3) r.params.top_p = 0.8f;
      reqs.push_back(r);
    }
    std::vector<std::vector<Completion>> runs;
    for (bool host : {false, true}) {
      RolloutOptions o;
      o.block_size = 16, o.num_blocks = 64, o.max_running = 8, o.sample_on_host = host;
      auto e = RolloutEngine::Create(m->get(), o);
      ASSERT_TRUE(e.ok());
      auto got = (*e)->Generate(reqs);
      ASSERT_TRUE(got.ok()) << got.status();
      runs.push_back(*got);
    }
    ASSERT_EQ(runs[0].size(), runs[1].size());
    const auto [identical, max_abs] = Agreement(runs[0], runs[1]);
    for (size_t i = 0; i < runs[0].size(); ++i)
      if (reqs[runs[0][i].request].params.temperature == 0) {
        EXPECT_EQ(runs[0][i].tokens, runs[1][i].tokens) << "greedy sample " << i;
      }
    EXPECT_GE(identical, static_cast<int>(runs[0].size()) - 1);
    EXPECT_LT(max_abs, 1e-4);
    std::cout << "RESULT device_vs_host_sampling dtype=" << tessera::DTypeName(dtype) << " identical=" << identical << "/"
              << runs[0].size() << " max_abs_logprob=" << max_abs << "\n";
  }
}

// Decode steps as CUDA graphs (the default on a GPU) against the eager step: the same
// tokens and log-probs (the graph replays the eager step's kernels on the padded batch;
// the eager path runs the unpadded one, whose GEMMs may sum in another order), and the
// graphs are really used: every decode step after a (batch, width)'s first two. A graph
// has no allocation or free nodes (the step's temporaries come from the capture arena),
// and in bf16 its kernels are joined by programmatic edges where the GPU takes Hopper's
// kernels (elsewhere none: plain launches). Also for a model with QKV bias (Qwen2's), in
// bf16, and for wider batches (bf16, the same rows throughout): 12 rows, which Hopper's
// tensor-core decode GEMM takes (programmatic edges again) and other GPUs leave to the GEMMs,
// and 136 rows, past every decode linear: the layers' GEMMs, q/k/v and gate/up each at once
// on side streams — branches of the graph.
TEST(RolloutGpu, CudaGraphDecodeEqualsEager) {
  if (static_cast<int>(VisibleGpus().size()) < 1) GTEST_SKIP() << "no GPU";
  auto be = runtime::MakeCudaBackend(0);
  ASSERT_TRUE(be.ok()) << be.status();
  struct Case {
    tessera::DType dtype;
    bool bias;
    int wide;  // 0, or the rows every step keeps (requests of 2 samples, one length)
  };
  for (auto [dtype, bias, wide] : {Case{tessera::DType::kF32, false, 0}, Case{tessera::DType::kBF16, false, 0},
                                   Case{tessera::DType::kBF16, true, 0}, Case{tessera::DType::kBF16, false, 12},
                                   Case{tessera::DType::kBF16, false, 136}}) {
    auto m = RandomModel(be->get(), dtype, 9, bias);
    ASSERT_TRUE(m.ok()) << m.status();
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < (wide > 0 ? wide / 2 : 5); ++i) {
      GenerationRequest r;
      r.prompt = model::test::RandomBatch(512, 70 + i, {12 + 23 * (i % 6)}).tokens;
      r.params.n = 2, r.params.max_new_tokens = wide > 0 ? 32 : 24 + 4 * i, r.params.seed = 40 + i;  // wide: its rows to the end
      r.params.temperature = i < 2 ? 0.f : 1.f;
      reqs.push_back(r);
    }
    std::vector<std::vector<Completion>> runs;
    int64_t graph_steps = 0, decode_steps = 0;
    runtime::Backend::Graph::Shape shape;
    for (bool graphs : {true, false}) {
      RolloutOptions o;
      o.block_size = 16, o.num_blocks = wide > 0 ? 12 * wide : 64, o.max_running = wide > 0 ? wide : 6;  // 10 samples through 6 slots,
      o.cuda_graphs = graphs;                                                                           // or all at once
      auto e = RolloutEngine::Create(m->get(), o);
      ASSERT_TRUE(e.ok());
      auto got = (*e)->Generate(reqs);
      ASSERT_TRUE(got.ok()) << got.status();
      if (graphs) graph_steps = (*e)->graph_steps(), decode_steps = (*e)->decode_steps(), shape = (*e)->last_graph_shape();
      else EXPECT_EQ((*e)->graph_steps(), 0);
      runs.push_back(*got);
    }
    EXPECT_GT(graph_steps, decode_steps / 2) << "decode steps that replayed a graph";
    const int layers = static_cast<int>((*m)->config().layers);
    EXPECT_GT(shape.kernels, 3 * layers);
    EXPECT_EQ(shape.memory_nodes, 0);
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
    const bool fused = (*be)->DecodeLinearSupported(wide > 0 ? wide : 1, (*m)->config().hidden, dtype);
    if (!kernels::HopperKernels(kernels::BuiltCudaArchitectures(), major, minor)) {
      EXPECT_EQ(shape.programmatic_edges, 0);
    } else if (dtype == tessera::DType::kBF16 && fused) {
      EXPECT_GE(shape.programmatic_edges, 3 * layers);
    }
    if (!fused && wide <= 128) {  // (a graph's rows are a power of two; past 128 the GEMMs run one by one)
      EXPECT_GE(shape.edges, shape.nodes) << "independent GEMMs on branches";
    }
    ASSERT_EQ(runs[0].size(), runs[1].size());
    const auto [identical, max_abs] = Agreement(runs[0], runs[1]);
    EXPECT_GE(identical, static_cast<int>(runs[0].size()) - 1);
    EXPECT_LT(max_abs, dtype == tessera::DType::kF32 ? 1e-4 : 5e-2);
    std::cout << "RESULT graph_vs_eager dtype=" << tessera::DTypeName(dtype) << (bias ? " qkv_bias" : "") << (wide > 0 ? absl::StrCat(" rows=", wide) : "") << " identical=" << identical << "/"
              << runs[0].size() << " max_abs_logprob=" << max_abs << " graph_steps=" << graph_steps << "/" << decode_steps
              << " graph_kernels=" << shape.kernels << " programmatic_edges=" << shape.programmatic_edges << "\n";
  }
}

// A memory budget (gpu_memory_utilization) sizes the cache to what is free: the budget
// set to what the device holds now plus 12 blocks gives a cache of at most 12 blocks
// (fewer where the pool's own memory moved meanwhile), whose samples are the unbudgeted
// cache's; a budget below what is in use is refused naming gpu_memory_utilization.
TEST(RolloutGpu, TheCacheFitsAMemoryBudget) {
  if (static_cast<int>(VisibleGpus().size()) < 1) GTEST_SKIP() << "no GPU";
  auto be = runtime::MakeCudaBackend(0);
  ASSERT_TRUE(be.ok()) << be.status();
  auto m = RandomModel(be->get(), tessera::DType::kF32, 4);
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r;
    r.prompt = model::test::RandomBatch(512, 30 + i, {10 + 9 * i}).tokens;
    r.params.n = 2, r.params.max_new_tokens = 40, r.params.seed = 60 + i, r.params.temperature = 0.f;
    reqs.push_back(r);
  }
  RolloutOptions o;
  o.block_size = 16, o.num_blocks = 96, o.max_running = 12;
  auto plain = RolloutEngine::Create(m->get(), o);
  ASSERT_TRUE(plain.ok());
  auto want = (*plain)->Generate(reqs);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ((*plain)->cache_blocks(), 96);
  (*plain)->ReleaseCache();
  auto memory = (*be)->MemoryInfo();
  ASSERT_TRUE(memory.ok()) << memory.status();
  const int64_t block = model::Generator::CacheBytesPerBlock(**m, 16);
  o.cuda_graphs = false;  // no scratch blocks: the budget is the cache's alone
  o.gpu_memory_utilization = double(memory->total - memory->free + 12 * block) / double(memory->total);
  auto budgeted = RolloutEngine::Create(m->get(), o);
  ASSERT_TRUE(budgeted.ok());
  auto got = (*budgeted)->Generate(reqs);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_LE((*budgeted)->cache_blocks(), 12);
  EXPECT_GE((*budgeted)->cache_blocks(), 6);  // the longest sample: 55 + 40 tokens
  ASSERT_EQ(got->size(), want->size());
  const auto [identical, max_abs] = Agreement(*got, *want);
  EXPECT_GE(identical, static_cast<int>(want->size()) - 1);
  EXPECT_LT(max_abs, 1e-4);
  std::cout << "RESULT budgeted_cache blocks=" << (*budgeted)->cache_blocks() << " identical=" << identical << "/"
            << want->size() << "\n";
  o.gpu_memory_utilization = double(memory->total - memory->free) / double(memory->total) / 2;
  auto starved = RolloutEngine::Create(m->get(), o);
  ASSERT_TRUE(starved.ok());
  auto refused = (*starved)->Generate(reqs);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(refused.status().message()).find("gpu_memory_utilization"), std::string::npos) << refused.status();
}

// What a budget sizes the cache against already holds the backend's own buffers: GEMMs
// run at once on side streams (whose workspaces are made the first time the memory is
// asked for) take none of the memory left after it.
TEST(RolloutGpu, TheMemoryABudgetSeesHoldsTheBackendsOwnBuffers) {
  if (static_cast<int>(VisibleGpus().size()) < 1) GTEST_SKIP() << "no GPU";
  auto be = runtime::MakeCudaBackend(0);
  ASSERT_TRUE(be.ok()) << be.status();
  runtime::Backend& b = **be;
  auto x = b.Empty({12, 256}, tessera::DType::kBF16);
  ASSERT_TRUE(x.ok());
  std::vector<runtime::Tensor> w, y;
  for (int i = 0; i < 3; ++i) {
    w.push_back(*b.Empty({256, 256}, tessera::DType::kBF16));
    y.push_back(*b.Empty({12, 256}, tessera::DType::kBF16));
    ASSERT_TRUE(b.Fill(w.back(), 0).ok());
  }
  ASSERT_TRUE(b.Fill(*x, 0).ok());
  ASSERT_TRUE(b.Gemm(*x, false, w[0], true, y[0]).ok());  // the GEMM library's own state, made once
  auto before = b.MemoryInfo();
  ASSERT_TRUE(before.ok()) << before.status();
  const runtime::Backend::GemmCall calls[3] = {{&*x, false, &w[0], true, &y[0]}, {&*x, false, &w[1], true, &y[1]},
                                               {&*x, false, &w[2], true, &y[2]}};
  ASSERT_TRUE(b.Gemms(calls).ok());
  auto after = b.MemoryInfo();
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_GE(after->free, before->free - (8 << 20)) << "GEMMs at once took " << (before->free - after->free) << " bytes";
}

// An executor's training session and its colocated rollout pool run on two backends of
// one GPU (two streams): SyncColocated must order them (without that, the re-slice job on
// 4x H200 failed its digest check). Large tensors,
// so an unordered copy reads a stale buffer.
TEST(RolloutGpu, ColocatedSyncAcrossTwoStreamsCopiesEveryWeight) {
  if (static_cast<int>(VisibleGpus().size()) < 1) GTEST_SKIP() << "no GPU";
  auto ba = runtime::MakeCudaBackend(0), bb = runtime::MakeCudaBackend(0);
  ASSERT_TRUE(ba.ok() && bb.ok());
  model::LlamaConfig c = Config(tessera::DType::kBF16);
  c.vocab = 16384, c.hidden = 1024, c.ffn = 4096, c.heads = 16, c.kv_heads = 4, c.tie_embeddings = false;
  auto actor = Llama::Create(c, ba->get());
  auto rollout = Llama::Create(c, bb->get());
  ASSERT_TRUE(actor.ok() && rollout.ok());
  ASSERT_TRUE((*actor)->InitRandom(1, 0.05f).ok());
  ASSERT_TRUE((*rollout)->InitRandom(2, 0.05f).ok());  // stale weights
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(SyncColocated(**actor, **rollout).ok());
    for (size_t i = 0; i < (*actor)->params().size(); ++i) {
      auto want = (*actor)->GatherGlobal((*actor)->params()[i], /*grad=*/false);
      auto got = (*rollout)->GatherGlobal((*rollout)->params()[i], /*grad=*/false);
      ASSERT_TRUE(want.ok() && got.ok());
      ASSERT_EQ(*got, *want) << (*actor)->params()[i].name() << ", round " << round;
    }
    ASSERT_TRUE((*actor)->InitRandom(10 + round, 0.05f).ok());  // the next update
  }
}

TEST(RolloutGpu, HostCopiesWorkFromAThreadWithAnotherDeviceCurrent) {
  if (static_cast<int>(VisibleGpus().size()) < 2) GTEST_SKIP() << "needs 2 GPUs";
  auto be = runtime::MakeCudaBackend(1);
  ASSERT_TRUE(be.ok()) << be.status();
  auto t = (*be)->Empty({1024}, tessera::DType::kF32);
  ASSERT_TRUE(t.ok());
  std::vector<float> in(1024), out(1024, -1.f);
  for (int i = 0; i < 1024; ++i) in[i] = static_cast<float>(i);
  absl::Status up, down, fill;
  std::vector<float> zeros(1024, -1.f);
  std::thread other([&] {
    cudaSetDevice(0);  // a thread that last worked on another device
    up = (*be)->CopyFromHost(in.data(), *t);
    down = (*be)->CopyToHost(*t, out.data());
    cudaSetDevice(0);
    fill = (*be)->Fill(*t, 0);
    if (fill.ok()) fill = (*be)->CopyToHost(*t, zeros.data());
  });
  other.join();
  ASSERT_TRUE(up.ok()) << up;
  ASSERT_TRUE(down.ok()) << down;
  ASSERT_TRUE(fill.ok()) << fill;
  EXPECT_EQ(out, in);
  EXPECT_EQ(zeros, std::vector<float>(1024, 0.f));
}

}  // namespace
}  // namespace tessera::engine
