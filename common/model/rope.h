// Rotary position embedding frequencies (docs/design.md §6): the inverse frequency of each
// pair of a head's dimensions and the factor on cos and sin, for plain RoPE and the
// scalings of released Llama / Qwen configs — linear, dynamic NTK, YaRN and Llama 3's —
// computed as Hugging Face transformers computes them (its rotary embedding's inv_freq,
// f32, and attention_scaling), so that a model loaded from a Hugging Face directory sees
// the positions it was trained with. The angle of position p is then f32(p) * inv_freq[i]
// rounded to f32, as transformers, Megatron and vLLM form it (kernels/rope).
#pragma once

#include <cstdint>
#include <vector>

#include "common/model/config.h"

namespace tessera::model {

struct RopeFrequencies {
  std::vector<float> inv_freq;  // [head_dim / 2]
  float attention_scaling = 1;  // multiplies cos and sin (YaRN); 1 otherwise
};

// The frequencies of a forward whose largest position is seq_len - 1. Only dynamic NTK
// scaling depends on seq_len (its base grows once seq_len passes max_positions, from the
// batch's longest sequence as transformers takes it from its batch); the others ignore it.
RopeFrequencies ComputeRopeFrequencies(const LlamaConfig& c, int64_t seq_len);
// Whether the frequencies depend on the sequence length (dynamic NTK scaling).
inline bool RopeDependsOnLength(const LlamaConfig& c) { return c.rope_scaling.type == RopeScaling::Type::kDynamic; }

}  // namespace tessera::model
