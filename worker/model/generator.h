// Generation over a paged KV cache (docs/design.md §7): the forward passes of the rollout
// engine (worker/rollout/rollout.h) over a training model's own weights — no copy. A
// Generator owns one cache and drives its model's layers over it: a prefill (a packed
// batch of prompts, attending to each other) or a decode step (one new token per
// sequence, attending to its cached context), and the decode step over inputs already on
// the device that the rollout engine captures in a CUDA graph.
//
// The model has no pipeline, context or sequence parallelism and has an LM head; TP
// shards the cache's heads like the attention. Threading: one thread at a time, the
// model's (the generator runs on the model's backend).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/llama.h"
#include "worker/runtime/tensor.h"

namespace tessera::model {

struct KvCache {
  std::vector<runtime::Tensor> k, v;  // per layer [blocks, block_size, kv_heads / tp, head_dim]
  int64_t blocks = 0, block_size = 0;
};

// A decode step's view of the cache: block tables [B, max_blocks] and context lengths
// [B] (this step's token included), host i32 (kernels/paged_attention).
struct DecodeView {
  runtime::Tensor tables, lens;
};

// A decode step's inputs on the model's device: tokens, positions, slots, lens i32 [B]
// and block tables i32 [B, max_blocks].
struct DeviceDecode {
  runtime::Tensor tokens, positions, slots, tables, lens;
};

class Generator {
 public:
  // A cache of `blocks` blocks of `block_size` tokens per layer, in the model's compute
  // dtype on its device. `model` is not owned and outlives the generator; its weights are
  // read as they are at each forward (a colocated actor's current weights).
  // INVALID_ARGUMENT for a non-positive size; FAILED_PRECONDITION for a model with
  // pipeline, context or sequence parallelism, or without an LM head (a critic).
  static absl::StatusOr<std::unique_ptr<Generator>> Create(Llama* model, int64_t blocks, int64_t block_size);
  // Bytes of one block of this rank's cache (keys and values of every layer).
  static int64_t CacheBytesPerBlock(const Llama& model, int64_t block_size);

  Llama& model() const { return *model_; }
  const KvCache& cache() const { return cache_; }

  // One generation step over the cache. Its rows are first the tokens of fresh sequences
  // (nothing of them cached yet: `cu_seqlens` over them, from 0 to `fresh`; they attend to
  // each other), then one row per token that attends to its sequence's cache through
  // `tables` [rows, max_blocks] and `lens` (the context with this token) — decode steps,
  // and prompt chunks after a sequence's first. Every row's keys and values go to the
  // cache at its `slots` entry (block * block_size + offset) at its position. `tokens`
  // (i32 [T]) is on the model's device; the rest is on the host and checked here.
  // Returns the logits of the rows `logits_of` names, in that order (a row may repeat):
  // [n, vocab / tp] in the compute dtype on the model's device, this rank's vocabulary shard
  // (GatherVocab joins them); none named: an undefined tensor, the LM head skipped.
  struct StepRows {
    runtime::Tensor tokens;
    std::vector<int32_t> positions, slots;
    std::vector<int32_t> cu_seqlens;  // empty: no fresh rows
    std::vector<int32_t> tables, lens;
    int64_t max_blocks = 0;
    std::vector<int64_t> logits_of;
    // No fresh rows, and every row the next token of a sequence of its own (a rollout's
    // decode-only step): each row's key and value go to the cache within its attention.
    // Checked: each row's slot is the last of its context, and no row's context holds
    // another row's new slot.
    bool decode_only = false;
  };
  absl::StatusOr<runtime::Tensor> Step(const StepRows& rows);
  // Every layer's keys and values at cache slots `to[i]` = those at `from[i]` (one gather
  // and one cache write per layer, stream-ordered on the model's backend; `to` distinct):
  // a sample sharing another's prompt takes its own copy of the prompt's tokens in the last,
  // partly filled block before writing its new tokens there.
  absl::Status CopySlots(const std::vector<int32_t>& from, const std::vector<int32_t>& to);
  // Vocabulary-parallel logits [n, vocab / tp] of every TP rank gathered into [n, vocab]
  // on the device, in their dtype (each rank gets the same); without TP `local` itself.
  // Every rank of the TP group calls it.
  absl::StatusOr<runtime::Tensor> GatherVocab(const runtime::Tensor& local);
  // The decode step over inputs already on the device (the rollout engine's CUDA graph
  // captures it), checked by the caller on their host copies (Backend::CheckCacheSlots,
  // CheckPagedIndices): nothing in it reads the host or waits for the device. Logits of
  // every row, as Step's. FAILED_PRECONDITION for a model with parameter hooks (ZeRO-3), TP or
  // dynamic RoPE scaling (DecodeOnDeviceSupported), and for a QKV-bias model (its bias is
  // added through a column of ones) past the rows ReserveDecodeRows made.
  absl::StatusOr<runtime::Tensor> DecodeStep(const DeviceDecode& inputs);
  static bool DecodeOnDeviceSupported(const Llama& model);
  // Makes what DecodeStep needs for up to `rows` sequences before any capture (a QKV-bias
  // model's column of ones, at a fixed address); nothing for other models.
  absl::Status ReserveDecodeRows(int64_t rows);

 private:
  Generator(Llama* model, KvCache cache) : model_(model), cache_(std::move(cache)) {}
  absl::Status Check() const;
  // Embedding, the layers over the cache (the first `fresh` rows of Inputs::cu's
  // sequences), then the rows `last` names (empty: every row) through the final norm and
  // the LM head.
  absl::StatusOr<runtime::Tensor> CacheForward(const Llama::Inputs& in, int64_t n, const std::vector<int64_t>& last,
                                               const runtime::Tensor& slots, const DecodeView* decode, int64_t fresh,
                                               bool decode_only);
  static absl::Status CheckDecodeOnly(const StepRows& r, int64_t block_size);

  Llama* model_;
  KvCache cache_;
  runtime::Tensor ones_;  // [rows, 1] in the compute dtype: DecodeStep's bias broadcast (ReserveDecodeRows)
};

}  // namespace tessera::model
