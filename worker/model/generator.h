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

  // One forward over new tokens: `batch` packs each sequence's new tokens (targets
  // unused) with their positions in the sequence; their keys and values go to the cache
  // at `slots` (block * block_size + offset, one per token). Without `decode` (prefill)
  // a sequence's tokens attend to each other — the cache holds nothing of it before —;
  // with it every sequence has one new token, which attends to its cached context.
  // Returns the logits of each sequence's last new token over the whole vocabulary
  // (gathered over TP), [sequences x vocab] f32 on the host.
  absl::StatusOr<std::vector<float>> Forward(const TokenBatch& batch, const std::vector<int32_t>& slots,
                                             const DecodeView* decode);
  // The same, but the logits stay on the model's device: [sequences x vocab / tp] in the
  // compute dtype, this rank's vocabulary shard (no TP gather). What the rollout engine
  // samples from on a GPU without a round trip through the host.
  absl::StatusOr<runtime::Tensor> ForwardLocal(const TokenBatch& batch, const std::vector<int32_t>& slots,
                                               const DecodeView* decode);
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
  // CheckPagedIndices): nothing in it reads the host or waits for the device. Logits as
  // ForwardLocal. FAILED_PRECONDITION for a model with parameter hooks (ZeRO-3), TP or
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
  // Embedding, the layers over the cache, then the last token of each sequence (`last`:
  // its index; empty: every token is one sequence's last) through the final norm and
  // the LM head.
  absl::StatusOr<runtime::Tensor> CacheForward(const Llama::Inputs& in, int64_t n, const std::vector<int64_t>& last,
                                               const runtime::Tensor& slots, const DecodeView* decode);

  Llama* model_;
  KvCache cache_;
  runtime::Tensor ones_;  // [rows, 1] in the compute dtype: DecodeStep's bias broadcast (ReserveDecodeRows)
};

}  // namespace tessera::model
