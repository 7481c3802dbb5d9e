// Softmax cross-entropy over a vocab shard (vocab-parallel): logits [n, v] hold columns
// [vocab_start, vocab_start + v) of the full vocabulary. Per token the shard produces
//   max_i  = max_j z_ij
//   sum_i  = sum_j exp(z_ij - max_i)
//   dot_i  = sum_j exp(z_ij - max_i) * z_ij          (for the entropy)
//   tgt_i  = z_i,target if the target is in this shard, else 0
// Shards combine (CombineCrossEntropy, or all-reduces in the engine) into
//   lse = M + log S, loss = lse - z_t, logprob_t = -loss, entropy = lse - D / S.
// Backward per shard with the global lse: dz_ij = dloss_i * (exp(z_ij - lse_i) - [j == t_i]);
// with an entropy term (RL's entropy bonus; dent, ent non-null: dL/dH_i and H_i, both
// [n]) also - dent_i * p_ij * (z_ij - lse_i + H_i), since dH/dz_j = -p_j (log p_j + H).
#pragma once
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace tessera::kernels {
absl::Status CrossEntropyPartialsCpu(const void* logits, const int32_t* targets, float* max, float* sum, float* dot,
                                     float* tgt, int64_t n, int64_t v, int64_t vocab_start, DType t);
absl::Status CrossEntropyBackwardCpu(const void* logits, const int32_t* targets, const float* lse, const float* dloss,
                                     void* dlogits, int64_t n, int64_t v, int64_t vocab_start, DType t,
                                     const float* dent = nullptr, const float* ent = nullptr);
absl::Status CrossEntropyPartialsCuda(const void* logits, const int32_t* targets, float* max, float* sum, float* dot,
                                      float* tgt, int64_t n, int64_t v, int64_t vocab_start, DType t, void* stream);
absl::Status CrossEntropyBackwardCuda(const void* logits, const int32_t* targets, const float* lse, const float* dloss,
                                      void* dlogits, int64_t n, int64_t v, int64_t vocab_start, DType t, void* stream,
                                      const float* dent = nullptr, const float* ent = nullptr);

// The loss from whole-vocabulary partials (one shard, or shards already combined): per
// token lse_i = max_i + log sum_i and dloss_i = scale where targets_i >= 0 (else 0; lse
// too), and loss_sum[0] += the sum of lse_i - tgt_i over those tokens, added in one fixed
// order (deterministic). The training step's loss without a round trip through the host.
absl::Status CrossEntropyLossCpu(const float* max, const float* sum, const float* tgt, const int32_t* targets,
                                 float scale, float* lse, float* dloss, float* loss_sum, int64_t n);
absl::Status CrossEntropyLossCuda(const float* max, const float* sum, const float* tgt, const int32_t* targets,
                                  float scale, float* lse, float* dloss, float* loss_sum, int64_t n, void* stream);

// Vocab-parallel shards on the device: sum_i *= exp(max_i - global_max_i), this shard's
// sum of exp rescaled to the all-reduced max (then the sums all-reduce to the whole one).
absl::Status CrossEntropyRescaleCpu(const float* max, const float* global_max, float* sum, int64_t n);
absl::Status CrossEntropyRescaleCuda(const float* max, const float* global_max, float* sum, int64_t n, void* stream);

// Host-side combination of per-shard partials (shards[k] = {max, sum, dot, tgt}, each [n]).
struct CrossEntropyResult {
  std::vector<float> lse, loss, logprob, entropy;
};
CrossEntropyResult CombineCrossEntropy(const std::vector<std::vector<std::vector<float>>>& shards);
}  // namespace tessera::kernels
