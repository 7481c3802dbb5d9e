// Shared by the model and engine tests: a tiny Llama configuration, packed batches of
// random sequences with next-token targets, and a relative difference of two vectors.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "worker/model/llama.h"

namespace tessera::model::test {

// 2 layers, 4 query heads over 2 kv heads (GQA), head_dim 4.
inline LlamaConfig TinyConfig(int64_t vocab, bool tied, bool bias) {
  LlamaConfig c;
  c.vocab = vocab, c.hidden = 16, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.ffn = 24;
  c.tie_embeddings = tied, c.qkv_bias = bias;
  return c;
}

// Sequences of the given lengths, random tokens from `seed`; targets are the next token,
// none after a sequence's last token.
inline TokenBatch RandomBatch(int64_t vocab, uint64_t seed, const std::vector<int>& lengths) {
  std::mt19937_64 rng(seed);
  TokenBatch b;
  b.cu_seqlens = {0};
  for (int len : lengths) {
    std::vector<int32_t> seq(len);
    for (auto& x : seq) x = static_cast<int32_t>(rng() % vocab);
    for (int i = 0; i < len; ++i) {
      b.tokens.push_back(seq[i]);
      b.targets.push_back(i + 1 < len ? seq[i + 1] : -1);
      b.positions.push_back(i);
    }
    b.cu_seqlens.push_back(b.cu_seqlens.back() + len);
  }
  return b;
}

// ||a - b|| / ||b||; infinite when the sizes differ.
inline double RelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace tessera::model::test
