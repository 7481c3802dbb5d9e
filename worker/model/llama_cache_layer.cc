// One decoder layer's forward over a KV cache (the Generator's steps): a step's rows are
// first the tokens of fresh sequences (prefill: nothing of them is cached yet; they
// attend to each other, varlen) and then rows that attend to the cache through block
// tables (decode steps, and prompt chunks after the first). Every row's keys and values
// go to the cache in the pass that rotates them (Backend::QkRopeCache), or, in a decode-only
// step, within the attention (Backend::DecodeAttention). Few rows (a decode
// step of a small batch) take the fused decode linears (Backend::DecodeLinear): the input
// norm inside the q/k/v and gate/up passes, SwiGLU and the residual in their epilogues.
// No activations are kept.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/model/llama.h"
#include "worker/model/llama_internal.h"

namespace tessera::model {
using internal::AddBias;
using internal::New;
using runtime::Backend;
using runtime::Tensor;


// parts = {w, bias, y}; y_j = RMSNorm(x) w_j^T (+ bias_j), or with swiglu (gate, up) y_0 =
// silu(gate) * up: one fused pass where the backend takes the size, else the norm, the
// parts' GEMMs (one Backend::Gemms call: at once on CUDA), their biases through in.ones,
// and SwiGLU.
absl::Status Llama::NormedLinears(const Tensor& x, const Param& norm, absl::Span<const NormedPart> parts, bool swiglu,
                                  const Inputs& in) {
  Backend& b = *backend_;
  const int64_t t = x.dim(0);
  if (b.DecodeLinearSupported(t, x.dim(1), act_)) {
    std::vector<Backend::LinearPart> lp;
    for (const NormedPart& p : parts) lp.push_back({&p.w->weight(), p.bias != nullptr ? &p.bias->weight() : nullptr, p.y});
    return b.DecodeLinear(x, &norm.weight(), config_.norm_eps, lp, nullptr, swiglu);
  }
  TESSERA_ASSIGN_OR_RETURN(Tensor xn, New(b, {t, x.dim(1)}, act_));
  TESSERA_ASSIGN_OR_RETURN(Tensor rstd, New(b, {t}));
  TESSERA_RETURN_IF_ERROR(b.RmsNormForward(x, norm.weight(), config_.norm_eps, xn, rstd));
  // The parts' GEMMs are independent: one Gemms call (at once where the backend can).
  if (swiglu) {
    TESSERA_ASSIGN_OR_RETURN(Tensor gate, New(b, parts[0].y->shape(), act_));
    TESSERA_ASSIGN_OR_RETURN(Tensor up, New(b, parts[0].y->shape(), act_));
    const Backend::GemmCall g[2] = {{&xn, false, &parts[0].w->weight(), true, &gate}, {&xn, false, &parts[1].w->weight(), true, &up}};
    TESSERA_RETURN_IF_ERROR(b.Gemms(g));
    return b.SwiGluForward(gate, up, *parts[0].y);
  }
  Backend::GemmCall g[3];  // q, k, v at most: no allocation per layer
  if (parts.size() > 3) return absl::InvalidArgumentError(absl::StrCat("normed linears: ", parts.size(), " parts, at most 3"));
  for (size_t i = 0; i < parts.size(); ++i) g[i] = {&xn, false, &parts[i].w->weight(), true, parts[i].y};
  TESSERA_RETURN_IF_ERROR(b.Gemms({g, parts.size()}));
  for (const NormedPart& p : parts)
    if (p.bias != nullptr) TESSERA_RETURN_IF_ERROR(AddBias(b, in.ones, *p.bias, *p.y));
  return absl::OkStatus();
}

// A row-parallel projection and its residual: x w^T + residual (summed over TP first).
absl::StatusOr<Tensor> Llama::CacheRowParallel(const Tensor& x, const Param& w, const Tensor& residual) {
  Backend& b = *backend_;
  if (!b.DecodeLinearSupported(x.dim(0), x.dim(1), act_)) return RowParallelResidual(x, w.weight(), residual);
  TESSERA_ASSIGN_OR_RETURN(Tensor out, New(b, {x.dim(0), w.weight().dim(0)}, act_));
  const Backend::LinearPart part{&w.weight(), nullptr, &out};
  TESSERA_RETURN_IF_ERROR(b.DecodeLinear(x, nullptr, 0.f, {&part, 1}, tp_ == nullptr ? &residual : nullptr, false));
  if (tp_ == nullptr) return out;
  TESSERA_ASSIGN_OR_RETURN(Tensor sum, LeaveTp(out));
  TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, residual, 1.f, sum));
  return sum;
}

absl::Status Llama::CacheLayerForward(const LayerParams& w, const Inputs& in, const Tensor& x, Tensor& out,
                                      const CacheStep& kv) {
  Backend& b = *backend_;
  const LlamaConfig& c = config_;
  const int64_t t = x.dim(0), fresh = kv.fresh, d = c.HeadDim(), hq = c.heads / tp_size(),
                hkv = c.LocalKvHeads(tp_size());
  if (fresh < 0 || fresh > t || (fresh < t && kv.decode == nullptr))
    return absl::InvalidArgumentError(absl::StrCat("kv cache step: ", fresh, " fresh rows of ", t, ", the rest need block tables"));
  TESSERA_ASSIGN_OR_RETURN(Tensor q_lin, New(b, {t, hq * d}, act_));
  TESSERA_ASSIGN_OR_RETURN(Tensor k_lin, New(b, {t, hkv * d}, act_));
  TESSERA_ASSIGN_OR_RETURN(Tensor v_lin, New(b, {t, hkv * d}, act_));
  const NormedPart qkv[3] = {{w.wq, w.bq, &q_lin}, {w.wk, w.bk, &k_lin}, {w.wv, w.bv, &v_lin}};
  TESSERA_RETURN_IF_ERROR(NormedLinears(x, *w.norm1, qkv, false, in));
  TESSERA_ASSIGN_OR_RETURN(Tensor q3, q_lin.Reshape({t, hq, d}));
  TESSERA_ASSIGN_OR_RETURN(Tensor k3, k_lin.Reshape({t, hkv, d}));
  TESSERA_ASSIGN_OR_RETURN(Tensor v, v_lin.Reshape({t, hkv, d}));
  TESSERA_ASSIGN_OR_RETURN(Tensor q, New(b, {t, hq, d}, act_));
  Tensor k;  // the rotated keys of the fresh rows' attention
  if (fresh > 0) {
    TESSERA_ASSIGN_OR_RETURN(k, New(b, {t, hkv, d}, act_));
  }
  Tensor& kc = kv.cache->k[kv.layer];
  Tensor& vc = kv.cache->v[kv.layer];
  const Tensor* qn = c.qk_norm ? &w.qn->weight() : nullptr;
  const Tensor* kn = c.qk_norm ? &w.kn->weight() : nullptr;
  TESSERA_ASSIGN_OR_RETURN(Tensor o, New(b, {t, hq, d}, act_));
  TESSERA_ASSIGN_OR_RETURN(Tensor lse, New(b, {t, hq}));
  if (kv.decode_only && fresh == 0) {
    // While the attention runs (latency, not bytes) the next weights come into L2: o's,
    // then the first rows of gate and up alike (the order the MLP's pass reads them).
    Backend::Warm warm[3];
    int64_t budget = b.DecodeWarmBytes();
    size_t n_warm = 0;
    auto add = [&](const Tensor& t, int64_t bytes) {  // the leading bytes are the first rows
      bytes = std::min<int64_t>(bytes, int64_t(t.nbytes()));
      if (bytes > 0) warm[n_warm++] = {&t, bytes}, budget -= bytes;
    };
    if (budget > 0) {
      add(w.wo->weight(), budget);
      const int64_t half = budget / 2;
      add(w.wg->weight(), half);
      add(w.wu->weight(), half);
    }
    TESSERA_RETURN_IF_ERROR(b.DecodeAttention(q3, k3, v, in.positions, kv.slots, qn, kn, c.norm_eps, in.rope.inv_freq,
                                              in.rope.attention_scaling, q, kc, vc, kv.decode->tables, kv.decode->lens, o, lse,
                                              {warm, n_warm}));
    return CacheLayerTail(w, in, x, o, out);
  }
  TESSERA_RETURN_IF_ERROR(b.QkRopeCache(q3, k3, v, in.positions, kv.slots, qn, kn, c.norm_eps, in.rope.inv_freq,
                                        in.rope.attention_scaling, q, kc, vc, fresh > 0 ? &k : nullptr));
  auto rows = [](const Tensor& x, int64_t at, int64_t n) { return x.Slice(0, at, n); };
  if (fresh > 0) {
    TESSERA_ASSIGN_OR_RETURN(Tensor qf, rows(q, 0, fresh));
    TESSERA_ASSIGN_OR_RETURN(Tensor kf, rows(k, 0, fresh));
    TESSERA_ASSIGN_OR_RETURN(Tensor vf, rows(v, 0, fresh));
    TESSERA_ASSIGN_OR_RETURN(Tensor of, rows(o, 0, fresh));
    TESSERA_ASSIGN_OR_RETURN(Tensor lf, rows(lse, 0, fresh));
    TESSERA_RETURN_IF_ERROR(b.AttentionForward(qf, kf, vf, in.cu, /*causal=*/true, of, lf));
  }
  if (fresh < t) {
    TESSERA_ASSIGN_OR_RETURN(Tensor qp, rows(q, fresh, t - fresh));
    TESSERA_ASSIGN_OR_RETURN(Tensor op, rows(o, fresh, t - fresh));
    TESSERA_ASSIGN_OR_RETURN(Tensor lp, rows(lse, fresh, t - fresh));
    TESSERA_RETURN_IF_ERROR(b.PagedAttention(qp, kc, vc, kv.decode->tables, kv.decode->lens, op, lp));
  }
  return CacheLayerTail(w, in, x, o, out);
}

// The layer after its attention: o + residual, the MLP with its norm, down + residual.
absl::Status Llama::CacheLayerTail(const LayerParams& w, const Inputs& in, const Tensor& x, const Tensor& o, Tensor& out) {
  Backend& b = *backend_;
  const int64_t t = x.dim(0), ffn = config_.ffn / tp_size();
  TESSERA_ASSIGN_OR_RETURN(Tensor o2, o.Reshape({t, o.dim(1) * o.dim(2)}));
  TESSERA_ASSIGN_OR_RETURN(Tensor x_mid, CacheRowParallel(o2, *w.wo, x));
  TESSERA_ASSIGN_OR_RETURN(Tensor act, New(b, {t, ffn}, act_));
  const NormedPart mlp[2] = {{w.wg, nullptr, &act}, {w.wu, nullptr, nullptr}};
  TESSERA_RETURN_IF_ERROR(NormedLinears(x_mid, *w.norm2, mlp, /*swiglu=*/true, in));
  TESSERA_ASSIGN_OR_RETURN(out, CacheRowParallel(act, *w.wd, x_mid));
  return absl::OkStatus();
}

}  // namespace tessera::model
