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
//                [--group G]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
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

  auto be = runtime::MakeCudaBackend(0);
  if (!be.ok()) return fprintf(stderr, "%s\n", be.status().ToString().c_str()), 1;
  auto m = model::Llama::Create(c, be->get());
  if (!m.ok()) return fprintf(stderr, "%s\n", m.status().ToString().c_str()), 1;
  if (auto s = bench::Init(**m, 11); !s.ok()) return fprintf(stderr, "%s\n", s.ToString().c_str()), 1;

  const int64_t hd = c.HeadDim(), elem = c.dtype == tessera::DType::kBF16 ? 2 : 4;
  if (const int64_t group = get("group", 0); group > 0) {
    for (int64_t prompts : batches)
      for (bool sharing : {true, false}) {
        engine::RolloutOptions o;
        o.block_size = 16;
        o.max_running = prompts * group;
        o.prefix_sharing = sharing;
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
