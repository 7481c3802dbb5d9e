// A Hugging Face model directory for the integration tests: a random Llama (F32
// safetensors) and, beside it, the tokenizer files of one of the tokenizer fixtures
// (tests/worker/tokenizer/data/<fixture>). Header-only: the tests that use it link the
// checkpoint library.
#pragma once

#include <string>

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

}  // namespace tessera::testing
