// The rollout engine (docs/design.md §7): generation for RL and batch inference over the training
// engine's model and weights (no copy), with a paged KV cache and continuous batching.
//
// Generate() expands each request into `n` samples and runs them to completion in
// steps; each step is one forward over every row it scheduled:
//   - the running samples' next tokens (decode rows, one each, attending to their cache);
//   - prompt tokens, up to max_prefill_tokens a step: the rest of a prompt whose first
//     chunk ran in an earlier step (rows that attend to the cache), then waiting samples
//     admitted while a batch slot is free and the cache has blocks for their prompt (a
//     prompt longer than what the step has left is prefilled in chunks over the next
//     steps). A sample samples its first token in the step that computes its prompt's last.
//   - paged KV on demand: admission takes the blocks of a sample's prompt (keeping a
//     watermark of 1% of the cache free); a running sample takes a block when its next
//     token starts one. When none is free, the most recently admitted running sample is
//     preempted: its blocks go back, its tokens are kept, and it waits at the head of the
//     queue to be prefilled again (prompt and what it generated: recompute, vLLM's
//     default) before it goes on — its tokens are those it would have drawn unpreempted.
//   - prefix sharing (RolloutOptions::prefix_sharing): the samples of one request admitted
//     together (a GRPO group) share its prompt — one of them prefills it, the others take
//     the prompt's full blocks by reference (counted; a block goes back to the free list
//     with its last user) and a copy of its last, partly filled block, and draw their first
//     token from the same logits with their own seeds;
//   - a sample ends at one of its stop tokens (kept, finish "stop"), when its new tokens
//     end with one of its stop sequences (kept, finish "tool") or after max_new_tokens
//     (finish "length"); its blocks go back to the free list.
// On a GPU the host does not wait for a step before it launches the next: a step's
// sampled tokens stay on the device as the next step's inputs (Backend::Select), and
// reach the host while that step runs; a sample that the first turned out to end got a
// row in the second for nothing, which is dropped. Decode-only steps of a model without TP
// run as CUDA graphs (RolloutOptions::cuda_graphs).
// Sampling (kernels/sampling: temperature, top-k, top-p, greedy at temperature 0) draws
// token i of sample j of a request with (seed + j, i), so the result does not depend on
// batching, admission order or preemption; the log-probability of each drawn token is
// under the sampling distribution (softmax(logits / temperature); at temperature 0 or 1
// the model's own). The logits stay on the model's device and are sampled there; under
// TP each rank first gathers the whole vocabulary's logits on its device
// (Generator::GatherVocab) and every rank draws the same tokens.
// ReleaseCache() frees the cache (a colocated executor going back to training); the
// next Generate() makes it again.
// Threading: one caller at a time (like the model it drives).
#pragma once

#include <cstdint>
#include <deque>
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
  // Prompt tokens a step computes at most, beside its decode rows (longer prompts run in
  // chunks over several steps).
  int64_t max_prefill_tokens = 8192;
  // Where > 0 and the device's memory is known (a GPU): the cache is made with at most
  // the blocks that fit in this fraction of the device's memory, counting what is already
  // allocated there (KvCacheBlocks), when Generate() makes it. A request longer than that
  // cache is refused naming the numbers.
  double gpu_memory_utilization = 0;
  bool sample_on_host = false;  // a GPU model's logits sampled on the host all the same (tests)
  bool prefix_sharing = true;   // the samples of a request admitted together share its prompt (above)
  // GPU, no TP, no parameter hooks: each decode-only step is a CUDA graph (one per padded
  // batch size and table width, captured at its second use) — the step's inputs are
  // three uploads from page-locked memory, its tokens one download, and no per-op launch
  // cost remains.
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
  // Steps of the last Generate() with decode rows, and with prompt rows (a step may have
  // both), how many of its decode steps replayed a CUDA graph, and how many times a
  // running sample was preempted.
  int64_t decode_steps() const { return decode_steps_; }
  int64_t prefills() const { return prefills_; }
  int64_t preemptions() const { return preemptions_; }
  // Decode rows of the last Generate(), and the cached tokens its rows that read the cache
  // attended to (the KV-cache bytes its attention read, in tokens).
  int64_t decode_rows() const { return decode_rows_; }
  int64_t attended_tokens() const { return attended_tokens_; }
  // Prompt tokens the last Generate()'s prefills computed (a shared prompt once), and the
  // most cache blocks its samples held at once.
  int64_t prefill_tokens() const { return prefill_tokens_; }
  int64_t peak_blocks() const { return peak_blocks_; }
  int64_t graph_steps() const { return graph_steps_; }
  // The nodes and edges of the decode graph captured last (all zero before the first).
  runtime::Backend::Graph::Shape last_graph_shape() const { return last_graph_shape_; }
  // Host wall time of the last Generate(), split between the steps with prompt rows and
  // the decode-only ones (the host's scheduling, launches and waits for tokens).
  double prefill_seconds() const { return prefill_s_; }
  double decode_seconds() const { return decode_s_; }

 private:
  struct Seq;
  struct Plan;      // one step's rows (rollout_step.cc)
  struct Launched;  // a launched step whose sampled tokens are on their way to the host
  RolloutEngine(model::Llama* model, const RolloutOptions& options);
  // Scheduling (rollout.cc): the next step's rows from the running and waiting samples,
  // taking blocks as they are needed (and preempting for them). Sets *drain, and plans
  // nothing, when it needs the tokens of the step in flight first: blocks ran out while
  // one is in flight (its finished samples may give theirs back), or the sample to
  // preempt has a token in it.
  absl::Status Schedule(std::deque<Seq*>& waiting, std::vector<Seq*>& running, Plan& plan, bool* drain);
  bool TakeBlock(Seq& s);
  void Preempt(Seq& s, std::deque<Seq*>& waiting);
  void FreeBlocks(Seq& s);
  // Steps (rollout_step.cc): launch one (its tokens then travel to the host), collect the
  // tokens of one launched earlier.
  absl::Status Launch(const Plan& plan, Launched& out);
  absl::Status LaunchEager(const Plan& plan, Launched& out);
  absl::Status Collect(Launched& step);
  absl::Status FinishLaunch(Launched& out);  // the tokens' download and its event
  // Sampling parameters of each sequence's next draw, and a drawn token appended.
  void SamplingInputs(const std::vector<Seq*>& seqs, float* temperature, int32_t* top_k, float* top_p, int64_t* seed,
                      int64_t* offset) const;
  void Append(Seq& s, int32_t token, float logprob);
  // Draws the rows of `logits` (row i: seqs[i]'s next token) into step_tokens_ and
  // step_logprobs_ [0, n) on the model's device.
  absl::Status SampleRows(const std::vector<Seq*>& seqs, const runtime::Tensor& logits);

  // CUDA-graph decode (source: rollout_graph.cc). A graph's static buffers: i32 host
  // tokens, their sources (Backend::Select), positions, slots, lens, top_k [batch] then
  // tables [batch, max_blocks]; f32 temperature, top_p; i64 seed, offset; the selected
  // tokens.
  struct DecodeGraph {
    int64_t batch = 0, max_blocks = 0;
    runtime::Tensor inputs;          // one buffer, one upload a step: i64, then f32, then i32
    runtime::Tensor i32, f32, i64;   // views of inputs
    runtime::Tensor tokens;
    std::unique_ptr<runtime::Backend::Graph> graph;
    int uses = 0;
  };
  bool GraphsUsable() const;
  uint64_t GraphFingerprint() const;  // the addresses a graph bakes in: weights and cache
  absl::Status LaunchGraph(const Plan& plan, Launched& out);
  absl::Status RunDecodeGraphOps(DecodeGraph& g);

  model::Llama* model_;
  RolloutOptions options_;
  std::map<std::pair<int64_t, int64_t>, DecodeGraph> graphs_;
  uint64_t graph_fingerprint_ = 0;
  bool graphs_failed_ = false;  // a capture failed: eager decode from then on
  int64_t scratch_block_ = -1;  // first of the blocks padded graph rows write to (never handed out)
  int64_t graph_steps_ = 0;
  runtime::Backend::Graph::Shape last_graph_shape_;
  std::unique_ptr<runtime::Backend> host_;  // sampling (sample_on_host) and host index tensors
  std::unique_ptr<model::Generator> gen_;   // the model over its KV cache (null: released)
  std::vector<int32_t> free_blocks_;
  std::vector<int32_t> block_refs_;  // per cache block: the samples holding it (prefix sharing)
  int64_t cache_blocks_ = 0;         // blocks handed out (the cache's, scratch excluded)
  // Makes the cache (gen_): its blocks from the options and, budgeted, the device's memory.
  absl::Status MakeCache(const std::vector<GenerationRequest>& requests);
  // A step's sampled tokens and log-probs on the model's device (rows: at most the padded
  // running batch), and their two landing places on the host (page-locked) with an event
  // each, used by alternate steps; the graphs' inputs are staged in page-locked memory the
  // same way.
  runtime::Tensor step_tokens_, step_logprobs_;  // views of step_out_: tokens, then log-probs
  runtime::Tensor step_out_;
  runtime::Backend::HostBuffer host_out_[2] = {{nullptr, nullptr}, {nullptr, nullptr}};
  runtime::Backend::HostBuffer stage_[2] = {{nullptr, nullptr}, {nullptr, nullptr}};
  size_t stage_bytes_ = 0;
  std::unique_ptr<runtime::Backend::Event> landed_[2];
  int next_slot_ = 0;
  int64_t admitted_ = 0;  // admissions so far (a sample's order: preemption takes the latest)
  int64_t decode_steps_ = 0, prefills_ = 0, peak_bytes_ = 0, prefill_tokens_ = 0, peak_blocks_ = 0, preemptions_ = 0;
  int64_t decode_rows_ = 0, attended_tokens_ = 0;
  double prefill_s_ = 0, decode_s_ = 0;
};

}  // namespace tessera::engine
