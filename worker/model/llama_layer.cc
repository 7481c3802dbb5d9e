// One decoder layer's forward and backward (pre-norm attention and SwiGLU MLP, under any
// of TP, SP and CP) and the pieces they share. Split from llama.cc, which drives them.
#include "worker/model/context_parallel.h"
#include "worker/model/llama.h"
#include "worker/model/llama_internal.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace tessera::model {
using runtime::Backend;
using runtime::Tensor;

using internal::AddBias;
using internal::Linear;
using internal::LinearBackward;
using internal::New;

namespace {
// dbias [n] += column sums of dy [T, n].
absl::Status BiasBackward(Backend& b, const Tensor& ones, const Tensor& dy, Param& bias) {
  TESSERA_ASSIGN_OR_RETURN(Tensor row, bias.grad.Reshape({1, bias.grad.numel()}));
  return b.Gemm(ones, true, dy, false, row, 1.f, internal::GradBeta(bias));
}
}  // namespace

absl::StatusOr<Tensor> Llama::RowParallelResidual(const Tensor& x, const Tensor& w, const Tensor& residual) {
  Backend& b = *backend_;
  TESSERA_ASSIGN_OR_RETURN(Tensor partial, New(b, {x.dim(0), w.dim(0)}, act_));
  if (tp_ == nullptr) {  // no sum to wait for: the residual goes into the GEMM's epilogue
    TESSERA_RETURN_IF_ERROR(b.Gemm(x, false, w, true, partial, 1.f, 1.f, &residual));
    return partial;
  }
  TESSERA_RETURN_IF_ERROR(Linear(b, x, w, partial));
  TESSERA_ASSIGN_OR_RETURN(Tensor out, LeaveTp(partial));
  TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, residual, 1.f, out));
  return out;
}

// RMSNorm backward; the weight gradient is summed over TP under SP (each rank saw its
// own tokens) before it is accumulated.
absl::Status Llama::NormBackward(const Tensor& dy, const Tensor& x, Param& w, const Tensor& rstd, Tensor& dx,
                                 const Tensor* add) {
  Backend& b = *backend_;
  TESSERA_ASSIGN_OR_RETURN(Tensor dw, New(b, {w.weight().numel()}));
  TESSERA_RETURN_IF_ERROR(b.RmsNormBackward(dy, x, w.weight(), rstd, dx, dw, add));
  if (sp_) TESSERA_RETURN_IF_ERROR(AllReduce(dw));
  return b.Axpby(1.f, dw, internal::GradBeta(w), w.grad);
}

// x: this rank's tokens of the residual stream (all tokens without SP).
absl::Status Llama::LayerForward(const LayerParams& w, const Inputs& in, const Tensor& x, LayerActs& a, Tensor& out) {
  Backend& b = *backend_;
  const LlamaConfig& c = config_;
  const int64_t tl = x.dim(0), t = in.tokens.numel(), d = c.HeadDim(), hq = c.heads / tp_size(),
                hkv = c.LocalKvHeads(tp_size()), ffn = c.ffn / tp_size();
  a.x_in = x;
  TESSERA_ASSIGN_OR_RETURN(a.xn1, New(b, {tl, c.hidden}, act_));
  TESSERA_ASSIGN_OR_RETURN(a.rstd1, New(b, {tl}));
  TESSERA_RETURN_IF_ERROR(b.RmsNormForward(x, w.norm1->weight(), c.norm_eps, a.xn1, a.rstd1));
  TESSERA_ASSIGN_OR_RETURN(a.xn1_full, EnterTp(a.xn1));
  // Q, K, V projections (+ bias), then RoPE on Q and K.
  auto project = [&](const Param* wt, const Param* bias, int64_t heads, Tensor& lin) -> absl::Status {
    TESSERA_ASSIGN_OR_RETURN(lin, New(b, {t, heads * d}, act_));
    TESSERA_RETURN_IF_ERROR(Linear(b, a.xn1_full, wt->weight(), lin));
    if (bias != nullptr) TESSERA_RETURN_IF_ERROR(AddBias(b, in.ones, *bias, lin));
    TESSERA_ASSIGN_OR_RETURN(lin, lin.Reshape({t, heads, d}));
    return absl::OkStatus();
  };
  Tensor q_lin, k_lin;
  TESSERA_RETURN_IF_ERROR(project(w.wq, w.bq, hq, q_lin));
  TESSERA_RETURN_IF_ERROR(project(w.wk, w.bk, hkv, k_lin));
  TESSERA_RETURN_IF_ERROR(project(w.wv, w.bv, hkv, a.v));
  if (c.qk_norm) {  // Qwen3: RMSNorm over each head of q and k, before RoPE
    auto head_norm = [&](const Param& wn, Tensor& lin, Tensor& pre, Tensor& rstd) -> absl::Status {
      const int64_t rows = lin.dim(0) * lin.dim(1);
      pre = lin;
      TESSERA_ASSIGN_OR_RETURN(Tensor x2, lin.Reshape({rows, d}));
      TESSERA_ASSIGN_OR_RETURN(Tensor y2, New(b, {rows, d}, act_));
      TESSERA_ASSIGN_OR_RETURN(rstd, New(b, {rows}));
      TESSERA_RETURN_IF_ERROR(b.RmsNormForward(x2, wn.weight(), c.norm_eps, y2, rstd));
      TESSERA_ASSIGN_OR_RETURN(lin, y2.Reshape(lin.shape()));
      return absl::OkStatus();
    };
    TESSERA_RETURN_IF_ERROR(head_norm(*w.qn, q_lin, a.q_pre, a.rstd_q));
    TESSERA_RETURN_IF_ERROR(head_norm(*w.kn, k_lin, a.k_pre, a.rstd_k));
  }
  TESSERA_ASSIGN_OR_RETURN(a.q, New(b, {t, hq, d}, act_));
  TESSERA_ASSIGN_OR_RETURN(a.k, New(b, {t, hkv, d}, act_));
  TESSERA_RETURN_IF_ERROR(b.Rope(q_lin, in.positions, in.rope.inv_freq, in.rope.attention_scaling, a.q));
  TESSERA_RETURN_IF_ERROR(b.Rope(k_lin, in.positions, in.rope.inv_freq, in.rope.attention_scaling, a.k));
  TESSERA_ASSIGN_OR_RETURN(a.o, New(b, {t, hq, d}, act_));
  TESSERA_ASSIGN_OR_RETURN(a.lse, New(b, {t, hq}));
  if (cp_ != nullptr) {
    TESSERA_RETURN_IF_ERROR(RingAttentionForward(b, *cp_, a.q, a.k, a.v, in.cu_half, a.o, a.lse));
  } else {
    TESSERA_RETURN_IF_ERROR(b.AttentionForward(a.q, a.k, a.v, in.cu, /*causal=*/true, a.o, a.lse));
  }
  // Output projection (row-parallel: partial sums over this rank's heads) and the first residual.
  TESSERA_ASSIGN_OR_RETURN(Tensor o2, a.o.Reshape({t, hq * d}));
  TESSERA_ASSIGN_OR_RETURN(a.x_mid, RowParallelResidual(o2, w.wo->weight(), x));
  // MLP and the second residual.
  TESSERA_ASSIGN_OR_RETURN(a.xn2, New(b, {tl, c.hidden}, act_));
  TESSERA_ASSIGN_OR_RETURN(a.rstd2, New(b, {tl}));
  TESSERA_RETURN_IF_ERROR(b.RmsNormForward(a.x_mid, w.norm2->weight(), c.norm_eps, a.xn2, a.rstd2));
  TESSERA_ASSIGN_OR_RETURN(a.xn2_full, EnterTp(a.xn2));
  TESSERA_ASSIGN_OR_RETURN(a.gate, New(b, {t, ffn}, act_));
  TESSERA_ASSIGN_OR_RETURN(a.up, New(b, {t, ffn}, act_));
  TESSERA_ASSIGN_OR_RETURN(a.act, New(b, {t, ffn}, act_));
  TESSERA_RETURN_IF_ERROR(Linear(b, a.xn2_full, w.wg->weight(), a.gate));
  TESSERA_RETURN_IF_ERROR(Linear(b, a.xn2_full, w.wu->weight(), a.up));
  TESSERA_RETURN_IF_ERROR(b.SwiGluForward(a.gate, a.up, a.act));
  TESSERA_ASSIGN_OR_RETURN(out, RowParallelResidual(a.act, w.wd->weight(), a.x_mid));
  if (recompute_swiglu_) a.act = Tensor();  // rebuilt by the backward (set_recompute_swiglu)
  return absl::OkStatus();
}

// dx: the gradient of the layer's output on entry, of its input on return (this rank's
// tokens under SP).
absl::Status Llama::LayerBackward(LayerParams& w, const Inputs& in, const LayerActs& a, Tensor& dx) {
  Backend& b = *backend_;
  const LlamaConfig& c = config_;
  const int64_t t = in.tokens.numel(), d = c.HeadDim(), hq = c.heads / tp_size(), hkv = c.LocalKvHeads(tp_size()),
                ffn = c.ffn / tp_size();
  // MLP: out = x_mid + down(swiglu(gate(xn2), up(xn2))), xn2 = norm2(x_mid).
  TESSERA_ASSIGN_OR_RETURN(Tensor dmlp, EnterTp(dx));
  TESSERA_ASSIGN_OR_RETURN(Tensor dact, New(b, {t, ffn}, act_));
  TESSERA_ASSIGN_OR_RETURN(Tensor dgate, New(b, {t, ffn}, act_));
  TESSERA_ASSIGN_OR_RETURN(Tensor dup, New(b, {t, ffn}, act_));
  if (a.act.defined()) {
    TESSERA_RETURN_IF_ERROR(LinearBackward(b, dmlp, a.act, *w.wd, dact, 0.f));
    TESSERA_RETURN_IF_ERROR(b.SwiGluBackward(dact, a.gate, a.up, dgate, dup));
  } else {  // set_recompute_swiglu: the output rebuilt into dact's buffer once dact is read
    TESSERA_RETURN_IF_ERROR(b.Gemm(dmlp, false, w.wd->weight(), false, dact, 1.f, 0.f));
    TESSERA_RETURN_IF_ERROR(b.SwiGluBackward(dact, a.gate, a.up, dgate, dup, &dact));
    TESSERA_RETURN_IF_ERROR(b.Gemm(dmlp, true, dact, false, w.wd->grad, 1.f, internal::GradBeta(*w.wd)));
  }
  TESSERA_ASSIGN_OR_RETURN(Tensor dxn_full, New(b, {t, c.hidden}, act_));
  TESSERA_RETURN_IF_ERROR(LinearBackward(b, dgate, a.xn2_full, *w.wg, dxn_full, 0.f));
  TESSERA_RETURN_IF_ERROR(LinearBackward(b, dup, a.xn2_full, *w.wu, dxn_full, 1.f));
  TESSERA_ASSIGN_OR_RETURN(Tensor dxn, LeaveTp(dxn_full));  // column-parallel: partial input gradients
  TESSERA_RETURN_IF_ERROR(NormBackward(dxn, a.x_mid, *w.norm2, a.rstd2, dx, &dx));  // dx = d(x_mid)
  // Attention: x_mid = x_in + o_proj(attn(rope(q(xn1)), rope(k(xn1)), v(xn1))).
  TESSERA_ASSIGN_OR_RETURN(Tensor dattn, EnterTp(dx));
  TESSERA_ASSIGN_OR_RETURN(Tensor o2, a.o.Reshape({t, hq * d}));
  TESSERA_ASSIGN_OR_RETURN(Tensor do2, New(b, {t, hq * d}, act_));
  TESSERA_RETURN_IF_ERROR(LinearBackward(b, dattn, o2, *w.wo, do2, 0.f));
  TESSERA_ASSIGN_OR_RETURN(Tensor do3, do2.Reshape({t, hq, d}));
  TESSERA_ASSIGN_OR_RETURN(Tensor dq, New(b, {t, hq, d}, act_));
  TESSERA_ASSIGN_OR_RETURN(Tensor dk, New(b, {t, hkv, d}, act_));
  TESSERA_ASSIGN_OR_RETURN(Tensor dv, New(b, {t, hkv, d}, act_));
  if (cp_ != nullptr) {
    TESSERA_RETURN_IF_ERROR(RingAttentionBackward(b, *cp_, a.q, a.k, a.v, in.cu_half, a.o, do3, a.lse, dq, dk, dv));
  } else {
    TESSERA_RETURN_IF_ERROR(b.AttentionBackward(a.q, a.k, a.v, in.cu, true, a.o, do3, a.lse, dq, dk, dv));
  }
  // RoPE is a rotation: its backward rotates back; then each projection's gradients.
  TESSERA_ASSIGN_OR_RETURN(Tensor dq_lin, New(b, {t, hq, d}, act_));
  TESSERA_ASSIGN_OR_RETURN(Tensor dk_lin, New(b, {t, hkv, d}, act_));
  TESSERA_RETURN_IF_ERROR(b.Rope(dq, in.positions, in.rope.inv_freq, in.rope.attention_scaling, dq_lin, /*inverse=*/true));
  TESSERA_RETURN_IF_ERROR(b.Rope(dk, in.positions, in.rope.inv_freq, in.rope.attention_scaling, dk_lin, /*inverse=*/true));
  if (c.qk_norm) {  // through each head's RMSNorm; its weight is shared by the heads every TP rank holds a share of
    auto head_norm_backward = [&](Param& wn, const Tensor& pre, const Tensor& rstd, Tensor& dlin) -> absl::Status {
      const int64_t rows = pre.dim(0) * pre.dim(1);
      TESSERA_ASSIGN_OR_RETURN(Tensor dy, dlin.Reshape({rows, d}));
      TESSERA_ASSIGN_OR_RETURN(Tensor x2, pre.Reshape({rows, d}));
      TESSERA_ASSIGN_OR_RETURN(Tensor dx2, New(b, {rows, d}, act_));
      TESSERA_ASSIGN_OR_RETURN(Tensor dw, New(b, {d}));
      TESSERA_RETURN_IF_ERROR(b.RmsNormBackward(dy, x2, wn.weight(), rstd, dx2, dw));
      if (tp_ != nullptr) TESSERA_RETURN_IF_ERROR(AllReduce(dw));
      TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, dw, internal::GradBeta(wn), wn.grad));
      TESSERA_ASSIGN_OR_RETURN(dlin, dx2.Reshape(pre.shape()));
      return absl::OkStatus();
    };
    TESSERA_RETURN_IF_ERROR(head_norm_backward(*w.qn, a.q_pre, a.rstd_q, dq_lin));
    TESSERA_RETURN_IF_ERROR(head_norm_backward(*w.kn, a.k_pre, a.rstd_k, dk_lin));
  }
  TESSERA_ASSIGN_OR_RETURN(dq_lin, dq_lin.Reshape({t, hq * d}));
  TESSERA_ASSIGN_OR_RETURN(dk_lin, dk_lin.Reshape({t, hkv * d}));
  TESSERA_ASSIGN_OR_RETURN(Tensor dv_lin, dv.Reshape({t, hkv * d}));
  const bool kv_replicated = SplitOf(*w.wk).replicas > 1;
  if (c.qkv_bias) {
    TESSERA_RETURN_IF_ERROR(BiasBackward(b, in.ones, dq_lin, *w.bq));
    if (!kv_replicated) {
      TESSERA_RETURN_IF_ERROR(BiasBackward(b, in.ones, dk_lin, *w.bk));
      TESSERA_RETURN_IF_ERROR(BiasBackward(b, in.ones, dv_lin, *w.bv));
    }
  }
  TESSERA_RETURN_IF_ERROR(LinearBackward(b, dq_lin, a.xn1_full, *w.wq, dxn_full, 0.f));
  if (kv_replicated) {
    TESSERA_RETURN_IF_ERROR(ReplicatedKvBackward(w, in, dk_lin, dv_lin, a.xn1_full, dxn_full));
  } else {
    TESSERA_RETURN_IF_ERROR(LinearBackward(b, dk_lin, a.xn1_full, *w.wk, dxn_full, 1.f));
    TESSERA_RETURN_IF_ERROR(LinearBackward(b, dv_lin, a.xn1_full, *w.wv, dxn_full, 1.f));
  }
  TESSERA_ASSIGN_OR_RETURN(dxn, LeaveTp(dxn_full));
  return NormBackward(dxn, a.x_in, *w.norm1, a.rstd1, dx, &dx);  // dx = d(x_in)
}

absl::Status Llama::ReplicatedKvBackward(LayerParams& w, const Inputs& in, const Tensor& dk, const Tensor& dv,
                                         const Tensor& x, Tensor& dx) {
  Backend& b = *backend_;
  const TpSplit split = SplitOf(*w.wk);
  struct Piece {
    Param* p;
    const Tensor* dy;
    Tensor grad;  // this micro-batch's, in this rank's slot of the buffer
  };
  std::vector<Piece> pieces = {{w.wk, &dk, {}}, {w.wv, &dv, {}}};
  if (w.bk != nullptr) pieces.insert(pieces.end(), {{w.bk, &dk, {}}, {w.bv, &dv, {}}});
  int64_t m = 0;
  for (const Piece& p : pieces) m += p.p->grad.numel();
  TESSERA_ASSIGN_OR_RETURN(Tensor buf, New(b, {split.parts * m}));
  TESSERA_RETURN_IF_ERROR(b.Fill(buf, 0));
  int64_t off = split.index * m;
  for (Piece& p : pieces) {
    const int64_t n = p.p->grad.numel();
    TESSERA_ASSIGN_OR_RETURN(Tensor slot, buf.Slice(0, off, n));
    off += n;
    if (p.p->grad.rank() == 2) {  // a weight: dW = dy^T x, and dy W's share of the input gradient
      TESSERA_ASSIGN_OR_RETURN(p.grad, slot.Reshape(p.p->grad.shape()));
      TESSERA_RETURN_IF_ERROR(b.Gemm(*p.dy, true, x, false, p.grad, 1.f, 0.f));
      TESSERA_RETURN_IF_ERROR(b.Gemm(*p.dy, false, p.p->weight(), false, dx, 1.f, 1.f));
    } else {  // a bias: the column sums of dy
      TESSERA_ASSIGN_OR_RETURN(p.grad, slot.Reshape({1, n}));
      TESSERA_RETURN_IF_ERROR(b.Gemm(in.ones, true, *p.dy, false, p.grad, 1.f, 0.f));
      TESSERA_ASSIGN_OR_RETURN(p.grad, p.grad.Reshape({n}));
    }
  }
  TESSERA_RETURN_IF_ERROR(AllReduce(buf));  // slot k: the sum over the ranks that share KV head k
  for (Piece& p : pieces) {
    TESSERA_ASSIGN_OR_RETURN(Tensor g, p.grad.Reshape(p.p->grad.shape()));
    TESSERA_RETURN_IF_ERROR(b.Axpby(1.f, g, internal::GradBeta(*p.p), p.p->grad));
  }
  return absl::OkStatus();
}

}  // namespace tessera::model
