// Per-row token sampling for the rollout engine: greedy, temperature, top-k, top-p,
// reproducible per request. Row i of logits [n, v] is sampled with its own
// temperature (0 = greedy argmax, ties to the lowest id), top_k (0 = all) and top_p
// (1 = all): keep the tokens whose probability under softmax(z / T) is at least the
// k-th largest (ties kept), then the smallest most-probable set whose mass reaches top_p
// (ties kept), and draw by inverse CDF in token-id order with u = Uniform(seed_i, offset_i),
// a counter-based hash, so CPU and CUDA draw the same u and a request replays exactly.
// logprob[i] is log softmax(z_i / T)[token] before truncation (for greedy, T = 1).
#pragma once
#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "kernels/common/scratch.h"

namespace tessera::kernels {

// SplitMix64 of (seed, offset) -> [0, 1) with 53 random bits. Host and device.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline double SampleUniform(uint64_t seed, uint64_t offset) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (offset + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 11) * (1.0 / 9007199254740992.0);
}

struct SampleArgs {
  const float* temperature;  // [n]
  const int32_t* top_k;      // [n]
  const float* top_p;        // [n]
  const uint64_t* seed;      // [n]
  const uint64_t* offset;    // [n] (e.g. the decode step)
};

absl::Status SampleCpu(const void* logits, int64_t n, int64_t v, DType t, const SampleArgs& a, int32_t* token,
                       float* logprob);
// `scratch` (kernels/common/scratch.h; null: the stream's pool) holds the per-segment partials.
absl::Status SampleCuda(const void* logits, int64_t n, int64_t v, DType t, const SampleArgs& a, int32_t* token,
                        float* logprob, void* stream, DeviceScratch* scratch = nullptr);
}  // namespace tessera::kernels
