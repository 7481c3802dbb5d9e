// Generation throughput of the rollout engine on one GPU (bench/decode_peer.py is the
// peer: transformers' generate, eager and with a static cache + torch.compile, in the same
// call of `scripts/gpu-bench.sh decode`): a Llama of the given shape (random weights, fixed seed;
// Llama-3.2-1B's shape by default), `--batch` prompts of `--prompt` random tokens, greedy,
// exactly `--new` new tokens each (no stop token), all running together.
//
// For each batch size it times `--reps` whole Generate() calls after one warm-up call
// (end to end: prefill, every decode step, sampling, the tokens on the host), and the same
// with one new token (prefill + its sample), so that the decode steps alone are
//   decode_ms_per_step = (t(new) - t(1)) / (new - 1).
// The HBM roofline of a decode step reads every weight once (bf16 compute copies, the tied
// LM head once) plus each sequence's cached keys and values at the mean context length:
//   roofline_ms = bytes / --hbm-gbps,
// and the fraction of the roofline is roofline_ms / decode_ms_per_step.
// One JSON line per batch size.
//
// With `--group G` (GRPO's groups): each batch size counts prompts, each sampled G times
// at temperature 1 (requests with n = G), run with prefix sharing on and off (one JSON line
// each, "sharing"): the prefill's time (the one-new-token run), the prompt tokens it
// computed, and the most KV-cache blocks the samples held — a shared prompt is prefilled and
// stored once per group.
//
//   decode_bench [--hidden 2048 --layers 16 --heads 32 --kv-heads 8 --ffn 8192 --vocab 128256 --tied 1]
//                [--batch 1,64] [--prompt 128] [--new 128] [--reps 3] [--hbm-gbps 3000] [--dtype bf16] [--graphs 1]
//                [--group G] [--trace PREFIX] [--phases PREFIX] [--gemm-tune 0|1]
//
// --gemm-tune 1: each GEMM shape's first call times cuBLASLt's candidates and keeps the
// fastest (kernels::SetGemmTuning; the warm-up pays for it).
//
// With `--rl-prompts P` (RL's generation at scale): P prompts of random lengths in
// [--prompt-min, --prompt-max] (64, 512), each sampled once at temperature 1 (--group G
// times with --group) for up to --new tokens, ending early at any of --stops S stop tokens
// (every vocab/S-th id: on a random model each step ends a sample with chance about
// S/vocab, so lengths are mixed), at most --max-running samples decoding together, the KV
// cache sized by --gpu-memory-utilization (0.9) of the GPU. One JSON line: generated
// tokens, wall time, tokens/s, lengths, steps, preemptions, and the run's roofline — its
// decode steps each reading every weight once plus the KV-cache bytes its rows attended
// to, over --hbm-gbps, against its rows' GEMM FLOPs over --tflops (790): the larger, a
// lower bound on the time, over the wall time.
//
// With `--trace PREFIX` (bench/cupti_trace.h): after the timed runs of each batch size,
// one more whole Generate() inside a "timed step" range, and the GPU timeline so far into
// PREFIX.b<batch>.csv — `bench/nsys_gaps.py PREFIX.b1.csv --kernels 30` then says where a
// generation's time goes (its kernels by total time, the idle gaps between them).
//
// With `--phases PREFIX` (a build configured with -DTESSERA_KERNEL_PHASES=ON:
// kernels/common/phase_probe.h): after the timed runs of each batch size, one more whole
// Generate() with every decode-linear and paged-attention CTA's phases recorded, into
// PREFIX.b<batch>.txt — `bench/decode_phases.py PREFIX.b1.txt` then says, kernel by kernel,
// when its CTAs start, wait and end against the end of the kernel before it.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/cupti_trace.h"
#include "kernels/common/phase_probe.h"
#include "kernels/gemm/gemm.h"
#include "worker/rollout/rollout.h"

using namespace tessera;

namespace {

double Seconds(engine::RolloutEngine& e, const std::vector<engine::GenerationRequest>& reqs, int64_t* tokens) {
  const auto t0 = std::chrono::steady_clock::now();
  auto got = e.Generate(reqs);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!got.ok()) {
    fprintf(stderr, "generate: %s\n", got.status().ToString().c_str());
    std::exit(1);
  }
  *tokens = 0;
  for (const auto& c : *got) *tokens += static_cast<int64_t>(c.tokens.size());
  return s;
}

// Generation at RL scale (see the header comment).
int RlScale(std::map<std::string, std::string>& a, model::Llama& m, const model::LlamaConfig& c, double hbm) {
  auto get = [&](const char* k, int64_t d) { return a.count(k) ? std::atoll(a[k].c_str()) : d; };
  const int64_t prompts = get("rl-prompts", 512), pmin = get("prompt-min", 64), pmax = get("prompt-max", 512);
  const int64_t new_tokens = get("new", 1024), stops = get("stops", 128), group = get("group", 1);
  engine::RolloutOptions o;
  o.block_size = 16;
  o.max_running = get("max-running", 512);
  o.cuda_graphs = get("graphs", 1) != 0;
  o.num_blocks = prompts * group * ((pmax + new_tokens + o.block_size - 1) / o.block_size);
  o.gpu_memory_utilization = a.count("gpu-memory-utilization") ? std::atof(a["gpu-memory-utilization"].c_str()) : 0.9;
  auto e = engine::RolloutEngine::Create(&m, o);
  if (!e.ok()) return fprintf(stderr, "%s\n", e.status().ToString().c_str()), 1;
  std::mt19937 rng(17);
  std::vector<engine::GenerationRequest> reqs(prompts);
  std::vector<int32_t> stop_ids;
  for (int64_t i = 0; i < stops; ++i) stop_ids.push_back(static_cast<int32_t>(i * (c.vocab / stops) + 7));
  for (int64_t i = 0; i < prompts; ++i) {
    const int64_t len = pmin + static_cast<int64_t>(rng() % static_cast<uint32_t>(pmax - pmin + 1));
    for (int64_t t = 0; t < len; ++t) reqs[i].prompt.push_back(static_cast<int32_t>(rng() % c.vocab));
    reqs[i].params.temperature = 1, reqs[i].params.max_new_tokens = new_tokens, reqs[i].params.stop_tokens = stop_ids;
    reqs[i].params.n = static_cast<int>(group), reqs[i].params.seed = 1000 + static_cast<uint64_t>(i);
  }
  int64_t tokens = 0;
  Seconds(**e, reqs, &tokens);  // warm-up: the cache, cuBLASLt's plans, the graphs
  const double s = Seconds(**e, reqs, &tokens);
  const int64_t samples = prompts * group, elem = c.dtype == tessera::DType::kBF16 ? 2 : 4;
  const double weight_bytes = double(c.NumParams()) * elem;
  const double kv_token = double(c.layers) * 2.0 * double(c.kv_heads * c.HeadDim()) * elem;
  const double mem_s = (double((*e)->decode_steps()) * weight_bytes + double((*e)->attended_tokens()) * kv_token) / (hbm * 1e9);
  const double tflops = a.count("tflops") ? std::atof(a["tflops"].c_str()) : 790.0;
  const double rows = double((*e)->decode_rows() + (*e)->prefill_tokens());
  // Every row through the layers' GEMMs; the LM head only for the rows that sample.
  const double layer_params = double(c.layers) * double(c.hidden * (c.heads + 2 * c.kv_heads) * c.HeadDim() +
                                                        c.heads * c.HeadDim() * c.hidden + 3 * c.hidden * c.ffn);
  const double head_rows = double((*e)->decode_rows() + samples);
  const double compute_s = 2.0 * (layer_params * rows + double(c.vocab * c.hidden) * head_rows) / (tflops * 1e12);
  printf("{\"engine\": \"tessera\", \"mode\": \"rl\", \"prompts\": %lld, \"samples\": %lld, \"max_new\": %lld, "
         "\"generated\": %lld, \"seconds\": %.3f, \"tokens_per_s\": %.1f, \"mean_new\": %.1f, \"decode_steps\": %lld, "
         "\"prefill_steps\": %lld, \"graph_steps\": %lld, \"preemptions\": %lld, \"cache_blocks\": %lld, "
         "\"roofline_memory_s\": %.3f, \"roofline_compute_s\": %.3f, \"roofline_fraction\": %.3f}\n",
         (long long)prompts, (long long)samples, (long long)new_tokens, (long long)tokens, s, double(tokens) / s,
         double(tokens) / double(samples), (long long)(*e)->decode_steps(), (long long)(*e)->prefills(),
         (long long)(*e)->graph_steps(), (long long)(*e)->preemptions(), (long long)(*e)->cache_blocks(), mem_s, compute_s,
         std::max(mem_s, compute_s) / s);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  auto a = bench::Args(argc, argv);
  auto get = [&](const char* k, int64_t d) { return a.count(k) ? std::atoll(a[k].c_str()) : d; };
  model::LlamaConfig c = bench::ConfigFromArgs(a);
  const int64_t prompt = get("prompt", 128), new_tokens = get("new", 128), reps = get("reps", 3);
  const double hbm = a.count("hbm-gbps") ? std::atof(a["hbm-gbps"].c_str()) : 3000.0;
  std::vector<int64_t> batches;
  for (auto s : absl::StrSplit(a.count("batch") ? a["batch"] : std::string("1,64"), ',')) batches.push_back(std::atoll(std::string(s).c_str()));
  if (new_tokens < 2) return fprintf(stderr, "--new must be >= 2\n"), 1;
  if (a.count("phases") && !kernels::PhasesRecorded())
    return fprintf(stderr, "--phases: this build records none (configure with -DTESSERA_KERNEL_PHASES=ON)\n"), 1;

  std::unique_ptr<bench::CuptiTrace> trace;  // before the first CUDA call
  if (a.count("trace")) {
    auto started = bench::CuptiTrace::Start();
    if (!started.ok()) return fprintf(stderr, "%s\n", started.status().ToString().c_str()), 1;
    trace = std::move(*started);
  }
  auto be = runtime::MakeCudaBackend(0);
  if (!be.ok()) return fprintf(stderr, "%s\n", be.status().ToString().c_str()), 1;
  auto m = model::Llama::Create(c, be->get());
  if (!m.ok()) return fprintf(stderr, "%s\n", m.status().ToString().c_str()), 1;
  if (auto s = bench::Init(**m, 11); !s.ok()) return fprintf(stderr, "%s\n", s.ToString().c_str()), 1;

  if (a.count("gemm-tune")) kernels::SetGemmTuning(a["gemm-tune"] == "1");
  if (a.count("rl-prompts")) return RlScale(a, **m, c, hbm);
  const int64_t hd = c.HeadDim(), elem = c.dtype == tessera::DType::kBF16 ? 2 : 4;
  if (const int64_t group = get("group", 0); group > 0) {
    for (int64_t prompts : batches)
      for (bool sharing : {true, false}) {
        engine::RolloutOptions o;
        o.block_size = 16;
        o.max_running = prompts * group;
        o.prefix_sharing = sharing;
        o.cuda_graphs = get("graphs", 1) != 0;
        o.num_blocks = prompts * group * ((prompt + new_tokens + o.block_size - 1) / o.block_size);
        auto e = engine::RolloutEngine::Create(m->get(), o);
        if (!e.ok()) return fprintf(stderr, "%s\n", e.status().ToString().c_str()), 1;
        std::mt19937 rng(5);
        std::vector<engine::GenerationRequest> reqs(prompts), first(prompts);
        for (int64_t i = 0; i < prompts; ++i) {
          for (int64_t t = 0; t < prompt; ++t) reqs[i].prompt.push_back(static_cast<int32_t>(rng() % c.vocab));
          reqs[i].params.temperature = 1, reqs[i].params.max_new_tokens = new_tokens;
          reqs[i].params.n = static_cast<int>(group), reqs[i].params.seed = 100 + static_cast<uint64_t>(i);
          first[i] = reqs[i];
          first[i].params.max_new_tokens = 1;
        }
        int64_t got = 0, got1 = 0;
        Seconds(**e, reqs, &got);  // warm-up
        double full = 1e30, one = 1e30;
        int64_t blocks = 0, prefill_tokens = 0;
        for (int64_t r = 0; r < reps; ++r) {
          full = std::min(full, Seconds(**e, reqs, &got));
          blocks = (*e)->peak_blocks();
          one = std::min(one, Seconds(**e, first, &got1));
          prefill_tokens = (*e)->prefill_tokens();
        }
        const double block_bytes = double(o.block_size) * double(c.layers) * 2.0 * double(c.kv_heads * hd) * elem;
        printf("{\"engine\": \"tessera\", \"group\": %lld, \"prompts\": %lld, \"samples\": %lld, \"prompt\": %lld, "
               "\"new\": %lld, \"sharing\": %s, \"seconds\": %.4f, \"tokens_per_s\": %.1f, \"prefill_ms\": %.2f, "
               "\"prefill_tokens\": %lld, \"peak_kv_blocks\": %lld, \"peak_kv_gib\": %.3f}\n",
               (long long)group, (long long)prompts, (long long)(prompts * group), (long long)prompt, (long long)new_tokens,
               sharing ? "true" : "false", full, double(got) / full, one * 1e3, (long long)prefill_tokens, (long long)blocks,
               double(blocks) * block_bytes / double(1 << 30));
        fflush(stdout);
      }
    return 0;
  }
  for (int64_t batch : batches) {
    engine::RolloutOptions o;
    o.block_size = 16;
    o.max_running = batch;
    o.cuda_graphs = get("graphs", 1) != 0;
    o.num_blocks = batch * ((prompt + new_tokens + o.block_size - 1) / o.block_size);
    auto e = engine::RolloutEngine::Create(m->get(), o);
    if (!e.ok()) return fprintf(stderr, "%s\n", e.status().ToString().c_str()), 1;
    std::mt19937 rng(5);
    std::vector<engine::GenerationRequest> reqs(batch), first(batch);
    for (int64_t i = 0; i < batch; ++i) {
      for (int64_t t = 0; t < prompt; ++t) reqs[i].prompt.push_back(static_cast<int32_t>(rng() % c.vocab));
      reqs[i].params.temperature = 0, reqs[i].params.max_new_tokens = new_tokens;
      first[i] = reqs[i];
      first[i].params.max_new_tokens = 1;
    }
    int64_t got = 0, got1 = 0;
    Seconds(**e, reqs, &got);  // warm-up: allocations, cuBLASLt plans, the cache
    double full = 1e30, one = 1e30;
    int64_t graph_steps = 0;  // of a timed whole run
    for (int64_t r = 0; r < reps; ++r) {
      full = std::min(full, Seconds(**e, reqs, &got));
      graph_steps = (*e)->graph_steps();
      one = std::min(one, Seconds(**e, first, &got1));
    }
    if (a.count("phases")) {
      int64_t recorded = 0;
      kernels::ResetPhases();
      Seconds(**e, reqs, &recorded);
      cudaDeviceSynchronize();
      const std::string path = absl::StrCat(a["phases"], ".b", batch, ".txt");
      if (auto s = kernels::DumpPhases(path); !s.ok()) return fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
      fprintf(stderr, "phases %s\n", path.c_str());
    }
    if (trace != nullptr) {
      const uint64_t begin = trace->Now();
      int64_t traced = 0;
      Seconds(**e, reqs, &traced);
      trace->Range("timed step", begin, trace->Now());
      std::string summary;
      const std::string path = absl::StrCat(a["trace"], ".b", batch, ".csv");
      if (auto s = trace->Write(path, &summary); !s.ok()) return fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
      fprintf(stderr, "trace %s: %s\n", path.c_str(), summary.c_str());
    }
    if (got != batch * new_tokens) return fprintf(stderr, "expected %lld tokens, got %lld\n", (long long)(batch * new_tokens), (long long)got), 1;
    const double step_ms = (full - one) * 1e3 / double(new_tokens - 1);
    const double weight_bytes = double(c.NumParams()) * elem;
    const double mean_ctx = double(prompt) + double(new_tokens) / 2;
    const double kv_bytes = double(batch) * mean_ctx * double(c.layers) * 2.0 * double(c.kv_heads * hd) * elem;
    const double roofline_ms = (weight_bytes + kv_bytes) / (hbm * 1e9) * 1e3;
    printf("{\"engine\": \"%s\", \"graph_steps\": %lld, \"batch\": %lld, \"prompt\": %lld, \"new\": %lld, \"seconds\": %.4f, "
           "\"tokens_per_s\": %.1f, \"prefill_ms\": %.2f, \"decode_ms_per_step\": %.3f, \"decode_tokens_per_s\": %.1f, "
           "\"roofline_ms\": %.3f, \"roofline_fraction\": %.3f, \"params\": %lld}\n",
           o.cuda_graphs ? "tessera" : "tessera-no-graphs", (long long)graph_steps, (long long)batch, (long long)prompt, (long long)new_tokens, full, double(batch * new_tokens) / full, one * 1e3,
           step_ms, double(batch) * 1e3 / step_ms, roofline_ms, roofline_ms / step_ms, (long long)c.NumParams());
    fflush(stdout);
  }
  return 0;
}
