// Runs a Hugging Face model directory through the engine for bench/hf_fidelity.py, which
// compares the results with transformers on the same directory (a GPU host):
//   hf_model_run DIR OUT DEVICE DTYPE TOKENS [GREEDY_PROMPT GREEDY_N]
// DEVICE: cpu | cuda; DTYPE: f32 | bf16 (mixed precision); TOKENS and GREEDY_PROMPT: files
// of little-endian i32 ids. Writes into OUT: logits.f32 ([T, vocab] of the sequence at
// positions 0..T-1), grad.NAME.f32 for the parameters of kGradNames (of the mean
// next-token cross-entropy), greedy.i32 (GREEDY_N tokens of greedy decoding through the
// rollout engine after the prompt); prints one JSON line of timings.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "worker/checkpoint/hf.h"
#include "worker/model/llama.h"
#include "worker/rollout/rollout.h"

using namespace tessera;

namespace {
const char* const kGradNames[] = {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                                  "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.q_norm.weight",
                                  "model.layers.1.mlp.down_proj.weight", "model.norm.weight"};

std::vector<int32_t> ReadIds(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::vector<int32_t> v;
  int32_t x;
  while (f.read(reinterpret_cast<char*>(&x), 4)) v.push_back(x);
  return v;
}
template <typename T>
bool Write(const std::string& path, const std::vector<T>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  return static_cast<bool>(f);
}
int Fail(const absl::Status& s) {
  fprintf(stderr, "%s\n", s.ToString().c_str());
  return 1;
}
double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 6 && argc != 8) {
    fprintf(stderr, "usage: hf_model_run DIR OUT cpu|cuda f32|bf16 TOKENS [GREEDY_PROMPT GREEDY_N]\n");
    return 2;
  }
  const std::string dir = argv[1], out = argv[2], device = argv[3], dtype = argv[4];
  auto config = model::ReadHfConfig(dir);
  if (!config.ok()) return Fail(config.status());
  config->dtype = dtype == "bf16" ? DType::kBF16 : DType::kF32;
  std::unique_ptr<runtime::Backend> backend = runtime::MakeCpuBackend();
  if (device == "cuda") {
    auto gpu = runtime::MakeCudaBackend(0);
    if (!gpu.ok()) return Fail(gpu.status());
    backend = std::move(*gpu);
  }
  auto m = model::Llama::Create(*config, backend.get());
  if (!m.ok()) return Fail(m.status());
  model::Llama& model = **m;
  auto t0 = std::chrono::steady_clock::now();
  if (auto st = checkpoint::ImportHf(dir, model); !st.ok()) return Fail(st);  // compute copies refreshed too
  const double load_s = Since(t0);
  const std::vector<int32_t> tokens = ReadIds(argv[5]);
  const model::TokenBatch b = model::TokenBatch::NextTokenSequence(tokens);
  t0 = std::chrono::steady_clock::now();
  auto logits = model.ForwardLogits(b);
  if (!logits.ok()) return Fail(logits.status());
  const double forward_s = Since(t0);
  if (!Write(out + "/logits.f32", *logits)) return Fail(absl::InternalError("cannot write logits"));
  if (auto st = model.ZeroGrads(); !st.ok()) return Fail(st);
  auto loss = model.ForwardBackward(b, 1.f / static_cast<float>(tokens.size() - 1));
  if (!loss.ok()) return Fail(loss.status());
  for (const char* name : kGradNames) {
    model::Param* p = model.Find(name);
    if (p == nullptr) continue;
    if (auto st = model.FreshenGrad(*p); !st.ok()) return Fail(st);
    auto g = model.GatherGlobal(*p, /*grad=*/true);
    if (!g.ok()) return Fail(g.status());
    if (!Write(out + "/grad." + name + ".f32", *g)) return Fail(absl::InternalError("cannot write a gradient"));
  }
  double greedy_s = 0;
  if (argc == 8) {
    engine::RolloutOptions o;
    o.block_size = 16, o.num_blocks = 64, o.max_running = 1;
    auto e = engine::RolloutEngine::Create(&model, o);
    if (!e.ok()) return Fail(e.status());
    engine::GenerationRequest r;
    r.prompt = ReadIds(argv[6]);
    r.params.temperature = 0;
    r.params.max_new_tokens = std::stoll(argv[7]);
    t0 = std::chrono::steady_clock::now();
    auto got = (*e)->Generate({r});
    if (!got.ok()) return Fail(got.status());
    greedy_s = Since(t0);
    if (!Write(out + "/greedy.i32", (*got)[0].tokens)) return Fail(absl::InternalError("cannot write greedy tokens"));
  }
  printf("%s\n", nlohmann::json{{"load_s", load_s}, {"forward_s", forward_s}, {"greedy_s", greedy_s},
                                {"loss_sum", loss->sum}, {"loss_tokens", loss->tokens}}
                     .dump()
                     .c_str());
  return 0;
}
