// The rollout engine (docs/design.md §7): generation for RL and batch inference over the training
// engine's model and weights (no copy), with a paged KV cache and continuous batching.
//
// Generate() expands each request into `n` samples and runs them to completion:
//   - admission: a waiting sample joins the running batch when a batch slot is free and
//     the cache has blocks for its prompt plus max_new_tokens (reserved up front, so a
//     running sample never waits for memory and nothing is preempted);
//   - prefix sharing (RolloutOptions::prefix_sharing): the samples of one request admitted
//     together (a GRPO group) share its prompt — one of them prefills it, the others take
//     the prompt's full blocks by reference (counted; a block goes back to the free list
//     with its last user) and a copy of its last, partly filled block, and draw their first
//     token from the same logits with their own seeds: the tokens are what each would have
//     drawn alone, for the prompt's compute and memory once per group;
//   - prefill: the admitted samples' prompts in one packed varlen forward, writing their
//     keys and values into their blocks; it gives each its first new token;
//   - decode: every running sample's last token in one forward over the cache (block
//     tables, context lengths); sequences join and leave between steps;
//   - a sample ends at one of its stop tokens (kept, finish "stop"), when its new tokens
//     end with one of its stop sequences (kept, finish "tool") or after max_new_tokens
//     (finish "length"); its blocks go back to the free list at once.
// Sampling (kernels/sampling: temperature, top-k, top-p, greedy at temperature 0) draws
// token i of sample j of a request with (seed + j, i), so the result does not depend on
// batching or admission order; the log-probability of each drawn token is under the
// sampling distribution (softmax(logits / temperature); at temperature 0 or 1 the
// model's own). On a GPU the logits stay on the device and are sampled there (the same
// counter-based draw as the host's); under TP each rank first gathers the whole
// vocabulary's logits on its device (Generator::GatherVocab) and every rank draws the same
// tokens. On the CPU they are sampled by the host backend.
// ReleaseCache() frees the cache (a colocated executor going back to training); the
// next Generate() makes it again.
// Threading: one caller at a time (like the model it drives).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/generator.h"
#include "worker/model/llama.h"
#include "worker/runtime/backend.h"

namespace tessera::engine {

struct SamplingParams {
  float temperature = 1.f;  // 0: greedy
  int32_t top_k = 0;        // 0: the whole vocabulary
  float top_p = 1.f;        // 1: no nucleus cut
  int64_t max_new_tokens = 64;
  std::vector<int32_t> stop_tokens;
  // A sample also ends when its new tokens end with one of these (kept; finish "tool":
  // a multi-turn rollout's tool call, worker/rollout/multi_turn.h).
  std::vector<std::vector<int32_t>> stop_sequences;
  uint64_t seed = 0;
  int n = 1;  // samples of the prompt (a GRPO group)
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams params;
};

struct Completion {
  int64_t request = 0;  // index into Generate's requests
  int sample = 0;       // 0 .. n-1
  std::vector<int32_t> tokens;  // the new tokens (a stop token included)
  std::vector<float> logprobs;  // of each new token under the sampling distribution
  std::string finish_reason;    // "stop" | "length" | "tool" (a stop sequence); multi-turn also "environment"
  // Multi-turn (GenerateEpisodes): per token, 1 where the model sampled it, 0 where it is an
  // environment's observation (its log-prob 0); empty: every token sampled. And how many
  // times the environment was called.
  std::vector<uint8_t> sampled;
  int tool_calls = 0;
};

struct RolloutOptions {
  int64_t block_size = 16;
  int64_t num_blocks = 256;  // cache capacity: num_blocks * block_size tokens (at most: below)
  int64_t max_running = 64;  // samples decoded together
  // A prefill packs the admitted samples' prompts up to this many tokens (at least one
  // sample's); the rest wait for the next admission, a decode step later.
  int64_t max_prefill_tokens = 8192;
  // Where > 0 and the device's memory is known (a GPU): the cache is made with at most
  // the blocks that fit in this fraction of the device's memory, counting what is already
  // allocated there (KvCacheBlocks), when Generate() makes it. A request longer than that
  // cache is refused naming the numbers.
  double gpu_memory_utilization = 0;
  bool sample_on_host = false;  // a GPU model's logits sampled on the host all the same (tests)
  bool prefix_sharing = true;   // the samples of a request admitted together share its prompt (above)
  // GPU, no TP, no parameter hooks: each decode step is a CUDA graph (one per
  // padded batch size and table width, captured at its second use) — the step's inputs
  // are three uploads, its tokens two downloads, and no per-op launch cost remains.
  bool cuda_graphs = true;
};

// A completion as a training sequence: prompt + completion tokens, positions from 0,
// next-token targets (none after the last token); with `mask`, 1 for the targets that
// are completion tokens (what an RL loss counts), 0 elsewhere. For teacher-forced
// log-probs of what the rollout sampled.
model::TokenBatch CompletionSequence(const std::vector<int32_t>& prompt, const std::vector<int32_t>& completion,
                                     std::vector<double>* mask = nullptr);

// The blocks of a KV cache: `wanted`, or as many of `bytes_per_block` as fit in
// utilization x total less what the device holds already (total - free), if fewer (never
// below 0).
int64_t KvCacheBlocks(int64_t wanted, int64_t bytes_per_block, const runtime::Backend::DeviceMemory& memory,
                      double utilization);

class RolloutEngine {
 public:
  // The model is not owned and must outlive the engine; its weights are read as they are
  // at each Generate() (the actor's current weights when colocated).
  static absl::StatusOr<std::unique_ptr<RolloutEngine>> Create(model::Llama* model, const RolloutOptions& options);
  // Completions ordered by (request, sample). A request that can never fit the cache, an
  // empty prompt or a bad parameter is an error naming the request, before anything runs.
  absl::StatusOr<std::vector<Completion>> Generate(const std::vector<GenerationRequest>& requests);
  void ReleaseCache();
  // Whether the KV cache is allocated (from the first Generate() until ReleaseCache()),
  // and its blocks (options' num_blocks, or fewer where memory is budgeted).
  bool holds_cache() const { return gen_ != nullptr; }
  int64_t cache_blocks() const { return cache_blocks_; }
  int64_t cache_bytes() const;
  // The model's device tensors at their peak during the last Generate() (its allocator's
  // peak, reset when the call starts).
  int64_t peak_bytes() const { return peak_bytes_; }
  // Decode steps and prefills of the last Generate() (tests: continuous batching), and
  // how many of its decode steps replayed a CUDA graph.
  int64_t decode_steps() const { return decode_steps_; }
  int64_t prefills() const { return prefills_; }
  // Prompt tokens the last Generate()'s prefills computed (a shared prompt once), and the
  // most cache blocks its samples held at once.
  int64_t prefill_tokens() const { return prefill_tokens_; }
  int64_t peak_blocks() const { return peak_blocks_; }
  int64_t graph_steps() const { return graph_steps_; }
  // Host wall time of the last Generate()'s prefills and decode steps (each ends with its
  // sampled tokens on the host, so these are the device's time plus the host's launches).
  double prefill_seconds() const { return prefill_s_; }
  double decode_seconds() const { return decode_s_; }

 private:
  struct Seq;
  RolloutEngine(model::Llama* model, const RolloutOptions& options);
  absl::Status Prefill(std::vector<Seq*>& admitted);
  absl::Status Decode(std::vector<Seq*>& running);
  // The model's forward over the cache for `seqs`, then each sequence's next token.
  // `rows` (prefix sharing): the logits row of each of `seqs` (null: row i for seqs[i]).
  absl::Status ForwardAndSample(const std::vector<Seq*>& seqs, const model::TokenBatch& batch,
                                const std::vector<int32_t>& slots, const model::DecodeView* view,
                                const std::vector<int64_t>* rows = nullptr);
  // Draws each sequence's next token from its row of `logits` (on `be`'s device: the
  // host backend, or the model's GPU) and appends it.
  absl::Status SampleInto(const std::vector<Seq*>& seqs, const runtime::Tensor& logits, runtime::Backend& be);

  // CUDA-graph decode (source: rollout_graph.cc). A graph's static buffers: i32 tokens,
  // positions, slots, lens, top_k [batch] then tables [batch, max_blocks]; f32
  // temperature, top_p; i64 seed, offset; the outputs token, logprob.
  struct DecodeGraph {
    int64_t batch = 0, max_blocks = 0;
    runtime::Tensor i32, f32, i64, token, logprob;
    std::unique_ptr<runtime::Backend::Graph> graph;
    int uses = 0;
  };
  bool GraphsUsable() const;
  uint64_t GraphFingerprint() const;  // the addresses a graph bakes in: weights and cache
  absl::Status DecodeWithGraph(std::vector<Seq*>& running);
  absl::Status RunDecodeGraphOps(DecodeGraph& g);
  // Sampling parameters of each sequence's next draw, and the drawn tokens appended.
  void SamplingInputs(const std::vector<Seq*>& seqs, float* temperature, int32_t* top_k, float* top_p, int64_t* seed,
                      int64_t* offset) const;
  void Append(const std::vector<Seq*>& seqs, const int32_t* token, const float* logprob);

  model::Llama* model_;
  RolloutOptions options_;
  std::map<std::pair<int64_t, int64_t>, DecodeGraph> graphs_;
  uint64_t graph_fingerprint_ = 0;
  bool graphs_failed_ = false;  // a capture failed: eager decode from then on
  int64_t scratch_block_ = -1;  // first of the blocks padded graph rows write to (never handed out)
  int64_t graph_steps_ = 0;
  std::unique_ptr<runtime::Backend> host_;  // sampling and host index tensors
  // A GPU model samples on its device (no logits through the host; under TP from the
  // gathered vocabulary, every rank drawing the same tokens).
  bool device_sampling_ = false;
  std::unique_ptr<model::Generator> gen_;  // the model over its KV cache (null: released)
  std::vector<int32_t> free_blocks_;
  std::vector<int32_t> block_refs_;  // per cache block: the samples holding it (prefix sharing)
  int64_t cache_blocks_ = 0;  // blocks handed out (the cache's, scratch excluded)
  // Makes the cache (gen_): its blocks from the options and, budgeted, the device's memory.
  absl::Status MakeCache(const std::vector<GenerationRequest>& requests);
  int64_t decode_steps_ = 0, prefills_ = 0, peak_bytes_ = 0, prefill_tokens_ = 0, peak_blocks_ = 0;
  double prefill_s_ = 0, decode_s_ = 0;
};

}  // namespace tessera::engine
