// Imports a Hugging Face Llama / Qwen2 directory and prints the model's logits for one
// sequence as JSON: {"tokens": [...], "logits": [[...], ...]} (CPU backend, f32; with
// `cuda-bf16`, the CUDA backend in mixed precision). The peer, bench/hf_logits_check.py,
// runs transformers on the same directory and tokens.
//   hf_logits DIR TOKENS SEED [cuda-bf16]   (TOKENS random ids drawn from SEED)
#include <cstdio>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "worker/checkpoint/hf.h"
#include "worker/model/llama.h"

using namespace tessera;

int main(int argc, char** argv) {
  if (argc != 4 && !(argc == 5 && std::string(argv[4]) == "cuda-bf16")) {
    fprintf(stderr, "usage: hf_logits DIR TOKENS SEED [cuda-bf16]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int64_t t = std::stoll(argv[2]);
  auto config = model::ReadHfConfig(dir);
  if (!config.ok()) {
    fprintf(stderr, "%s\n", config.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<runtime::Backend> backend = runtime::MakeCpuBackend();
  if (argc == 5) {
    auto gpu = runtime::MakeCudaBackend(0);
    if (!gpu.ok()) {
      fprintf(stderr, "%s\n", gpu.status().ToString().c_str());
      return 1;
    }
    backend = std::move(*gpu);
    config->dtype = tessera::DType::kBF16;
  }
  auto model = model::Llama::Create(*config, backend.get());
  if (!model.ok()) {
    fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  if (auto st = checkpoint::ImportHf(dir, **model); !st.ok()) {
    fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  std::mt19937_64 rng(std::stoull(argv[3]));
  model::TokenBatch b;
  b.cu_seqlens = {0, static_cast<int32_t>(t)};
  for (int64_t i = 0; i < t; ++i) {
    b.tokens.push_back(static_cast<int32_t>(rng() % config->vocab));
    b.targets.push_back(-1);
    b.positions.push_back(static_cast<int32_t>(i));
  }
  auto logits = (*model)->ForwardLogits(b);
  if (!logits.ok()) {
    fprintf(stderr, "%s\n", logits.status().ToString().c_str());
    return 1;
  }
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t i = 0; i < t; ++i)
    rows.push_back(std::vector<float>(logits->begin() + i * config->vocab, logits->begin() + (i + 1) * config->vocab));
  printf("%s\n", nlohmann::json{{"tokens", b.tokens}, {"logits", rows}}.dump().c_str());
  return 0;
}
