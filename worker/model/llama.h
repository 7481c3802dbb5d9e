// Llama-style decoder on one rank (DESIGN §6): embedding, per layer RMSNorm -> GQA
// attention with RoPE (optional QKV bias) -> residual -> RMSNorm -> SwiGLU MLP ->
// residual, final RMSNorm, LM head (optionally tied to the embedding). Explicit forward
// and backward per layer with saved activations — no autograd. Runs on any Backend
// (the CPU backend is the oracle); parameters, activations and gradients are f32 here
// (mixed precision and the parallel layouts build on this in the training engine).
//
// Threading: a Llama is used by one thread at a time (its backend's thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/config.h"
#include "worker/runtime/backend.h"

namespace tessera::model {

// A packed micro-batch: sequences concatenated, on the host (the engine keeps
// cu_seqlens on the host so attention never waits on the device).
struct TokenBatch {
  std::vector<int32_t> tokens;      // [T] input ids
  std::vector<int32_t> targets;     // [T] next-token ids, -1 where no loss is taken
  std::vector<int32_t> positions;   // [T] position of each token within its sequence
  std::vector<int32_t> cu_seqlens;  // [B + 1] sequence boundaries, 0 ... T
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  // INVALID_ARGUMENT naming the field: sizes disagree, ids outside [0, vocab), targets
  // outside [-1, vocab), boundaries not 0 < ... < T, negative positions.
  absl::Status Validate(int64_t vocab) const;
};

// Sum of the per-token losses over tokens with a target, and how many there were.
struct LossSum {
  double sum = 0;
  int64_t tokens = 0;
};

struct Param {
  std::string name;
  runtime::Tensor value;  // f32
  runtime::Tensor grad;   // f32, accumulated by ForwardBackward
};

class Llama {
 public:
  static absl::StatusOr<std::unique_ptr<Llama>> Create(const LlamaConfig& config, runtime::Backend* backend);
  ~Llama();

  const LlamaConfig& config() const { return config_; }
  std::vector<Param>& params() { return params_; }
  Param* Find(const std::string& name);

  // Deterministic from (seed, parameter name): normal(0, stddev) weights, norms 1,
  // biases 0 — the same values whatever the layout that later shards them.
  absl::Status InitRandom(uint64_t seed, float stddev = 0.02f);
  absl::Status ZeroGrads();

  // Forward only: the summed loss.
  absl::StatusOr<LossSum> Forward(const TokenBatch& batch);
  // Forward and backward: adds grad_scale * d(loss sum)/d(param) into every grad (so a
  // token-mean over a global batch passes 1 / its target count to every micro-batch).
  absl::StatusOr<LossSum> ForwardBackward(const TokenBatch& batch, float grad_scale);

 private:
  struct LayerParams;
  struct LayerActs;
  struct Inputs;
  Llama(const LlamaConfig& config, runtime::Backend* backend);
  absl::Status Allocate();
  absl::StatusOr<Inputs> Upload(const TokenBatch& batch);
  absl::Status LayerForward(const LayerParams& w, const Inputs& in, const runtime::Tensor& x, LayerActs& a,
                            runtime::Tensor& out);
  absl::Status LayerBackward(const LayerParams& w, const Inputs& in, const LayerActs& a, runtime::Tensor& dx);
  absl::StatusOr<LossSum> Run(const TokenBatch& batch, bool backward, float grad_scale);

  LlamaConfig config_;
  runtime::Backend* backend_;
  std::vector<Param> params_;
  std::vector<LayerParams> layers_;
  Param *embed_ = nullptr, *final_norm_ = nullptr, *lm_head_ = nullptr;
};

}  // namespace tessera::model
