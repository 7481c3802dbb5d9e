// Llama-style decoder on one rank (docs/design.md §6): embedding, per layer RMSNorm -> GQA
// attention with RoPE (optional QKV bias) -> residual -> RMSNorm -> SwiGLU MLP ->
// residual, final RMSNorm, LM head (optionally tied to the embedding). Explicit forward
// and backward per layer with saved activations — no autograd. Runs on any Backend
// (the CPU backend is the oracle). Parameters (the master copy), their gradients and the
// optimizer's state are f32; activations are config.dtype: f32, or bf16 with mixed
// precision, where each parameter also has a bf16 compute copy (Param::compute) that
// forward and backward use, weight gradients are accumulated straight into the f32
// gradients (bf16 x bf16 -> f32 GEMMs) and statistics (RMSNorm rstd, attention lse,
// cross-entropy partials) stay f32.
//
// Tensor parallelism (Megatron), when given a TP communicator of size tp: q/k/v and
// gate/up are column-parallel (this rank's heads and MLP columns), o and down are
// row-parallel (partial sums all-reduced in the forward), the input gradient of a
// column-parallel block is all-reduced in the backward, the embedding and the LM head
// are vocab-parallel (rows [rank V/tp, (rank+1) V/tp)), and the cross-entropy combines
// the shards' max / sum-exp / target logit with three all-reduces. Norms are replicated
// (their inputs and gradients are the same on every rank).
//
// Sequence parallelism (with TP): the residual stream, the norms and the residual adds
// hold this rank's T/tp tokens; the input of every column-parallel block is all-gathered
// over TP and the output of every row-parallel block reduce-scattered (and the reverse
// in the backward) instead of all-reduced; norm weight gradients are summed over TP.
// The packed batch's token count must divide by tp.
//
// Context parallelism (worker/model/context_parallel.h): each CP rank holds two chunks of
// every sequence; everything but attention is per token, attention runs round the CP
// ring. Gradients are partial sums over the rank's tokens: the trainer reduces them over
// the DP x CP group.
//
// Threading: a Llama is used by one thread at a time (its backend's thread).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/comm/communicator.h"
#include "common/model/config.h"
#include "common/model/rope.h"
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
  // One sequence at positions 0..T-1, each token's target the next one (the last none):
  // the batch of a language-modelling loss over `tokens`.
  static TokenBatch NextTokenSequence(std::vector<int32_t> tokens);
  // INVALID_ARGUMENT naming the field: sizes disagree, ids outside [0, vocab), targets
  // outside [-1, vocab), boundaries not 0 < ... < T, negative positions.
  absl::Status Validate(int64_t vocab) const;
};

// Sum of the per-token losses over tokens with a target, and how many there were.
struct LossSum {
  double sum = 0;
  int64_t tokens = 0;
};

// Hooks of data parallelism (worker/train/grad_sync.h: the ZeRO strategies). The model runs
// in blocks — 0: the embedding, 1..layers: the decoder layers, layers + 1: the final
// norm and the LM head — and calls these around each block's forward and backward.
class ParamHooks {
 public:
  enum class Phase { kForward, kBackward };
  virtual ~ParamHooks() = default;
  // Before a block runs: the values of the parameters it uses must be present (ZeRO-3
  // gathers them) and, in the backward, their gradient buffers too (ZeRO-2/3 allocate
  // them zeroed).
  virtual absl::Status Acquire(int block, Phase phase) = 0;
  // After the block ran (ZeRO-3 frees what the next block does not use).
  virtual absl::Status Release(int block, Phase phase) = 0;
  // After the block's backward: the gradients of the parameters it owns (BlockOwns) are
  // complete for this micro-batch (ZeRO-2/3 reduce-scatter them into the rank's shard).
  virtual absl::Status GradsReady(int block) = 0;
  // The embedding's backward: true when the hook takes this micro-batch's rows itself
  // (token ids, their output gradient [tokens, hidden], this rank's vocabulary from
  // vocab_start) and the model adds nothing to the embedding's gradient — the trainer's
  // early embedding reduction (grad_sync.h, DataParallelSync); false: the model adds them.
  virtual absl::StatusOr<bool> TakeEmbeddingRows(const runtime::Tensor& /*ids*/, const runtime::Tensor& /*dout*/,
                                                 int64_t /*vocab_start*/) {
    return false;
  }
};

struct Param {
  ParamSpec spec;         // name, global shape, tensor-parallel dimension
  runtime::Tensor value;  // f32, this rank's shard (the master weights)
  runtime::Tensor grad;   // f32, accumulated by ForwardBackward
  runtime::Tensor compute;  // bf16 copy of value when config.dtype is bf16 (Llama::RefreshCompute)
  // The gradient's contents are not this step's (Llama::ZeroGrads): the step's first
  // write overwrites it (a GEMM with beta 0) instead of adding, which saves a pass that
  // zeroes every gradient and the first micro-batch's read of those zeros. A reader, or a
  // write that can only add (a scatter), calls Llama::FreshenGrad first.
  bool grad_stale = false;
  const std::string& name() const { return spec.name; }
  // What a forward or backward multiplies with: the compute copy under mixed precision.
  const runtime::Tensor& weight() const { return compute.defined() ? compute : value; }
};

struct KvCache;
struct DecodeView;
class Generator;  // generation over a KV cache: worker/model/generator.h

class Llama {
 public:
  // tp: the tensor-parallel group (null or size 1: no tensor parallelism); it must hold
  // host buffers for a CPU backend (Gloo) and device buffers for a GPU one (NCCL).
  // cp: the context-parallel group (null or size 1: none); batches are then this rank's
  // split (worker/model/context_parallel.h) and attention runs round the CP ring.
  // stage: this rank's pipeline stage (default: the whole model); it holds only the
  // parameters of its chunks.
  static absl::StatusOr<std::unique_ptr<Llama>> Create(const LlamaConfig& config, runtime::Backend* backend,
                                                       comm::Communicator* tp = nullptr,
                                                       bool sequence_parallel = false,
                                                       comm::Communicator* cp = nullptr, StageSpec stage = {});
  ~Llama();

  const LlamaConfig& config() const { return config_; }
  std::vector<Param>& params() { return params_; }
  // The parameters' tensors (values, gradients, compute copies; undefined ones too): what
  // the model keeps between passes, for an idle group's offload (runtime::HostOffload).
  void AppendStates(std::vector<runtime::Tensor>* out) const;
  Param* Find(const std::string& name);
  // How this TP rank holds p (TpSplitOf: its slice, and with replicated KV heads which copy).
  TpSplit SplitOf(const Param& p) const { return TpSplitOf(p.spec, tp_ ? tp_->size() : 1, tp_ ? tp_->rank() : 0); }

  // Deterministic from (seed, parameter name): normal(0, stddev) weights, norms 1,
  // biases 0 — the full tensor is drawn and this rank keeps its shard, so every layout
  // holds the same model.
  // With `only`, the parameters it accepts alone (each parameter's values depend on the
  // seed and its name, not on which others are made).
  absl::Status InitRandom(uint64_t seed, float stddev = 0.02f, const std::function<bool(const Param&)>& only = {});
  // Sets a parameter from its full (global) value; this rank keeps its shard.
  absl::Status SetGlobal(Param& p, const std::vector<float>& global);
  // Sets this rank's slice of a parameter (SplitOf(p); p.value's elements, on the host).
  absl::Status SetShard(Param& p, const float* shard);
  // The full (global) value or gradient of a parameter, gathered over the TP group
  // (every rank of the group must call it).
  absl::StatusOr<std::vector<float>> GatherGlobal(const Param& p, bool grad);
  // The same on this backend, without a host round trip: the full value of `p` into
  // `out` (f32, contiguous, p's number of elements; e.g. a slice of a weight-sync
  // bucket); and this rank's shard of `p` set from a full value `global` laid out so.
  // Every rank of the TP group must call GatherGlobalInto together.
  absl::Status GatherGlobalInto(const Param& p, runtime::Tensor& out);
  absl::Status SetGlobalFrom(Param& p, const runtime::Tensor& global);
  // Mixed precision: whoever writes a parameter's value (the optimizer, a ZeRO-3
  // gather, a checkpoint load) refreshes its compute copy; SetGlobal does it itself.
  // A no-op in f32; with no value present (ZeRO-3 between uses) the copy is dropped.
  absl::Status RefreshCompute(Param& p);
  // Zeroes every gradient buffer that is present (ZeRO-2/3 keep none between blocks),
  // lazily: it marks them stale (Param::grad_stale). On the CPU backend it also fills
  // them with NaN, so that a write that adds to a stale gradient, or a read of one that
  // did not freshen it, shows in every CPU test instead of summing last step's gradient.
  absl::Status ZeroGrads();
  // Zeroes p's gradient if it is stale: before reading it, or writing by adding.
  absl::Status FreshenGrad(Param& p);
  // Marks p's gradient stale (ZeroGrads for one parameter; NaN on the CPU backend).
  absl::Status MarkGradStale(Param& p);

  // For a model that only runs forward passes (RL's reference policy): drops every
  // gradient and, under mixed precision, the f32 values, keeping the compute copies the
  // forward multiplies with — 2Φ bytes instead of 10Φ in bf16. From then on anything that
  // writes or reads the f32 weights or runs a backward is refused (FAILED_PRECONDITION).
  absl::Status Freeze();
  bool frozen() const { return frozen_; }

  // Blocks (see ParamHooks): the parameters a block uses, and those whose gradient is
  // complete after its backward (each parameter is owned by the lowest block using it:
  // the backward runs from the top block down; a tied embedding belongs to block 0).
  int num_blocks() const { return static_cast<int>(config_.layers) + 2; }
  const std::vector<Param*>& BlockUses(int block) const { return uses_[block]; }
  const std::vector<Param*>& BlockOwns(int block) const { return owns_[block]; }
  // Not owned; null: every parameter's value and gradient are always present.
  void set_hooks(ParamHooks* hooks) { hooks_ = hooks; }
  // Activation recomputation per layer: the forward keeps only each layer's input and the
  // backward runs the layer's forward again (its collectives too) before its backward —
  // about one more forward of compute for activations of one layer instead of all.
  void set_recompute(bool on) { recompute_ = on; }
  // Each layer's SwiGLU output is dropped after the down projection's forward; the
  // backward rebuilds it inside SwiGLU's backward kernel (into the buffer of its input
  // gradient, once read) for the down projection's weight gradient. Bit for bit the same
  // training; [tokens, ffn / tp] less per layer kept (TrainSpec.recompute_swiglu).
  void set_recompute_swiglu(bool on) { recompute_swiglu_ = on; }
  // The LM head's logits [tokens, vocab / tp] are made in chunks of at most this many
  // tokens (0: the default, kHeadChunkElements / (vocab / tp) tokens, so ~512 MiB of
  // bf16 logits): each chunk's cross-entropy partials (max, sum of exp, the entropy's
  // dot, the target logit) are kept and its logits dropped, so the loss, log-probs and
  // entropies of a batch never hold the whole batch's logits. Where a batch needs more
  // than one chunk, the backward makes each chunk's logits again (one more head GEMM)
  // and runs the cross-entropy's and the head's backward chunk by chunk, adding the
  // weight gradient; with one chunk the forward's logits serve the backward as they are.
  static constexpr int64_t kHeadChunkElements = model::kHeadChunkElements;  // (common/model/config.h: the planner's too)
  void set_head_chunk_tokens(int64_t tokens) { head_chunk_tokens_ = tokens; }
  // Tokens per logits chunk for a batch of t tokens (at most t).
  int64_t HeadChunkTokens(int64_t t) const;

  // Pipeline parallelism: one model chunk of one micro-batch (the schedule is the
  // trainer's). The first virtual stage reads the batch's tokens (input null), others
  // the previous stage's output [tokens (/ tp under SP), hidden]; the last returns an
  // empty tensor and adds its loss to *loss. The backward takes the gradient of the
  // chunk's output (null on the last virtual stage) and returns that of its input (empty
  // on the first); gradients accumulate as in ForwardBackward.
  int num_chunks() const { return stage_.vpp; }
  bool FirstVirtualStage(int chunk) const { return chunk == 0 && stage_.rank == 0; }
  bool LastVirtualStage(int chunk) const { return chunk == stage_.vpp - 1 && stage_.rank == stage_.pp - 1; }
  const StageSpec& stage() const { return stage_; }
  absl::StatusOr<runtime::Tensor> PipelineForward(int chunk, int64_t micro_batch, const TokenBatch& batch,
                                                  const runtime::Tensor* input, float grad_scale, LossSum* loss);
  absl::StatusOr<runtime::Tensor> PipelineBackward(int chunk, int64_t micro_batch, const runtime::Tensor* grad_output);
  // Tokens of a stage's activation for this batch (the local tokens under SP).
  int64_t StageTokens(const TokenBatch& batch) const { return sp_ ? batch.size() / tp_size() : batch.size(); }

  // Readies the kernels this batch's attention will run (Backend::PrepareAttention: on
  // CUDA, cuDNN's plan for sequences of one length — this rank's heads, under CP the
  // chunks' shape, causal and not). Building a plan may wait for the device to drain, so
  // the trainer calls this where no collective is in flight. Nothing for mixed lengths.
  absl::Status PrepareKernels(const TokenBatch& batch);

  // Forward only: the summed loss.
  absl::StatusOr<LossSum> Forward(const TokenBatch& batch);
  // Forward only: this rank's logits, [T, vocab / tp] row-major, on the host (targets
  // may all be -1).
  absl::StatusOr<std::vector<float>> ForwardLogits(const TokenBatch& batch);
  // Forward only, per token: the log-probability of its target and the entropy of the
  // predicted distribution over the whole vocabulary (combined over the TP group) — the
  // reference and old-policy log-probs of RL. Tokens whose target is -1 get logprob 0.
  struct TokenStats {
    std::vector<float> logprob, entropy;
  };
  absl::StatusOr<TokenStats> TokenLogProbs(const TokenBatch& batch);
  // Forward and backward of a loss given per token through its gradient with respect to
  // the token's log-probability (RL's actor update: common/rl.h's ComputePolicyLoss gives
  // dL/dlogp from the new log-probs): the forward's TokenStats go to `grad`, which returns
  // dL/dlogprob_t for every token (ignored where the target is -1; every TP rank gets the
  // same stats and must return the same values); the backward adds dL/dparam into every
  // grad. Returns the forward's TokenStats. `grad` may also return dL/dH_t, the gradient
  // with respect to each token's entropy (RL's entropy bonus; empty: none), which the
  // backward carries through the whole vocabulary's softmax (vocab-parallel under TP).
  struct TokenGrads {
    std::vector<float> dlogprob;
    std::vector<float> dentropy;  // empty, or one value per token (ignored where the target is -1)
  };
  using LogProbGrad = std::function<absl::StatusOr<TokenGrads>(const TokenStats&)>;
  absl::StatusOr<TokenStats> ForwardBackwardLogProbs(const TokenBatch& batch, const LogProbGrad& grad);
  // A critic (LlamaConfig::value_head; no pipeline, no SP): each token's value, and the
  // forward and backward of a loss given through dL/dvalue per token (`grad` gets the
  // values, returns one gradient per token; every TP rank gets the same values and must
  // return the same gradients). The methods above need an LM head and refuse a critic.
  absl::StatusOr<std::vector<float>> TokenValues(const TokenBatch& batch);
  using ValueGrad = std::function<absl::StatusOr<std::vector<float>>(const std::vector<float>& values)>;
  absl::StatusOr<std::vector<float>> ForwardBackwardValues(const TokenBatch& batch, const ValueGrad& grad);
  // Forward and backward: adds grad_scale * d(loss sum)/d(param) into every grad (so a
  // token-mean over a global batch passes 1 / its target count to every micro-batch).
  absl::StatusOr<LossSum> ForwardBackward(const TokenBatch& batch, float grad_scale);
  // ForwardBackward and PipelineForward sum the cross-entropy on the device (TP's vocab
  // shards combined by device all-reduces): no host round trip between a micro-batch's
  // forward and backward. With defer_loss on
  // (the trainer), the sum they return leaves it out — LossSum::tokens still counts —
  // and TakePendingLoss() reads what is pending (one wait for the device) and clears it;
  // off (the default), ForwardBackward reads it itself at its end.
  void set_defer_loss(bool on) { defer_loss_ = on; }
  absl::StatusOr<double> TakePendingLoss();
  // Drops a pending sum unread (a step that failed half-way); no device work.
  void DropPendingLoss() { loss_pending_ = false; }

  bool has_param_hooks() const { return hooks_ != nullptr; }
  runtime::Backend& backend() const { return *backend_; }
  bool tensor_parallel() const { return tp_ != nullptr && tp_->size() > 1; }

 private:
  friend class Generator;
  struct LayerParams;
  struct LayerActs;
  struct Inputs;
  struct CacheStep;
  struct Flight;
  Llama(const LlamaConfig& config, runtime::Backend* backend, comm::Communicator* tp, bool sequence_parallel,
        comm::Communicator* cp, StageSpec stage);
  absl::Status CheckBatch(const TokenBatch& batch) const;
  absl::StatusOr<runtime::Tensor> ChunkForward(int chunk, const TokenBatch& batch, Flight& f, const runtime::Tensor* input,
                                               bool backward, float grad_scale, LossSum* loss,
                                               std::vector<float>* logits_out);
  absl::StatusOr<runtime::Tensor> ChunkBackward(int chunk, Flight& f, const runtime::Tensor* grad_output);
  int tp_size() const { return tp_ ? tp_->size() : 1; }
  int tp_rank() const { return tp_ ? tp_->rank() : 0; }
  absl::Status AllReduce(runtime::Tensor& t);  // sum over the TP group, in place
  absl::StatusOr<runtime::Tensor> EnterTp(const runtime::Tensor& local);
  absl::StatusOr<runtime::Tensor> LeaveTp(runtime::Tensor& partial);
  // dx = the norm's input gradient (+ *add, which may be dx: the residual's gradient).
  absl::Status NormBackward(const runtime::Tensor& dy, const runtime::Tensor& x, Param& w,
                            const runtime::Tensor& rstd, runtime::Tensor& dx, const runtime::Tensor* add = nullptr);
  // A row-parallel projection and its residual: LeaveTp(x W^T) + residual (this rank's
  // tokens under SP). Without TP there is no sum to wait for and the residual is added in
  // the GEMM's epilogue.
  absl::StatusOr<runtime::Tensor> RowParallelResidual(const runtime::Tensor& x, const runtime::Tensor& w,
                                                      const runtime::Tensor& residual);
  absl::Status Allocate();
  // GatherGlobal's and GatherGlobalInto's work: `shard` (p's value or gradient) gathered
  // over the TP group into `out` (f32, contiguous, global size), on the backend.
  absl::Status GatherInto(const Param& p, const runtime::Tensor& shard, runtime::Tensor& out);
  // Every TP rank's [rows, c] block placed as columns [k·c, (k+1)·c) of `full` [rows,
  // tp·c] (same dtype): an all-gather, then a 2-D device copy per block. The column
  // shards of a weight (GatherInto) and the vocabulary shards of logits (Generator::GatherVocab).
  absl::Status GatherColumns(const runtime::Tensor& local, runtime::Tensor& full);
  absl::StatusOr<Inputs> Upload(const TokenBatch& batch);
  // RoPE's frequencies for a batch of these positions (dynamic scaling: from the largest).
  RopeFrequencies RopeFor(const std::vector<int32_t>& positions) const;
  absl::Status LayerForward(const LayerParams& w, const Inputs& in, const runtime::Tensor& x, LayerActs& a,
                            runtime::Tensor& out);
  // A layer's forward over a KV cache (llama_cache_layer.cc: the Generator's prefill,
  // decode and mixed steps), keeping no activations; and its pieces: the normed q/k/v or
  // gate/up projections, fused where the backend takes the size, and a row-parallel
  // projection with its residual.
  struct NormedPart {
    const Param* w;
    const Param* bias;
    runtime::Tensor* y;
  };
  absl::Status CacheLayerForward(const LayerParams& w, const Inputs& in, const runtime::Tensor& x, runtime::Tensor& out,
                                 const CacheStep& kv);
  absl::Status CacheLayerTail(const LayerParams& w, const Inputs& in, const runtime::Tensor& x, const runtime::Tensor& o,
                              runtime::Tensor& out);
  absl::Status NormedLinears(const runtime::Tensor& x, const Param& norm, absl::Span<const NormedPart> parts, bool swiglu,
                             const Inputs& in);
  absl::StatusOr<runtime::Tensor> CacheRowParallel(const runtime::Tensor& x, const Param& w, const runtime::Tensor& residual);
  absl::Status LayerBackward(LayerParams& w, const Inputs& in, const LayerActs& a, runtime::Tensor& dx);
  // The k/v projections' backward when TP replicates the KV heads: the ranks sharing a
  // head each hold part of its gradient (from their query heads), summed over them per
  // micro-batch in one f32 all-reduce before it is added to the gradients; dx += the
  // projections' share of the input gradient (dk, dv [tokens, head_dim]).
  absl::Status ReplicatedKvBackward(LayerParams& w, const Inputs& in, const runtime::Tensor& dk,
                                    const runtime::Tensor& dv, const runtime::Tensor& x, runtime::Tensor& dx);
  absl::StatusOr<LossSum> Run(const TokenBatch& batch, bool backward, float grad_scale,
                              std::vector<float>* logits_out = nullptr, TokenStats* stats = nullptr,
                              const LogProbGrad* logprob_grad = nullptr, std::vector<float>* values = nullptr,
                              const ValueGrad* value_grad = nullptr);
  // The last virtual stage's head (llama_head.cc), after the final norm (f.xn_full): the
  // LM head's loss or log-probs (or a critic's values), and its backward, which returns
  // the gradient of the final norm's output.
  absl::Status HeadForward(Flight& f, const TokenBatch& batch, bool backward, float grad_scale, LossSum* loss,
                           std::vector<float>* logits_out);
  absl::StatusOr<runtime::Tensor> HeadBackward(Flight& f);
  absl::Status ValueHeadForward(Flight& f, int64_t t);
  absl::StatusOr<runtime::Tensor> ValueHeadBackward(Flight& f, int64_t t);
  // The head's logits chunk by chunk (HeadChunkTokens), each chunk's cross-entropy
  // partials into part[] (f32 [T] each, combined over TP: {max, sum of exp, sum of exp * z
  // (only with `dot`), target logit}); the logits are kept in f.logits only where one
  // chunk holds the batch (`keep`), and copied to the host into *logits_out if given.
  absl::Status HeadPartials(Flight& f, bool dot, bool keep, std::vector<float>* logits_out, runtime::Tensor (&part)[4]);
  // One chunk's partials (its logits [n, V/tp], targets [n]) into part[] ([n] views),
  // combined over the TP group on the device.
  absl::Status CombinedPartials(const runtime::Tensor& logits, const runtime::Tensor& targets, bool dot,
                                runtime::Tensor (&part)[4]);
  // Per token: the log-sum-exp over the whole vocabulary from its partials, on the host;
  // leaves the target logits in in.target_logit and, if asked, the entropies.
  absl::StatusOr<std::vector<float>> CrossEntropyLse(const runtime::Tensor (&part)[4], Inputs& in,
                                                     std::vector<float>* entropy = nullptr);

  LlamaConfig config_;
  runtime::Backend* backend_;
  comm::Communicator* tp_;  // null: one rank
  comm::Communicator* cp_;  // null: no context parallelism
  bool sp_;                 // sequence parallel (only with tp_)
  std::unique_ptr<runtime::Backend> host_;  // host tensors (cu_seqlens) of every micro-batch
  tessera::DType act_;                      // activations: config_.dtype
  RopeFrequencies rope_;                    // RoPE's frequencies (per batch instead under dynamic scaling)
  std::vector<Param> params_;
  std::vector<LayerParams> layers_;
  Param *embed_ = nullptr, *final_norm_ = nullptr, *lm_head_ = nullptr;
  Param* score_ = nullptr;  // the value head (a critic); lm_head_ is then null
  std::vector<std::vector<Param*>> uses_, owns_;  // per block
  ParamHooks* hooks_ = nullptr;
  bool recompute_ = false;
  bool recompute_swiglu_ = false;
  bool defer_loss_ = false;
  runtime::Tensor loss_sum_;  // f32 [1]: the cross-entropy summed on the device (set_defer_loss)
  bool loss_pending_ = false;  // loss_sum_ holds a sum not yet taken (else it is zeroed before use)
  // The whole-vocabulary loss of a flight on the device: lse, dloss and the pending sum.
  absl::Status DeviceLoss(Flight& f, const TokenBatch& batch, float grad_scale, LossSum* loss,
                          const runtime::Tensor (&part)[4]);
  int64_t head_chunk_tokens_ = 0;  // set_head_chunk_tokens
  bool frozen_ = false;            // Freeze()
  absl::Status CheckNotFrozen(const char* what) const;
  StageSpec stage_;
  std::vector<std::vector<int64_t>> chunk_layers_;  // per chunk, its layers
  std::map<std::pair<int, int64_t>, std::unique_ptr<Flight>> flights_;  // (chunk, micro-batch) in flight
};

}  // namespace tessera::model
