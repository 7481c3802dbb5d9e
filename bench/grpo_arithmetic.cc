// SFT warm start, then GRPO, on the built-in arithmetic task at the engine level (one
// rank, CPU by default): what the RL demo job will run through the controller. A small
// byte-level Llama learns "a+b=" -> "c\n" by SFT (loss on the answer only), then GRPO
// (engine::GrpoStep: group samples, exact-match reward, group-normalized advantages, k3
// KL to the SFT policy) trains on fresh problems. Greedy accuracy on held-out problems
// (another seed) is printed as one JSON line per evaluation:
//   {"phase": "sft"|"grpo", "step": N, "accuracy": a, "reward": r, "seconds": s}
// and last one summary line: {"phase": "summary", "sft_accuracy", "grpo_accuracy" (the last
// evaluations), and the GRPO step's phases (generate_s, ref_s, old_s, update_s) averaged
// over the steps after the first}.
//
//   grpo_arithmetic [--digits 2] [--sft-steps 300] [--grpo-steps 60] [--hidden 128]
//                   [--layers 4] [--eval 200] [--group 8] [--prompts 16] [--lr 3e-5] [--kl 0.01]
//                   [--warmup 0] [--sft-lr 3e-3] [--careless 0] [--pool 0] [--device cpu|cuda] [--seed 1]
//                   [--sft-batch 64]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "worker/train/data.h"
#include "worker/rl/grpo.h"
#include "worker/rollout/weight_sync.h"

using namespace tessera;

namespace {
std::map<std::string, std::string> Args(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 1; i + 1 < argc; i += 2) a[argv[i] + 2] = argv[i + 1];
  return a;
}

std::vector<int32_t> Bytes(const std::string& s) { return std::vector<int32_t>(s.begin(), s.end()); }

// The prompt ("a+b=") and the answer ("c\n") of problem `index`.
std::pair<std::string, std::string> Split(const engine::ArithmeticData& d, int64_t index) {
  const std::string p = engine::ArithmeticProblem(d, index);
  const size_t eq = p.find('=') + 1;
  return {p.substr(0, eq), p.substr(eq)};
}

// Greedy exact-match accuracy on problems [0, n) of the held-out data.
double Accuracy(engine::RolloutEngine& r, const engine::ArithmeticData& held, int n, int64_t max_new) {
  std::vector<engine::GenerationRequest> reqs(n);
  for (int i = 0; i < n; ++i) {
    reqs[i].prompt = Bytes(Split(held, i).first);
    reqs[i].params.temperature = 0, reqs[i].params.max_new_tokens = max_new, reqs[i].params.stop_tokens = {'\n'};
  }
  auto got = r.Generate(reqs);
  if (!got.ok()) {
    fprintf(stderr, "eval: %s\n", got.status().ToString().c_str());
    std::exit(1);
  }
  int right = 0;
  for (const auto& c : *got) right += std::string(c.tokens.begin(), c.tokens.end()) == Split(held, c.request).second;
  return double(right) / n;
}
}  // namespace

int main(int argc, char** argv) {
  auto a = Args(argc, argv);
  auto get = [&](const char* k, int64_t d) { return a.count(k) ? std::atoll(a[k].c_str()) : d; };
  const int digits = static_cast<int>(get("digits", 2)), eval_n = static_cast<int>(get("eval", 200));
  const int64_t sft_steps = get("sft-steps", 300), grpo_steps = get("grpo-steps", 60);
  model::LlamaConfig c;
  c.vocab = 256, c.hidden = get("hidden", 128), c.layers = get("layers", 4), c.heads = 4, c.kv_heads = 2;
  c.ffn = 3 * c.hidden;
  auto be = a.count("device") && a["device"] == "cuda" ? runtime::MakeCudaBackend(0) : absl::StatusOr<std::unique_ptr<runtime::Backend>>(runtime::MakeCpuBackend());
  if (!be.ok()) return fprintf(stderr, "%s\n", be.status().ToString().c_str()), 1;
  auto actor = model::Llama::Create(c, be->get());
  auto ref = model::Llama::Create(c, be->get());
  const uint64_t seed = static_cast<uint64_t>(get("seed", 1));
  if (!actor.ok() || !ref.ok() || !(*actor)->InitRandom(seed, 0.02f).ok()) return fprintf(stderr, "model\n"), 1;
  engine::ArithmeticData train{digits, seed, 0, /*answer_only=*/true}, held{digits, 999, 0, true, /*held_out=*/true};
  train.careless = a.count("careless") ? std::strtod(a["careless"].c_str(), nullptr) : 0;
  const int64_t max_new = digits + 3;  // the answer's digits (+1 carry) and '\n'
  engine::RolloutOptions ro;
  ro.block_size = 16, ro.num_blocks = 512, ro.max_running = 128;
  auto rollout = engine::RolloutEngine::Create(actor->get(), ro);
  const auto t0 = std::chrono::steady_clock::now();
  auto secs = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  // SFT.
  engine::OptimizerOptions so;
  so.lr = a.count("sft-lr") ? std::strtof(a["sft-lr"].c_str(), nullptr) : 3e-3f, so.min_lr = so.lr / 10, so.warmup_steps = 20, so.total_steps = sft_steps, so.weight_decay = 0.f;
  auto sft = engine::Trainer::Create(actor->get(), be->get(), nullptr, nullptr, so);
  if (!sft.ok()) return fprintf(stderr, "%s\n", sft.status().ToString().c_str()), 1;
  double sft_accuracy = 0, grpo_accuracy = 0;
  double phases[4] = {0, 0, 0, 0};  // generate, ref, old, update: summed over the steps after the first
  for (int64_t s = 0; s < sft_steps; ++s) {
    auto st = (*sft)->Step({engine::MakeArithmeticBatch(train, s, get("sft-batch", 64))});
    if (!st.ok()) return fprintf(stderr, "sft: %s\n", st.status().ToString().c_str()), 1;
    if ((s + 1) % 100 == 0 || s + 1 == sft_steps) {
      sft_accuracy = Accuracy(**rollout, held, eval_n, max_new);
      printf("{\"phase\": \"sft\", \"step\": %lld, \"loss\": %.4f, \"accuracy\": %.3f, \"seconds\": %.1f}\n",
             static_cast<long long>(s + 1), st->loss, sft_accuracy, secs());
    }
    fflush(stdout);
  }
  // GRPO from the SFT policy; the reference is a frozen copy of it.
  if (!engine::SyncColocated(**actor, **ref).ok()) return fprintf(stderr, "ref copy\n"), 1;
  engine::OptimizerOptions go;
  go.lr = a.count("lr") ? std::strtof(a["lr"].c_str(), nullptr) : 3e-5f, go.min_lr = go.lr, go.warmup_steps = get("warmup", 0), go.total_steps = grpo_steps, go.weight_decay = 0.f;
  auto trainer = engine::Trainer::Create(actor->get(), be->get(), nullptr, nullptr, go);
  engine::GrpoOptions o;
  o.group_size = static_cast<int>(get("group", 8));
  o.sampling.temperature = 1.f, o.sampling.max_new_tokens = max_new, o.sampling.stop_tokens = {'\n'};
  o.loss.kl_coef = a.count("kl") ? std::strtod(a["kl"].c_str(), nullptr) : 0.01;
  o.mini_batches = 2;
  const int prompts_per_step = static_cast<int>(get("prompts", 16));
  const int64_t pool = get("pool", 0);
  engine::ArithmeticData clean = train;  // the verifier knows the true sums
  clean.careless = 0;
  for (int64_t s = 0; s < grpo_steps; ++s) {
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::string> answers;
    for (int i = 0; i < prompts_per_step; ++i) {
      // Problems SFT did not see (--pool N: cycle over N of them, a memorization check).
      const int64_t k = pool > 0 ? (s * prompts_per_step + i) % pool : s * prompts_per_step + i;
      auto [p, ans] = Split(clean, 1000000 + k);
      prompts.push_back(Bytes(p));
      answers.push_back(ans);
    }
    auto reward = [&](size_t i, const std::vector<int32_t>& comp) {
      return std::string(comp.begin(), comp.end()) == answers[i] ? 1.0 : 0.0;
    };
    auto st = engine::GrpoStep(**rollout, **actor, **trainer, ref->get(), prompts, reward, o, s);
    if (!st.ok()) return fprintf(stderr, "grpo: %s\n", st.status().ToString().c_str()), 1;
    const bool eval = (s + 1) % 10 == 0 || s + 1 == grpo_steps;
    if (eval) grpo_accuracy = Accuracy(**rollout, held, eval_n, max_new);
    if (s > 0) phases[0] += st->generate_s, phases[1] += st->ref_s, phases[2] += st->old_s, phases[3] += st->update_s;
    printf("{\"phase\": \"grpo\", \"step\": %lld, \"reward\": %.3f, \"kl\": %.4f, \"clip\": %.3f, \"generate_s\": %.2f, "
           "\"ref_s\": %.3f, \"old_s\": %.3f, \"update_s\": %.2f%s, \"seconds\": %.1f}\n",
           static_cast<long long>(s + 1), st->reward, st->kl, st->clip_fraction, st->generate_s, st->ref_s, st->old_s, st->update_s,
           eval ? (", \"accuracy\": " + std::to_string(grpo_accuracy)).c_str() : "", secs());
    fflush(stdout);
  }
  const double n = grpo_steps > 1 ? double(grpo_steps - 1) : 1.0;
  printf("{\"phase\": \"summary\", \"sft_accuracy\": %.3f, \"grpo_accuracy\": %.3f, \"generate_s\": %.3f, \"ref_s\": %.3f, "
         "\"old_s\": %.3f, \"update_s\": %.3f, \"seconds\": %.1f}\n",
         sft_accuracy, grpo_accuracy, phases[0] / n, phases[1] / n, phases[2] / n, phases[3] / n, secs());
  return 0;
}
