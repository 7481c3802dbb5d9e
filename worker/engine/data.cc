#include "worker/engine/data.h"

#include <random>

#include "absl/strings/str_cat.h"

namespace tessera::engine {

std::string ArithmeticProblem(const ArithmeticData& d, int64_t index) {
  std::mt19937_64 rng(d.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(index));
  int64_t limit = 1;
  for (int i = 0; i < d.digits; ++i) limit *= 10;
  const int64_t a = static_cast<int64_t>(rng() % limit), b = static_cast<int64_t>(rng() % limit);
  return absl::StrCat(a, "+", b, "=", a + b, "\n");
}

model::TokenBatch MakeArithmeticBatch(const ArithmeticData& d, int64_t index, int sequences) {
  model::TokenBatch batch;
  batch.cu_seqlens = {0};
  for (int s = 0; s < sequences; ++s) {
    std::string text = ArithmeticProblem(d, index * sequences + s);
    if (d.seq_len > 0 && static_cast<int64_t>(text.size()) > d.seq_len) text.resize(d.seq_len);
    const size_t answer = text.find('=') + 1;  // first byte of the answer
    for (size_t i = 0; i < text.size(); ++i) {
      const bool scored = i + 1 < text.size() && (!d.answer_only || i + 1 >= answer);
      batch.tokens.push_back(static_cast<unsigned char>(text[i]));
      batch.targets.push_back(scored ? static_cast<unsigned char>(text[i + 1]) : -1);
      batch.positions.push_back(static_cast<int32_t>(i));
    }
    batch.cu_seqlens.push_back(static_cast<int32_t>(batch.tokens.size()));
  }
  return batch;
}

}  // namespace tessera::engine
