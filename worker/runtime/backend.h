// Backend: where tensors live and ops run (docs/design.md §5). Chosen at runtime by device
// (MakeBackend), no #ifdef in callers. The CPU backend is the reference every CUDA op
// is tested against; it runs the whole system where there is no GPU.
//
// Public methods validate shapes and dtypes (errors name the shapes) and then call
// the backend's kernels (kernels/<op>/), which take raw pointers and a stream.
// Conventions: activations are f32 or bf16; weights share the activation dtype;
// statistics (rstd), weight gradients of norms, and optimizer state are f32.
//
// Threading: one backend per device per thread; CUDA ops are ordered on the
// backend's stream, and Synchronize() waits for them.
#pragma once

#include <chrono>
#include <memory>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/attention/attention.h"
#include "kernels/decode/decode_linear.h"
#include "kernels/decode/qk_rope_cache.h"
#include "kernels/paged_attention/paged_attention.h"
#include "worker/runtime/tensor.h"

namespace tessera::runtime {

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;  // 1-based, for bias correction
  float grad_scale = 1.f;  // the gradient is multiplied by this first (global-norm clipping, fused)
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual Allocator* allocator() = 0;
  virtual absl::Status Synchronize() = 0;
  // The cudaStream_t every op is enqueued on (null on the CPU): NCCL communicators
  // order themselves with it (Communicator::OrderWith).
  virtual void* stream() const { return nullptr; }
  // CUDA graphs (the rollout engine's decode step). BeginCapture starts recording this
  // backend's stream: the ops until EndCapture are recorded, not run (their temporaries
  // come from the backend's capture arena, worker/runtime/capture_arena.h, which the graph
  // keeps: a tensor made during the capture stays valid after it, and its address is what
  // every launch of the graph uses; a block freed during one capture may serve the next
  // capture's temporaries, since a backend's graphs run on its one stream, never at once).
  // EndCapture returns the instantiated graph, or an error (and no graph; the stream leaves
  // capture mode) when something in between could not be captured — the caller then runs
  // without. UNIMPLEMENTED on the CPU.
  class Graph {
   public:
    // What a capture recorded: memory nodes are allocations and frees (the CUDA backend
    // serves a capture's temporaries from an arena, so it records none); a programmatic
    // edge lets a kernel start while the kernel before it finishes (kernels/common/pdl.cuh).
    struct Shape {
      int nodes = 0, kernels = 0, memory_nodes = 0, edges = 0, programmatic_edges = 0;
    };
    virtual ~Graph() = default;
    virtual absl::Status Launch() = 0;  // on the backend's stream
    virtual Shape shape() const { return {}; }
  };
  virtual absl::Status BeginCapture() { return absl::UnimplementedError("graph capture needs a CUDA backend"); }
  virtual absl::StatusOr<std::unique_ptr<Graph>> EndCapture() {
    return absl::UnimplementedError("graph capture needs a CUDA backend");
  }
  // Index tensors on the device (paged attention's block tables and context lengths, the
  // cache slots of KvCacheWrite) are normally checked by reading them back to the host:
  // a per-layer wait a decode step should not pay, and one a graph capture cannot make.
  // While trusted, device index tensors are not read back: the caller checked the host
  // copies it uploaded (CheckPagedIndices, CheckCacheSlots). Host index tensors are
  // always checked.
  void set_trust_device_indices(bool on) { trust_device_indices_ = on; }
  // INVALID_ARGUMENT naming the entry unless every context length is in [1, max_blocks *
  // block_size] and its blocks are blocks of the cache (k_cache [blocks, block_size, ...]).
  static absl::Status CheckPagedIndices(const Tensor& k_cache, const int32_t* tables, int64_t batch, int64_t max_blocks,
                                        const int32_t* lens);
  // INVALID_ARGUMENT unless the n slots are distinct slots of the cache.
  static absl::Status CheckCacheSlots(const Tensor& k_cache, const int32_t* slots, int64_t n);
  // Host <-> backend copies of a whole contiguous tensor. CopyFromHost may return before
  // the copy is done (CUDA, from page-locked memory): the source stays untouched until
  // Synchronize. CopyToHost returns with the bytes in place.
  virtual absl::Status CopyFromHost(const void* src, Tensor& dst) = 0;
  virtual absl::Status CopyToHost(const Tensor& src, void* dst) = 0;
  // Backend -> page-locked host memory (AllocHostStaging) without waiting: the bytes are in
  // place once the stream passes this point (an Event recorded after it). The CPU copies at
  // once.
  virtual absl::Status CopyToHostAsync(const Tensor& src, void* dst) { return CopyToHost(src, dst); }
  // A point on the backend's stream that the host can wait for: Record() marks where the
  // stream is now, Wait() returns once the stream has passed it (CUDA: an event; the CPU
  // runs ops as they are called, so there is nothing to wait for). One thread at a time.
  class Event {
   public:
    virtual ~Event() = default;
    virtual absl::Status Record() = 0;
    virtual absl::Status Wait() = 0;
  };
  virtual absl::StatusOr<std::unique_ptr<Event>> NewEvent();
  // `bytes` of host memory for staging copies to and from this backend: page-locked on
  // CUDA (copies from it run at the bus's speed and overlap the host's work), ordinary
  // memory on the CPU. Allocating it is slow: keep and reuse it.
  using HostBuffer = std::unique_ptr<char, void (*)(char*)>;
  virtual absl::StatusOr<HostBuffer> AllocHostStaging(size_t bytes) {
    return HostBuffer(new char[bytes], [](char* p) { delete[] p; });
  }
  // The device's memory, for sizing a cache to it: its total and free bytes, after the
  // allocator's pool gave the memory it holds unused back to the device and the backend
  // made the buffers it keeps for its own work (CUDA: the side streams' GEMM workspaces;
  // then waits for the stream and trims the pool). UNIMPLEMENTED on the CPU backend, whose host
  // memory is not budgeted.
  struct DeviceMemory {
    int64_t total = 0, free = 0;
  };
  virtual absl::StatusOr<DeviceMemory> MemoryInfo() {
    return absl::UnimplementedError("memory info: the CPU backend's host memory is not budgeted");
  }
  // Sets every byte of `t` (tests poison outputs with 0xff = NaN).
  virtual absl::Status Fill(Tensor& t, uint8_t byte) = 0;
  // A value that is not an integer (Fill(t, -INFINITY), Fill(t, 1.f)) does not compile:
  // it would convert to a byte (garbage, or undefined behaviour), not fill with the value.
  template <class T>
    requires(!std::is_integral_v<T>)
  absl::Status Fill(Tensor& t, T value) = delete;
  // dst = src on this backend, same shape and dtype; either may be a view: contiguous, or
  // 2-D with rows apart (a column block, Tensor::Slice(1, ...)). On CUDA one 2-D copy on
  // the backend's stream (no host round trip): weight sync re-slices TP shards with it.
  absl::Status Copy(const Tensor& src, Tensor& dst);

  absl::StatusOr<Tensor> Empty(std::vector<int64_t> shape, DType dtype) { return Tensor::Empty(std::move(shape), dtype, allocator()); }

  // y = x converted to y's dtype (any of f32, bf16, f16; round to nearest even).
  absl::Status Cast(const Tensor& x, Tensor& y);
  // x, y: [rows, cols]; w: [cols]; rstd: [rows] f32.  y = x * rstd * w, rstd = 1/sqrt(mean(x^2)+eps).
  absl::Status RmsNormForward(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd);
  // dx: [rows, cols]; dw: [cols] f32 (overwritten). With `add` (x's shape and dtype; may
  // be dx itself), dx = the norm's input gradient + *add, rounded once: a pre-norm block
  // adds its residual stream's gradient in the same pass.
  absl::Status RmsNormBackward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx,
                               Tensor& dw, const Tensor* add = nullptr);
  // y = silu(gate) * up, elementwise over equal shapes.
  absl::Status SwiGluForward(const Tensor& gate, const Tensor& up, Tensor& y);
  // dgate, dup from dy; with `y`, also y = silu(gate) * up again (bit for bit the forward's;
  // y may be dy itself: a model that did not keep the forward's y rebuilds it in place).
  absl::Status SwiGluBackward(const Tensor& dy, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup,
                              Tensor* y = nullptr);
  // c = alpha * op(a) @ op(b) + beta * c, row-major 2-D; op transposes when t* is set.
  // f32 x f32 -> f32, or bf16 x bf16 -> bf16 or f32 (weight gradients accumulated into
  // f32 main gradients), with f32 accumulation. With c_in (c's shape and dtype; c is then
  // only written): c = alpha * op(a) @ op(b) + beta * c_in — a residual added in the GEMM.
  absl::Status Gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha = 1.f, float beta = 0.f,
                    const Tensor* c_in = nullptr);
  // Independent GEMMs c = op(a) @ op(b), each as Gemm computes it alone: no call's c
  // overlaps another call's a, b or c. One after another, or at once where the backend
  // can — CUDA: up to three of at most 128 rows, on side streams forked from its stream and
  // joined back, each with a cuBLASLt workspace of its own (a decode step's q, k and v
  // projections, which alone leave most of the GPU idle). Every call is checked before any
  // runs.
  struct GemmCall {
    const Tensor* a = nullptr;
    bool ta = false;
    const Tensor* b = nullptr;
    bool tb = false;
    Tensor* c = nullptr;
  };
  absl::Status Gemms(absl::Span<const GemmCall> calls);
  // Vocab-parallel embedding: table [rows, hidden] holds ids [vocab_start, vocab_start+rows);
  // ids [n] i32; out [n, hidden] (zeros for ids outside the shard); dtable f32 [rows, hidden].
  absl::Status EmbeddingForward(const Tensor& ids, const Tensor& table, int64_t vocab_start, Tensor& out);
  absl::Status EmbeddingBackward(const Tensor& ids, const Tensor& dout, int64_t vocab_start, Tensor& dtable);
  // RoPE on x [tokens, heads, dim] with positions [tokens] i32 (kernels/rope): inv_freq,
  // on the host, holds dim / 2 frequencies and scale multiplies cos and sin
  // (common/model/rope.h makes both); inverse rotates back (the backward).
  absl::Status Rope(const Tensor& x, const Tensor& positions, absl::Span<const float> inv_freq, float scale, Tensor& y,
                    bool inverse = false);
  // Cross-entropy partials over a vocab shard (see kernels/cross_entropy): logits [n, v],
  // targets [n] i32 (global ids); max, sum, dot, tgt: f32 [n].
  absl::Status CrossEntropyPartials(const Tensor& logits, const Tensor& targets, int64_t vocab_start, Tensor& max,
                                    Tensor& sum, Tensor& dot, Tensor& tgt);
  // From whole-vocabulary partials (max, sum, tgt f32 [n]; targets [n] i32): lse and
  // dloss (f32 [n]: scale where the target is >= 0, else 0) for CrossEntropyBackward, and
  // loss_sum (f32 [1]) += the sum of lse - tgt over the counted tokens (kernels/cross_entropy).
  absl::Status CrossEntropyLoss(const Tensor& max, const Tensor& sum, const Tensor& tgt, const Tensor& targets,
                                float scale, Tensor& lse, Tensor& dloss, Tensor& loss_sum);
  // A vocab shard's partial sum rescaled to the all-reduced max: sum *= exp(max - global_max)
  // (all f32 [n]), before the sums are all-reduced.
  absl::Status CrossEntropyRescale(const Tensor& max, const Tensor& global_max, Tensor& sum);
  // dlogits = dloss * (softmax(logits; lse) - onehot(target)); lse, dloss: f32 [n].
  // With dentropy and entropy (f32 [n]: dL/dH and H per token, H the entropy of the whole
  // vocabulary's softmax) also the entropy's term: - dentropy * p * (log p + H).
  absl::Status CrossEntropyBackward(const Tensor& logits, const Tensor& targets, int64_t vocab_start, const Tensor& lse,
                                    const Tensor& dloss, Tensor& dlogits, const Tensor* dentropy = nullptr,
                                    const Tensor* entropy = nullptr);
  // Varlen attention (see kernels/attention): q [T, Hq, D], k/v [T, Hkv, D], cu_seqlens
  // [B+1] i32 on this device or on the host; out like q; lse f32 [T, Hq]. cu_seqlens is
  // checked (0, strictly increasing, ending at T): in place when it is a host tensor (then
  // nothing waits for the device: pass host cu_seqlens on hot paths), else after a small
  // device-to-host copy that waits for the stream.
  absl::Status AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens, bool causal,
                                Tensor& out, Tensor& lse);
  absl::Status AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_seqlens, bool causal,
                                 const Tensor& out, const Tensor& dout, const Tensor& lse, Tensor& dq, Tensor& dk,
                                 Tensor& dv);
  // Readies the forward for `batch` sequences of `seq` tokens each (q_heads, kv_heads,
  // head_dim, causal, dtype as AttentionForward would see them) without computing: on
  // CUDA, builds the cuDNN plan the forward would use, which loads kernels and may wait
  // for the device to drain — call it where no collective is in flight (the trainer: at
  // a step's start). Elsewhere a no-op. INVALID_ARGUMENT for non-positive sizes.
  absl::Status PrepareAttention(int64_t batch, int64_t seq, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                                bool causal, DType dtype);
  // Which implementation serves the CUDA attention forward (kernels::AttentionEngine; auto
  // by default, which needs host cu_seqlens to see that all sequences have one length).
  // Benchmarks and tests force one; the CPU ignores it.
  void set_attention_engine(kernels::AttentionEngine e) { attention_engine_ = e; }

  // Timing marks (a pipeline's busy time and bubble): Mark() notes where the backend's
  // stream is now — a CUDA event on the GPU, the host clock on the CPU (where ops run as
  // they are called) — and returns its id; Seconds(a, b) is the time from mark a to mark
  // b (on the GPU it waits for b); ClearMarks() forgets them all (ids start again at 0).
  virtual absl::StatusOr<int> Mark();
  virtual absl::StatusOr<double> Seconds(int a, int b);
  virtual void ClearMarks() { host_marks_.clear(); }
  kernels::AttentionEngine attention_engine() const { return attention_engine_; }
  // Ring attention's merge (kernels/attention): out/lse hold a partial attention over
  // some keys, out_b/lse_b another block's; afterwards out/lse are the attention over
  // both. out, out_b [T, H, D] of one float dtype; lse, lse_b [T, H] f32.
  absl::Status AttentionMerge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b);
  // Decode attention over a paged KV cache (kernels/paged_attention): q [B, Hq, D],
  // k_cache/v_cache [blocks, block_size, Hkv, D], block_tables [B, max_blocks] i32,
  // context_lens [B] i32, both on this device or on the host; out like q; lse f32 [B, Hq].
  // Tables and lengths are checked against the cache: in place when on the host (nothing
  // waits for the device: the rollout engine's path), else after a device-to-host copy.
  absl::Status PagedAttention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_tables,
                              const Tensor& context_lens, Tensor& out, Tensor& lse);
  // Writes the keys and values of new tokens into a paged cache (prefill and decode):
  // k, v [tokens, kv_heads, dim]; slots [tokens] i32 (block * block_size + offset; on this
  // device or the host, distinct); k_cache, v_cache [blocks, block_size, kv_heads, dim] of
  // k's dtype.
  absl::Status KvCacheWrite(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache, Tensor& v_cache);
  // The linear layers of a decode step over few rows (kernels/decode/decode_linear.h), in
  // one pass over the weights: for each part, y = op(x) @ w^T (+ bias) (+ residual), where
  // op(x) = x, or RMSNorm(x; norm, eps) rounded to x's dtype when `norm` is given; with
  // `swiglu` (two parts, gate and up, of one shape) parts[0].y = silu(x @ gate^T) * (x @ up^T)
  // (parts[1].y unused). x [m, k]; w [n, k]; bias [n] or null; y and residual [m, n]
  // (residual with one part only); all of x's dtype. Only for sizes DecodeLinearSupported
  // takes (the same rows bound on every backend, so the CPU runs the GPU's path).
  struct LinearPart {
    const Tensor* w = nullptr;
    const Tensor* bias = nullptr;
    Tensor* y = nullptr;
  };
  absl::Status DecodeLinear(const Tensor& x, const Tensor* norm, float eps, absl::Span<const LinearPart> parts,
                            const Tensor* residual, bool swiglu);
  // CPU: f32 or bf16, rows <= kernels::kDecodeMaxRows. CUDA: kernels::DecodeLinearCudaSupported.
  virtual bool DecodeLinearSupported(int64_t rows, int64_t k, DType t) const {
    return (t == DType::kF32 || t == DType::kBF16) && rows >= 1 && rows <= kernels::kDecodeMaxRows;
  }
  // What follows the q/k/v projection of a generation step, in one pass
  // (kernels/decode/qk_rope_cache.h): each q and k head RMS-normalized by q_norm / k_norm
  // (both or neither) and rotated by RoPE at `positions` (as Rope: inv_freq on the host),
  // the queries into q_out, the keys and values into the paged cache at `slots` (as
  // KvCacheWrite; the slots are checked as it checks them) and, with k_out, the rotated keys
  // there too (a prefill's attention). q, q_out [t, hq, d]; k, v, k_out [t, hkv, d];
  // positions, slots i32 [t]; k_cache, v_cache [blocks, block_size, hkv, d].
  absl::Status QkRopeCache(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions, const Tensor& slots,
                           const Tensor* q_norm, const Tensor* k_norm, float eps, absl::Span<const float> inv_freq,
                           float scale, Tensor& q_out, Tensor& k_cache, Tensor& v_cache, Tensor* k_out = nullptr);
  // A decode step's QkRopeCache and PagedAttention in one (CUDA: one kernel, the q/k pass
  // inside the attention), for rows that are distinct sequences each attending to its cache
  // and its new token, the last of its context: slots[i] must be the slot of token
  // context_lens[i] - 1 (checked with the indices, as those ops check theirs), and no row's
  // context may hold another row's new slot (the caller's: a rollout's decode-only step).
  // Arguments as those two ops take them (q, k, v the raw projections; block_tables and
  // context_lens as PagedAttention's); q_out is scratch for a backend that runs the two
  // ops: its contents afterwards are unspecified. out and lse, and the cache, equal those
  // of QkRopeCache then PagedAttention. `warm`: the leading bytes of up to
  // kernels::kMaxL2Warm tensors on this device that the kernels after this one read (the
  // next projections' weights) and that nothing writes until then; the CUDA kernel
  // prefetches them into L2 while it runs (kernels/paged_attention), the CPU ignores them.
  // A hint that changes no result; each range is checked (bytes from 0 to the tensor's).
  struct Warm {
    const Tensor* t = nullptr;
    int64_t bytes = 0;
  };
  absl::Status DecodeAttention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions, const Tensor& slots,
                               const Tensor* q_norm, const Tensor* k_norm, float eps, absl::Span<const float> inv_freq,
                               float scale, Tensor& q_out, Tensor& k_cache, Tensor& v_cache, const Tensor& block_tables,
                               const Tensor& context_lens, Tensor& out, Tensor& lse, absl::Span<const Warm> warm = {});
  // How many bytes of the next kernels' weights a decode step's attention should warm
  // into L2 (DecodeAttention's `warm`): a share of the device's L2 (CUDA), 0 where there is
  // nothing to warm (CPU). TESSERA_DECODE_L2_WARM_PCT sets the share (percent of L2; 0,
  // no warming, by default: it has not yet been timed against running without it).
  virtual int64_t DecodeWarmBytes() const { return 0; }
  // out[i] = src[i] >= 0 ? from[src[i]] : values[i], all i32 (src, values, out [n]; from
  // [m]): a generation step's tokens, each either sampled by the step before and still on
  // the device, or known on the host. src is checked (every entry -1 or an index of from)
  // as index tensors are: in place on the host, else read back unless trusted.
  absl::Status Select(const Tensor& src, const Tensor& from, const Tensor& values, Tensor& out);
  // Per-row sampling (kernels/sampling): logits [n, v]; temperature f32 [n] (0 = greedy),
  // top_k i32 [n] (0 = all), top_p f32 [n] (1 = all), seed and offset i64 [n] (used as
  // unsigned); token i32 [n], logprob f32 [n].
  absl::Status Sample(const Tensor& logits, const Tensor& temperature, const Tensor& top_k, const Tensor& top_p,
                      const Tensor& seed, const Tensor& offset, Tensor& token, Tensor& logprob);
  // out (f32 [1]) += sum(x^2); x *= s.
  absl::Status SumSquares(const Tensor& x, Tensor& out);
  absl::Status Scale(Tensor& x, float s);
  // y = alpha * x + beta * y over equal shapes; x, y f32 or bf16 independently (residual
  // adds; bf16 gradients accumulated into f32). beta == 0 writes y without reading it.
  absl::Status Axpby(float alpha, const Tensor& x, float beta, Tensor& y);
  // Fused AdamW on f32 master params and state; grad f32 or bf16. If param_lowp is
  // given (bf16, same shape) it receives the updated params.
  absl::Status AdamW(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p,
                     Tensor* param_lowp = nullptr);

 private:
  // The checks of QkRopeCache (the kernel's arguments) and of PagedAttention.
  absl::StatusOr<kernels::QkRopeCacheArgs> QkRopeCacheArgsOf(const Tensor& q, const Tensor& k, const Tensor& v,
                                                             const Tensor& positions, const Tensor& slots, const Tensor* q_norm,
                                                             const Tensor* k_norm, float eps, absl::Span<const float> inv_freq,
                                                             float scale, Tensor& q_out, Tensor& k_cache, Tensor& v_cache,
                                                             Tensor* k_out);
  absl::Status CheckPagedAttention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& block_tables,
                                   const Tensor& context_lens, const Tensor& out, const Tensor& lse);

 protected:
  kernels::AttentionEngine attention_engine_ = kernels::AttentionEngine::kAuto;
  bool trust_device_indices_ = false;
  std::vector<std::chrono::steady_clock::time_point> host_marks_;

  virtual absl::Status DoCast(const Tensor& x, Tensor& y) = 0;
  // `rows` rows of `row_bytes` each, the rows `src_pitch` / `dst_pitch` bytes apart.
  virtual absl::Status DoCopy2D(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t row_bytes,
                                int64_t rows) = 0;
  virtual absl::Status DoRmsNormForward(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd) = 0;
  virtual absl::Status DoRmsNormBackward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                         Tensor& dx, Tensor& dw, const Tensor* add) = 0;
  virtual absl::Status DoSwiGluForward(const Tensor& gate, const Tensor& up, Tensor& y) = 0;
  virtual absl::Status DoSwiGluBackward(const Tensor& dy, const Tensor& gate, const Tensor& up, Tensor& dgate,
                                        Tensor& dup, Tensor* y) = 0;
  virtual absl::Status DoGemm(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha, float beta,
                              const Tensor* c_in) = 0;
  // Checked calls; the default runs them one after another.
  virtual absl::Status DoGemms(absl::Span<const GemmCall> calls);
  virtual absl::Status DoEmbeddingForward(const Tensor& ids, const Tensor& table, int64_t vocab_start, Tensor& out) = 0;
  virtual absl::Status DoEmbeddingBackward(const Tensor& ids, const Tensor& dout, int64_t vocab_start, Tensor& dtable) = 0;
  virtual absl::Status DoRope(const Tensor& x, const Tensor& positions, const float* inv_freq, float scale, Tensor& y,
                              float sign) = 0;
  virtual absl::Status DoCrossEntropyPartials(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                              Tensor& max, Tensor& sum, Tensor& dot, Tensor& tgt) = 0;
  virtual absl::Status DoCrossEntropyRescale(const Tensor& max, const Tensor& global_max, Tensor& sum) = 0;
  virtual absl::Status DoCrossEntropyLoss(const Tensor& max, const Tensor& sum, const Tensor& tgt, const Tensor& targets,
                                          float scale, Tensor& lse, Tensor& dloss, Tensor& loss_sum) = 0;
  virtual absl::Status DoCrossEntropyBackward(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                              const Tensor& lse, const Tensor& dloss, Tensor& dlogits,
                                              const Tensor* dentropy, const Tensor* entropy) = 0;
  virtual absl::Status DoAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu,
                                          bool causal, Tensor& out, Tensor& lse) = 0;
  virtual absl::Status DoAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu,
                                           bool causal, const Tensor& out, const Tensor& dout, const Tensor& lse,
                                           Tensor& dq, Tensor& dk, Tensor& dv) = 0;
  virtual absl::Status DoAttentionMerge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) = 0;
  virtual absl::Status DoPrepareAttention(int64_t /*batch*/, int64_t /*seq*/, int64_t /*q_heads*/, int64_t /*kv_heads*/,
                                          int64_t /*head_dim*/, bool /*causal*/, DType /*dtype*/) {
    return absl::OkStatus();
  }
  virtual absl::Status DoPagedAttention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                                        const Tensor& block_tables, const Tensor& context_lens, Tensor& out,
                                        Tensor& lse) = 0;
  virtual absl::Status DoKvCacheWrite(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& k_cache,
                                      Tensor& v_cache) = 0;
  virtual absl::Status DoSelect(const Tensor& src, const Tensor& from, const Tensor& values, Tensor& out) = 0;
  virtual absl::Status DoDecodeLinear(const kernels::DecodeLinearArgs& a, DType t) = 0;
  virtual absl::Status DoQkRopeCache(const kernels::QkRopeCacheArgs& a, DType t, const Tensor& positions,
                                     const Tensor& slots) = 0;
  // Default: the two ops, QkRopeCache's output into q_out.
  virtual absl::Status DoDecodeAttention(const kernels::QkRopeCacheArgs& a, DType t, const Tensor& positions, const Tensor& slots,
                                         const Tensor& q_out, const Tensor& k_cache, const Tensor& v_cache,
                                         const Tensor& block_tables, const Tensor& context_lens, Tensor& out, Tensor& lse,
                                         absl::Span<const kernels::L2Range> warm) {
    (void)warm;  // a hint for a fused kernel
    if (auto st = DoQkRopeCache(a, t, positions, slots); !st.ok()) return st;
    return DoPagedAttention(q_out, k_cache, v_cache, block_tables, context_lens, out, lse);
  }
  virtual absl::Status DoSample(const Tensor& logits, const Tensor& temperature, const Tensor& top_k, const Tensor& top_p,
                                const Tensor& seed, const Tensor& offset, Tensor& token, Tensor& logprob) = 0;
  virtual absl::Status DoSumSquares(const Tensor& x, Tensor& out) = 0;
  virtual absl::Status DoScale(Tensor& x, float s) = 0;
  virtual absl::Status DoAxpby(float alpha, const Tensor& x, float beta, Tensor& y) = 0;
  virtual absl::Status DoAdamW(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p,
                               Tensor* param_lowp) = 0;
};

std::unique_ptr<Backend> MakeCpuBackend();
// UNIMPLEMENTED in a build without CUDA; UNAVAILABLE without a usable device.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(int device);
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(Device d);

}  // namespace tessera::runtime
