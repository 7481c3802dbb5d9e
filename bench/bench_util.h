// Helpers shared by the GPU benchmarks (train_bench, decode_bench): flag parsing and a
// fast deterministic weight initialization.
#pragma once

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/model/llama.h"

namespace tessera::bench {

// "--key value" pairs.
inline std::map<std::string, std::string> Args(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 1; i + 1 < argc; i += 2) a[argv[i] + 2] = argv[i + 1];
  return a;
}

// The model's shape from --hidden --layers --heads --kv-heads --ffn --vocab --tied
// --dtype (Llama-3.2-1B's by default: hidden 2048, 16 layers, 32/8 heads, ffn 8192,
// 128 256 vocabulary, tied, RoPE base 500 000, bf16).
inline model::LlamaConfig ConfigFromArgs(std::map<std::string, std::string>& a) {
  auto get = [&](const char* k, int64_t d) { return a.count(k) ? std::atoll(a[k].c_str()) : d; };
  model::LlamaConfig c;
  c.hidden = get("hidden", 2048), c.layers = get("layers", 16), c.heads = get("heads", 32);
  c.kv_heads = get("kv-heads", 8), c.ffn = get("ffn", 8192), c.vocab = get("vocab", 128256);
  c.tie_embeddings = get("tied", 1) != 0;
  c.head_dim = get("head-dim", 0);          // 0: hidden / heads
  c.qk_norm = get("qk-norm", 0) != 0;       // Qwen3
  c.qkv_bias = get("qkv-bias", 0) != 0;     // Qwen2 / 2.5
  c.rope_base = 500000.f;
  c.dtype = a.count("dtype") && a["dtype"] == "f32" ? tessera::DType::kF32 : tessera::DType::kBF16;
  return c;
}

// Fast deterministic init (the benchmark's values do not matter, only that they are
// sane): uniform with std 0.02 for matrices, ones for norms.
inline absl::Status Init(model::Llama& m, uint64_t seed) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (auto& p : m.params()) {
    int64_t n = 1;
    for (int64_t d : p.spec.shape) n *= d;
    std::vector<float> v(n);
    const bool norm = p.name().find("norm") != std::string::npos;
    for (auto& f : v) {
      if (norm) { f = 1.f; continue; }
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      f = (static_cast<float>(x >> 40) / static_cast<float>(1 << 24) - 0.5f) * 0.0693f;  // std 0.02
    }
    if (auto s = m.SetGlobal(p, v); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace tessera::bench
