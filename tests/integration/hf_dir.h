// A Hugging Face model directory for the integration tests: a random Llama (F32
// safetensors) and, beside it, the tokenizer files of one of the tokenizer fixtures
// (tests/worker/tokenizer/data/<fixture>). Header-only: the tests that use it link the
// checkpoint library.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/util.h"
#include "worker/checkpoint/hf.h"
#include "worker/model/llama.h"
#include "worker/runtime/backend.h"

namespace tessera::testing {

inline std::string TokenizerFixture(const std::string& name) {
  return std::string(TESSERA_SOURCE_DIR) + "/tests/worker/tokenizer/data/" + name;
}

inline absl::Status WriteHfModelDir(const std::string& dir, const model::LlamaConfig& config, uint64_t seed, float stddev,
                                    const std::string& fixture = "llama3") {
  auto backend = runtime::MakeCpuBackend();
  TESSERA_ASSIGN_OR_RETURN(auto m, model::Llama::Create(config, backend.get()));
  TESSERA_RETURN_IF_ERROR(m->InitRandom(seed, stddev));
  TESSERA_RETURN_IF_ERROR(checkpoint::ExportHf(dir, *m, "F32", true));
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    TESSERA_ASSIGN_OR_RETURN(std::string text, ReadFile(TokenizerFixture(fixture) + "/" + f));
    TESSERA_RETURN_IF_ERROR(WriteFileAtomic(dir + "/" + f, text));
  }
  return absl::OkStatus();
}

// The tiny model shape the tokenizer fixtures fit (640 >= their vocabularies).
inline model::LlamaConfig TinyTextModel(int hidden = 32, int ffn = 48) {
  model::LlamaConfig c;
  c.vocab = 640, c.hidden = hidden, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.ffn = ffn;
  return c;
}

// The model families of today's RL post-training at the tiny shape, each with what sets it
// apart: Llama 3.2 (llama3 RoPE scaling, tied embeddings), Qwen2.5 (QKV bias, YaRN, untied)
// and Qwen3 (per-head q/k RMSNorm, head_dim apart from hidden / heads, one KV head, so
// that tensor parallelism replicates it), with the tokenizer fixture of the family.
struct HfFamily {
  std::string name;
  model::LlamaConfig config;
  std::string tokenizer;
};

// Parameterized tests' names and messages show the family's name.
inline void PrintTo(const HfFamily& f, std::ostream* os) { *os << f.name; }

inline std::vector<HfFamily> HfFamilies() {
  std::vector<HfFamily> out;
  model::LlamaConfig llama = TinyTextModel(64, 128);
  llama.tie_embeddings = true, llama.rope_base = 500000.f, llama.max_positions = 256;
  llama.rope_scaling.type = model::RopeScaling::Type::kLlama3;
  llama.rope_scaling.factor = 32, llama.rope_scaling.original_max_positions = 16;
  out.push_back({"llama32", llama, "llama3"});
  model::LlamaConfig qwen2 = TinyTextModel(64, 128);
  qwen2.qkv_bias = true, qwen2.rope_base = 1000000.f, qwen2.norm_eps = 1e-6f, qwen2.max_positions = 256;
  qwen2.rope_scaling.type = model::RopeScaling::Type::kYarn;
  qwen2.rope_scaling.factor = 4, qwen2.rope_scaling.original_max_positions = 32;
  out.push_back({"qwen25", qwen2, "qwen2"});
  model::LlamaConfig qwen3 = TinyTextModel(64, 128);
  qwen3.qk_norm = true, qwen3.kv_heads = 1, qwen3.head_dim = 32, qwen3.tie_embeddings = true;
  qwen3.rope_base = 1000000.f, qwen3.norm_eps = 1e-6f;
  out.push_back({"qwen3", qwen3, "qwen2"});
  return out;
}

}  // namespace tessera::testing
