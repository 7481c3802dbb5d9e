// The BPE tokenizers (the Llama-3 and Qwen2 style fixtures of tests/worker/tokenizer) on
// arbitrary bytes: encoding never fails or crashes, every id is in the vocabulary, and
// decoding gives the bytes back (Llama-3: no normalizer; Qwen2's NFC may recompose). The
// same bytes read as little-endian ids decode or are refused, never read out of bounds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "worker/tokenizer/tokenizer.h"

using tessera::tokenizer::Tokenizer;

static const Tokenizer& Load(const char* kind) {
  auto t = tessera::tokenizer::LoadHfTokenizer(std::string(TESSERA_SOURCE_DIR) + "/tests/worker/tokenizer/data/" + kind);
  if (!t.ok()) abort();
  return *t->release();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tokenizer& llama = Load("llama3");
  static const Tokenizer& qwen = Load("qwen2");
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const Tokenizer* t : {&llama, &qwen}) {
    auto ids = t->Encode(text, /*add_special=*/size % 2 == 0);
    if (!ids.ok()) abort();
    for (int32_t id : *ids)
      if (id < 0 || id >= t->vocab_size()) abort();
    auto back = t->Decode(*ids, /*skip_special=*/false);
    if (!back.ok()) abort();
    if (t == &llama && size % 2 == 1 && *back != text) abort();  // lossless without BOS
  }
  std::vector<int32_t> raw(size / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data, raw.size() * 4);
  (void)llama.Decode(raw, size % 3 == 0);
  return 0;
}
