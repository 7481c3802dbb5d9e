#include "common/plan/plan.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tessera::plan {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes one micro-batch's forward keeps per layer, and the peak of a layer's backward
// temporaries (locals of Llama::LayerForward / LayerBackward), activations of `a` bytes
// (f32 or bf16), the statistics (RMSNorm rstd, attention lse) f32.
struct LayerBytes {
  int64_t saved = 0, backward = 0, input = 0;
};
LayerBytes Layer(const model::LlamaConfig& c, const parallel::Layout& l, int64_t t, int64_t tl, int64_t a,
                 bool recompute_swiglu) {
  const int64_t h = c.hidden, d = c.HeadDim(), hq = c.heads / l.tp, hkv = c.LocalKvHeads(l.tp), f = c.ffn / l.tp;
  const bool sp = l.sp && l.tp > 1;
  LayerBytes b;
  b.input = a * tl * h;
  // gate, up and (unless recompute_swiglu) the SwiGLU output: `kept_ffn` [t, f] each.
  const int64_t kept_ffn = recompute_swiglu ? 2 : 3;
  b.saved = a * (4 * tl * h + (sp ? 2 * t * h : 0) + t * (2 * hq * d + 2 * hkv * d) + kept_ffn * t * f) + 4 * (2 * tl + t * hq);
  b.backward = a * (3 * t * f + t * h + 2 * tl * h + (l.tp > 1 ? t * h : 0) + t * hq * d + t * (hq + 2 * hkv) * d +
                    t * (hq + hkv) * d);
  return b;
}

}  // namespace

int64_t HeadLogitRows(const model::LlamaConfig& c, const parallel::Layout& l, int64_t tokens) {
  if (c.value_head) return 0;  // one value per token
  const int64_t v = std::max<int64_t>(1, c.vocab / std::max(1, l.tp));
  return std::min(tokens, std::max<int64_t>(1, model::kHeadChunkElements / v));
}

int64_t ForwardPassBytes(const model::LlamaConfig& c, const parallel::Layout& l, int64_t tokens) {
  const int64_t a = tessera::DTypeSize(c.dtype), h = c.hidden;
  const LayerBytes lb = Layer(c, l, tokens, tokens, a, false);
  const int64_t head = a * (2 * HeadLogitRows(c, l, tokens) * (c.vocab / std::max(1, l.tp)) + 2 * tokens * h) + 4 * 8 * tokens;
  return std::max(lb.saved + 2 * lb.input, head + lb.input);
}

// One pipeline stage's plan (the whole model when pp = 1).
absl::StatusOr<Plan> PlanStage(const PlanInput& in, int stage) {
  const model::LlamaConfig& c = in.config;
  const parallel::Layout& l = in.layout;
  TESSERA_RETURN_IF_ERROR(c.Validate());
  TESSERA_RETURN_IF_ERROR(c.ValidateTensorParallel(l.tp));
  parallel::ModelShape shape{static_cast<int>(c.layers), static_cast<int>(c.heads),        static_cast<int>(c.kv_heads),
                             static_cast<int>(c.vocab),  static_cast<int>(in.seq_len),     static_cast<int>(in.global_batch),
                             static_cast<int>(in.micro_batch)};
  TESSERA_RETURN_IF_ERROR(parallel::ValidateLayout(l, l.world(), shape));
  if (in.seq_len <= 0 || in.micro_batch <= 0 || in.global_batch <= 0)
    return absl::InvalidArgumentError("plan: seq_len, micro_batch and global_batch are required");
  Plan p;
  p.input = in;
  p.stage = stage;
  const int dp = l.dp * l.cp, zero = dp > 1 ? l.zero : 0;
  const bool last = stage == l.pp - 1;
  const model::StageSpec stage_spec{l.pp, stage, l.vpp, l.last_stage_layers, l.stage_layers};
  int64_t per_chunk = 0;  // this rank's largest chunk (the split may be uneven)
  for (int k = 0; k < l.vpp; ++k) {
    const auto [b, e] = model::ChunkLayers(c, stage_spec, k);
    per_chunk = std::max(per_chunk, e - b);
  }
  // This rank's parameters: the TP shard; ZeRO slices of every tensor.
  int64_t shard = 0, padded = 0, largest_block = 0, block = 0;
  std::string block_prefix;
  for (const auto& s : model::LlamaParamSpecs(c)) {
    if (!model::StageHolds(s.name, c, stage_spec)) continue;
    int64_t n = 1;
    for (int64_t x : s.shape) n *= x;
    if (s.shard_dim >= 0) n /= model::TpSplitOf(s, l.tp, 0).parts;
    p.params_per_rank += n;
    shard += CeilDiv(n, dp);
    padded += CeilDiv(n, dp) * dp;
    // Blocks: the embedding, each layer, the head (ZeRO-2/3 hold one or two at a time).
    const std::string prefix = s.name.rfind("model.layers.", 0) == 0 ? s.name.substr(0, s.name.find('.', 13)) : s.name;
    if (prefix != block_prefix) block = 0, block_prefix = prefix;
    block += n;
    largest_block = std::max(largest_block, block);
  }
  const int64_t P = p.params_per_rank;
  RankMemory& m = p.memory;
  // Activations' bytes; bf16 adds a compute copy of every present parameter.
  const int64_t a = tessera::DTypeSize(c.dtype), copy = c.dtype == tessera::DType::kF32 ? 0 : a;
  // Model states (engine::Trainer). Parameters — ZeRO-3: the f32 slice (+ its bf16 copy,
  // which is what gets gathered) and the gathered block and the next (f32 values, or bf16
  // compute copies under mixed precision); ZeRO-1/2 under mixed precision: the f32 slice
  // and the whole compute copy (padded where a parameter does not split evenly); else
  // the whole values (+ their compute copies).
  const bool sliced = zero == 3 || (zero >= 1 && copy > 0);
  m.params = zero == 3  ? (4 + copy) * shard + a * 2 * largest_block
             : sliced   ? 4 * shard + copy * padded
                        : (4 + copy) * P;
  // Gradients (f32) — ZeRO-2/3: the reduced slice and one block's buffer; ZeRO-1: the
  // whole gradient, padded (reduce-scattered in place); else the whole gradient.
  m.grads = zero >= 2 ? 4 * (shard + largest_block) : zero == 1 ? 4 * padded : 4 * P;
  // AdamW's m and v: the slice with ZeRO.
  m.optimizer = 8 * (zero >= 1 ? shard : P);
  m.block_buffers = zero >= 2 ? 4 * largest_block + (zero == 3 ? a * 2 * largest_block : 0) : 0;
  // Activations of one micro-batch.
  const int64_t t = in.micro_batch * in.seq_len / l.cp, tl = l.sp && l.tp > 1 ? t / l.tp : t;
  const LayerBytes lb = Layer(c, l, t, tl, a, in.recompute_swiglu);
  const int64_t v = c.vocab / l.tp, h = c.hidden;
  // On top of what the layers keep, the larger of the LM head's backward (logits, their
  // gradient, the norms' tensors, the CE partials) and a layer's backward (with the
  // running gradient and the head's kept norm input).
  const int64_t head = last ? a * (2 * HeadLogitRows(c, l, t) * v + 3 * tl * h + 2 * t * h) + 4 * 8 * t : 0;
  const int64_t extra = std::max(head, lb.backward + a * 2 * t * h);
  // Chunk passes whose activations are held at once: one without a pipeline; the
  // schedule's most forwards in flight with one (GPipe: all).
  const int64_t micro = in.global_batch / (in.micro_batch * l.dp);
  int64_t in_flight = 1;
  if (l.pp > 1) {
    if (in.schedule == parallel::Schedule::kGPipe) in_flight = micro * l.vpp;
    else if (l.vpp == 1) in_flight = std::min<int64_t>(l.pp - stage, micro);
    else in_flight = std::min<int64_t>(int64_t(l.pp - stage - 1) * 2 + int64_t(l.vpp - 1) * l.pp + 1, micro * l.vpp);
  }
  const int64_t kept = in.recompute ? in_flight * per_chunk * lb.input + lb.saved : in_flight * per_chunk * lb.saved;
  m.activations = kept + extra;
  // Communication per step.
  auto ring = [](int n) { return n > 1 ? double(n - 1) / n : 0.0; };
  if (l.tp > 1) {
    // Per layer two collectives of [T, h] forward and two backward (all-reduce, or an
    // all-gather + reduce-scatter pair each under SP), the embedding's and the head's.
    const double per = l.sp ? ring(l.tp) : 2 * ring(l.tp);
    p.comm.tp = micro * (4.0 * c.layers + 4) * double(a) * t * h * per;
  }
  if (l.cp > 1) {  // K/V round the ring forward; K/V and dK/dV backward, one more hop for dK/dV
    const double kv = double(a) * t * 2 * c.LocalKvHeads(l.tp) * c.HeadDim();
    p.comm.cp = micro * c.layers * (kv * (l.cp - 1) * (in.recompute ? 2 : 1) + 2 * kv * (l.cp - 1) + kv);
  }
  if (l.pp > 1)  // each chunk pass sends its output forward and its input's gradient back
    p.comm.pp = 2.0 * micro * l.vpp * double(a) * tl * h;
  if (dp > 1) {
    const double g = 4.0 * P;
    switch (zero) {
      case 0: p.comm.dp = g * 2 * ring(dp); break;
      // reduce-scatter + all-gather (of the bf16 compute copies under mixed precision)
      case 1: p.comm.dp = (g + (copy > 0 ? double(copy) * P : g)) * ring(dp); break;
      // a reduce-scatter per micro-batch, then the all-gather as ZeRO-1's
      case 2: p.comm.dp = (micro * g + (copy > 0 ? double(copy) * P : g)) * ring(dp); break;
      default: p.comm.dp = micro * (in.recompute ? 4 : 3) * g * ring(dp);  // gather fwd + bwd (+ recompute), scatter
    }
  }
  return p;
}

absl::StatusOr<Plan> PlanTraining(const PlanInput& in) {
  Plan worst;
  for (int s = 0; s < std::max(1, in.layout.pp); ++s) {
    TESSERA_ASSIGN_OR_RETURN(Plan p, PlanStage(in, s));
    if (s == 0 || p.memory.total() > worst.memory.total()) worst = p;
  }
  return worst;
}

absl::StatusOr<StageBalance> BalanceStages(const PlanInput& in) {
  const model::LlamaConfig& c = in.config;
  const parallel::Layout& l = in.layout;
  if (l.pp < 2) return absl::InvalidArgumentError("plan: stage balance needs a pipeline (pp >= 2)");
  TESSERA_RETURN_IF_ERROR(c.Validate());
  TESSERA_RETURN_IF_ERROR(parallel::CheckLayerSplit(c.layers, l.pp, l.vpp, l.last_stage_layers, l.stage_layers));
  const int stages = l.pp * l.vpp;
  const double tokens = double(in.micro_batch) * in.seq_len;
  const parallel::StageCosts per_token =
      parallel::LlamaStageCosts(c.hidden, c.heads, c.kv_heads, c.HeadDim(), c.ffn, c.vocab, in.seq_len);
  const double layer = tokens * per_token.layer, head = tokens * per_token.head;
  auto per_rank = [&](const std::vector<int>& counts) {
    std::vector<double> r(l.pp, 0.0);
    for (int v = 0; v < stages; ++v) r[v % l.pp] += counts[v] * layer + (v == stages - 1 ? head : 0.0);
    return r;
  };
  StageBalance out;
  for (int v = 0; v < stages; ++v) {
    const auto [b, e] = parallel::VirtualStageLayers(c.layers, stages, l.last_stage_layers, l.stage_layers, v);
    out.layers.push_back(static_cast<int>(e - b));
  }
  out.rank_flops = per_rank(out.layers);
  out.balanced = parallel::BalancedStageLayers(c.layers, l.pp, l.vpp, per_token);
  out.balanced_flops = per_rank(out.balanced);
  return out;
}

std::vector<Plan> ProposeLayouts(const PlanInput& base, int devices, int64_t memory_bytes) {
  std::vector<Plan> out;
  for (int tp = 1; tp <= devices; ++tp)
    for (int cp = 1; tp * cp <= devices; ++cp)
      for (int pp = 1; tp * cp * pp <= devices; ++pp) {
        if (devices % (tp * cp * pp) != 0) continue;
      const int dp = devices / (tp * cp * pp);
      for (int zero = 0; zero <= (dp * cp > 1 ? 3 : 0); ++zero)
        for (bool recompute : {false, true}) {
          PlanInput in = base;
          in.layout = parallel::Layout{tp, cp, dp, pp, 1, tp > 1, zero};
          in.recompute = recompute;
          auto p = PlanTraining(in);
          if (p.ok() && p->memory.total() <= memory_bytes) out.push_back(*p);
        }
      }
  std::stable_sort(out.begin(), out.end(), [](const Plan& a, const Plan& b) {
    if (a.input.recompute != b.input.recompute) return !a.input.recompute;
    if (a.input.layout.zero != b.input.layout.zero) return a.input.layout.zero < b.input.layout.zero;
    return a.comm.total() < b.comm.total();
  });
  return out;
}

}  // namespace tessera::plan
