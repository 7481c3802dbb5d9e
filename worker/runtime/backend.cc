#include "worker/runtime/backend.h"

#include <algorithm>

#include "common/status.h"
#include "kernels/rope/rope.h"

#include "absl/strings/str_cat.h"

namespace tessera::runtime {
namespace {

absl::Status Bad(const char* op, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what));
}

// Every tensor must be defined, contiguous and on this backend's device.
absl::Status CheckTensors(const char* op, Device dev, std::initializer_list<std::pair<const char*, const Tensor*>> ts) {
  for (auto [name, t] : ts) {
    if (!t->defined()) return Bad(op, absl::StrCat(name, " is not allocated"));
    if (!t->contiguous()) return Bad(op, absl::StrCat(name, " ", t->ShapeString(), " is not contiguous"));
    if (!(t->device() == dev))
      return Bad(op, absl::StrCat(name, " is on ", t->device().ToString(), ", the backend on ", dev.ToString()));
  }
  return absl::OkStatus();
}

bool Float(DType t) { return t == DType::kF32 || t == DType::kBF16; }

absl::Status SameShape(const char* op, const char* an, const Tensor& a, const char* bn, const Tensor& b) {
  if (a.shape() != b.shape())
    return Bad(op, absl::StrCat(an, " ", a.ShapeString(), " and ", bn, " ", b.ShapeString(), " must have the same shape"));
  return absl::OkStatus();
}

absl::Status SameDType(const char* op, const char* an, const Tensor& a, const char* bn, const Tensor& b) {
  if (a.dtype() != b.dtype())
    return Bad(op, absl::StrCat(an, " is ", DTypeName(a.dtype()), " but ", bn, " is ", DTypeName(b.dtype())));
  return absl::OkStatus();
}

#define TRY(expr)                        \
  do {                                   \
    absl::Status _s = (expr);            \
    if (!_s.ok()) return _s;             \
  } while (0)

}  // namespace

absl::Status Backend::Copy(const Tensor& src, Tensor& dst) {
  const char* op = "copy";
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"src", &src}, {"dst", &dst}}) {
    if (!t->defined()) return Bad(op, absl::StrCat(name, " is not allocated"));
    if (!(t->device() == device()))
      return Bad(op, absl::StrCat(name, " is on ", t->device().ToString(), ", the backend on ", device().ToString()));
    if (!t->contiguous() && !(t->rank() == 2 && t->strides()[1] == 1))
      return Bad(op, absl::StrCat(name, " ", t->ShapeString(), " is neither contiguous nor a 2-D view of whole rows' parts"));
  }
  TRY(SameShape(op, "src", src, "dst", dst));
  TRY(SameDType(op, "src", src, "dst", dst));
  if (src.numel() == 0) return absl::OkStatus();
  const int64_t es = DTypeSize(src.dtype());
  if (src.contiguous() && dst.contiguous()) {
    const int64_t n = src.numel() * es;
    return DoCopy2D(src.data(), n, dst.data(), n, n, 1);
  }
  const int64_t rows = src.dim(0), row = src.dim(1) * es;
  return DoCopy2D(src.data(), src.strides()[0] * es, dst.data(), dst.strides()[0] * es, row, rows);
}

absl::Status Backend::Cast(const Tensor& x, Tensor& y) {
  TRY(CheckTensors("cast", device(), {{"x", &x}, {"y", &y}}));
  TRY(SameShape("cast", "x", x, "y", y));
  auto castable = [](DType t) { return Float(t) || t == DType::kF16; };
  if (!castable(x.dtype()) || !castable(y.dtype()))
    return Bad("cast", absl::StrCat("casts are between f32, bf16 and f16; got ", DTypeName(x.dtype()), " -> ",
                                    DTypeName(y.dtype())));
  return DoCast(x, y);
}

absl::Status Backend::RmsNormForward(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd) {
  const char* op = "rmsnorm_forward";
  TRY(CheckTensors(op, device(), {{"x", &x}, {"w", &w}, {"y", &y}, {"rstd", &rstd}}));
  if (x.rank() != 2) return Bad(op, absl::StrCat("x must be [rows, cols], got ", x.ShapeString()));
  if (!Float(x.dtype())) return Bad(op, "x must be f32 or bf16");
  TRY(SameShape(op, "x", x, "y", y));
  TRY(SameDType(op, "x", x, "y", y));
  TRY(SameDType(op, "x", x, "w", w));
  if (w.rank() != 1 || w.dim(0) != x.dim(1)) return Bad(op, absl::StrCat("w ", w.ShapeString(), " must be [", x.dim(1), "]"));
  if (rstd.dtype() != DType::kF32 || rstd.rank() != 1 || rstd.dim(0) != x.dim(0))
    return Bad(op, absl::StrCat("rstd must be f32 [", x.dim(0), "], got ", DTypeName(rstd.dtype()), " ", rstd.ShapeString()));
  if (!(eps > 0)) return Bad(op, absl::StrCat("eps must be > 0, got ", eps));
  return DoRmsNormForward(x, w, eps, y, rstd);
}

absl::Status Backend::RmsNormBackward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx,
                                      Tensor& dw, const Tensor* add) {
  const char* op = "rmsnorm_backward";
  TRY(CheckTensors(op, device(), {{"dy", &dy}, {"x", &x}, {"w", &w}, {"rstd", &rstd}, {"dx", &dx}, {"dw", &dw}}));
  if (x.rank() != 2 || !Float(x.dtype())) return Bad(op, absl::StrCat("x must be f32 or bf16 [rows, cols], got ", x.ShapeString()));
  TRY(SameShape(op, "dy", dy, "x", x));
  TRY(SameShape(op, "dx", dx, "x", x));
  TRY(SameDType(op, "dy", dy, "x", x));
  TRY(SameDType(op, "dx", dx, "x", x));
  TRY(SameDType(op, "w", w, "x", x));
  if (w.rank() != 1 || w.dim(0) != x.dim(1)) return Bad(op, absl::StrCat("w ", w.ShapeString(), " must be [", x.dim(1), "]"));
  if (dw.dtype() != DType::kF32 || dw.shape() != w.shape())
    return Bad(op, absl::StrCat("dw must be f32 ", w.ShapeString(), ", got ", DTypeName(dw.dtype()), " ", dw.ShapeString()));
  if (rstd.dtype() != DType::kF32 || rstd.rank() != 1 || rstd.dim(0) != x.dim(0))
    return Bad(op, absl::StrCat("rstd must be f32 [", x.dim(0), "]"));
  if (add != nullptr) {
    TRY(CheckTensors(op, device(), {{"add", add}}));
    TRY(SameShape(op, "add", *add, "x", x));
    TRY(SameDType(op, "add", *add, "x", x));
  }
  return DoRmsNormBackward(dy, x, w, rstd, dx, dw, add);
}

absl::Status Backend::SwiGluForward(const Tensor& gate, const Tensor& up, Tensor& y) {
  const char* op = "swiglu_forward";
  TRY(CheckTensors(op, device(), {{"gate", &gate}, {"up", &up}, {"y", &y}}));
  if (!Float(gate.dtype())) return Bad(op, "gate must be f32 or bf16");
  TRY(SameShape(op, "gate", gate, "up", up));
  TRY(SameShape(op, "gate", gate, "y", y));
  TRY(SameDType(op, "gate", gate, "up", up));
  TRY(SameDType(op, "gate", gate, "y", y));
  return DoSwiGluForward(gate, up, y);
}

absl::Status Backend::SwiGluBackward(const Tensor& dy, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup,
                                     Tensor* y) {
  const char* op = "swiglu_backward";
  TRY(CheckTensors(op, device(), {{"dy", &dy}, {"gate", &gate}, {"up", &up}, {"dgate", &dgate}, {"dup", &dup}}));
  if (!Float(gate.dtype())) return Bad(op, "gate must be f32 or bf16");
  for (auto [n, t] : {std::pair<const char*, const Tensor*>{"dy", &dy}, {"up", &up}, {"dgate", &dgate}, {"dup", &dup}}) {
    TRY(SameShape(op, n, *t, "gate", gate));
    TRY(SameDType(op, n, *t, "gate", gate));
  }
  if (y != nullptr) {
    TRY(CheckTensors(op, device(), {{"y", y}}));
    TRY(SameShape(op, "y", *y, "gate", gate));
    TRY(SameDType(op, "y", *y, "gate", gate));
  }
  return DoSwiGluBackward(dy, gate, up, dgate, dup, y);
}

namespace {
absl::Status CheckGemm(const char* op, Device device, const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c,
                       const Tensor* c_in) {
  TRY(CheckTensors(op, device, {{"a", &a}, {"b", &b}, {"c", &c}}));
  if (a.rank() != 2 || b.rank() != 2 || c.rank() != 2)
    return Bad(op, absl::StrCat("a ", a.ShapeString(), ", b ", b.ShapeString(), ", c ", c.ShapeString(), " must be 2-D"));
  TRY(SameDType(op, "a", a, "b", b));
  if (!(a.dtype() == DType::kBF16 && c.dtype() == DType::kF32)) TRY(SameDType(op, "a", a, "c", c));
  if (!Float(a.dtype())) return Bad(op, "only f32 and bf16 are supported");
  int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
  int64_t kb = tb ? b.dim(1) : b.dim(0), n = tb ? b.dim(0) : b.dim(1);
  if (k != kb)
    return Bad(op, absl::StrCat("inner dimensions differ: op(a) is [", m, ", ", k, "], op(b) is [", kb, ", ", n, "]"));
  if (c.dim(0) != m || c.dim(1) != n) return Bad(op, absl::StrCat("c is ", c.ShapeString(), ", expected [", m, ", ", n, "]"));
  if (c_in != nullptr) {
    TRY(CheckTensors(op, device, {{"c_in", c_in}}));
    TRY(SameShape(op, "c_in", *c_in, "c", c));
    TRY(SameDType(op, "c_in", *c_in, "c", c));
  }
  return absl::OkStatus();
}

// The bytes a tensor's elements span (a view's first to its last element).
std::pair<const char*, const char*> Extent(const Tensor& t) {
  const char* p = static_cast<const char*>(t.data());
  int64_t last = 0;
  for (int d = 0; d < t.rank(); ++d) last += (t.dim(d) - 1) * t.strides()[d];
  return {p, p + (last + 1) * DTypeSize(t.dtype())};
}
bool Overlap(const Tensor& x, const Tensor& y) {
  if (x.numel() == 0 || y.numel() == 0) return false;
  const auto [x0, x1] = Extent(x);
  const auto [y0, y1] = Extent(y);
  return x0 < y1 && y0 < x1;
}
}  // namespace

absl::Status Backend::Gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha, float beta,
                           const Tensor* c_in) {
  TRY(CheckGemm("gemm", device(), a, ta, b, tb, c, c_in));
  return DoGemm(a, ta, b, tb, c, alpha, beta, c_in);
}

absl::Status Backend::Gemms(absl::Span<const GemmCall> calls) {
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string op = absl::StrCat("gemms[", i, "]");
    const GemmCall& g = calls[i];
    if (g.a == nullptr || g.b == nullptr || g.c == nullptr) return Bad(op.c_str(), "a, b and c must be given");
    TRY(CheckGemm(op.c_str(), device(), *g.a, g.ta, *g.b, g.tb, *g.c, nullptr));
    for (size_t j = 0; j < calls.size(); ++j) {
      if (j == i) continue;
      const GemmCall& h = calls[j];
      if (h.a == nullptr || h.b == nullptr || h.c == nullptr) continue;  // refused in its own turn
      if (Overlap(*g.c, *h.a) || Overlap(*g.c, *h.b) || (j < i && Overlap(*g.c, *h.c)))
        return Bad(op.c_str(), absl::StrCat("c overlaps gemms[", j, "]'s ", Overlap(*g.c, *h.a) ? "a" : Overlap(*g.c, *h.b) ? "b" : "c",
                                            ": the calls must be independent"));
    }
  }
  return DoGemms(calls);
}

absl::Status Backend::DoGemms(absl::Span<const GemmCall> calls) {
  for (const GemmCall& g : calls) TRY(DoGemm(*g.a, g.ta, *g.b, g.tb, *g.c, 1.f, 0.f, nullptr));
  return absl::OkStatus();
}

absl::Status Backend::AdamW(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p,
                            Tensor* param_lowp) {
  const char* op = "adamw";
  TRY(CheckTensors(op, device(), {{"param", &param}, {"grad", &grad}, {"m", &m}, {"v", &v}}));
  for (auto [n, t] : {std::pair<const char*, const Tensor*>{"param", &param}, {"m", &m}, {"v", &v}})
    if (t->dtype() != DType::kF32) return Bad(op, absl::StrCat(n, " must be f32 (master weights and state)"));
  if (!Float(grad.dtype())) return Bad(op, "grad must be f32 or bf16");
  TRY(SameShape(op, "grad", grad, "param", param));
  TRY(SameShape(op, "m", m, "param", param));
  TRY(SameShape(op, "v", v, "param", param));
  if (param_lowp) {
    TRY(CheckTensors(op, device(), {{"param_lowp", param_lowp}}));
    TRY(SameShape(op, "param_lowp", *param_lowp, "param", param));
    if (param_lowp->dtype() != DType::kBF16) return Bad(op, "param_lowp must be bf16");
  }
  if (p.step < 1) return Bad(op, absl::StrCat("step must be >= 1, got ", p.step));
  if (!(p.beta1 >= 0 && p.beta1 < 1 && p.beta2 >= 0 && p.beta2 < 1)) return Bad(op, "betas must be in [0, 1)");
  return DoAdamW(param, grad, m, v, p, param_lowp);
}

namespace {
absl::Status Vec(const char* op, const char* name, const Tensor& t, int64_t n, DType dt) {
  if (t.rank() != 1 || t.dim(0) != n || t.dtype() != dt)
    return Bad(op, absl::StrCat(name, " must be ", DTypeName(dt), " [", n, "], got ", DTypeName(t.dtype()), " ", t.ShapeString()));
  return absl::OkStatus();
}
}  // namespace

absl::Status Backend::EmbeddingForward(const Tensor& ids, const Tensor& table, int64_t vocab_start, Tensor& out) {
  const char* op = "embedding_forward";
  TRY(CheckTensors(op, device(), {{"ids", &ids}, {"table", &table}, {"out", &out}}));
  if (ids.rank() != 1 || ids.dtype() != DType::kI32) return Bad(op, absl::StrCat("ids must be i32 [n], got ", ids.ShapeString()));
  if (table.rank() != 2 || !Float(table.dtype())) return Bad(op, absl::StrCat("table must be f32/bf16 [rows, hidden], got ", table.ShapeString()));
  TRY(SameDType(op, "out", out, "table", table));
  if (out.rank() != 2 || out.dim(0) != ids.dim(0) || out.dim(1) != table.dim(1))
    return Bad(op, absl::StrCat("out ", out.ShapeString(), " must be [", ids.dim(0), ", ", table.dim(1), "]"));
  if (vocab_start < 0) return Bad(op, absl::StrCat("vocab_start must be >= 0, got ", vocab_start));
  return DoEmbeddingForward(ids, table, vocab_start, out);
}

absl::Status Backend::EmbeddingBackward(const Tensor& ids, const Tensor& dout, int64_t vocab_start, Tensor& dtable) {
  const char* op = "embedding_backward";
  TRY(CheckTensors(op, device(), {{"ids", &ids}, {"dout", &dout}, {"dtable", &dtable}}));
  if (ids.rank() != 1 || ids.dtype() != DType::kI32) return Bad(op, absl::StrCat("ids must be i32 [n], got ", ids.ShapeString()));
  if (dout.rank() != 2 || dout.dim(0) != ids.dim(0) || !Float(dout.dtype()))
    return Bad(op, absl::StrCat("dout must be f32/bf16 [", ids.dim(0), ", hidden], got ", dout.ShapeString()));
  if (dtable.rank() != 2 || dtable.dtype() != DType::kF32 || dtable.dim(1) != dout.dim(1))
    return Bad(op, absl::StrCat("dtable must be f32 [rows, ", dout.dim(1), "], got ", DTypeName(dtable.dtype()), " ", dtable.ShapeString()));
  return DoEmbeddingBackward(ids, dout, vocab_start, dtable);
}

absl::Status Backend::Rope(const Tensor& x, const Tensor& positions, absl::Span<const float> inv_freq, float scale,
                           Tensor& y, bool inverse) {
  const char* op = "rope";
  TRY(CheckTensors(op, device(), {{"positions", &positions}}));
  if (x.rank() != 3 || !Float(x.dtype())) return Bad(op, absl::StrCat("x must be f32/bf16 [tokens, heads, dim], got ", x.ShapeString()));
  // x and y may be head columns of wider rows (a fused Q|K|V projection): each token's
  // heads contiguous, its row any distance from the next.
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"x", &x}, {"y", &y}}) {
    if (!t->defined()) return Bad(op, absl::StrCat(name, " is not allocated"));
    if (!(t->device() == device()))
      return Bad(op, absl::StrCat(name, " is on ", t->device().ToString(), ", the backend on ", device().ToString()));
    if (t->rank() == 3 && (t->strides()[2] != 1 || t->strides()[1] != t->dim(2) || t->strides()[0] < t->dim(1) * t->dim(2)))
      return Bad(op, absl::StrCat(name, " ", t->ShapeString(), ": each token's heads must be contiguous"));
  }
  if (x.dim(2) % 2 != 0 || x.dim(2) > kernels::kRopeMaxHeadDim)
    return Bad(op, absl::StrCat("head dim must be even and at most ", kernels::kRopeMaxHeadDim, ", got ", x.dim(2)));
  TRY(SameShape(op, "x", x, "y", y));
  TRY(SameDType(op, "x", x, "y", y));
  TRY(Vec(op, "positions", positions, x.dim(0), DType::kI32));
  if (static_cast<int64_t>(inv_freq.size()) != x.dim(2) / 2)
    return Bad(op, absl::StrCat("inv_freq holds ", inv_freq.size(), " frequencies; head dim ", x.dim(2), " needs ", x.dim(2) / 2));
  if (!(scale > 0)) return Bad(op, absl::StrCat("scale must be > 0, got ", scale));
  return DoRope(x, positions, inv_freq.data(), scale, y, inverse ? -1.f : 1.f);
}

absl::Status Backend::CrossEntropyPartials(const Tensor& logits, const Tensor& targets, int64_t vocab_start, Tensor& max,
                                           Tensor& sum, Tensor& dot, Tensor& tgt) {
  const char* op = "cross_entropy_partials";
  TRY(CheckTensors(op, device(), {{"logits", &logits}, {"targets", &targets}, {"max", &max}, {"sum", &sum}, {"dot", &dot}, {"tgt", &tgt}}));
  if (logits.rank() != 2 || !Float(logits.dtype()) || logits.dim(1) == 0)
    return Bad(op, absl::StrCat("logits must be f32/bf16 [n, v] with v > 0, got ", logits.ShapeString()));
  int64_t n = logits.dim(0);
  TRY(Vec(op, "targets", targets, n, DType::kI32));
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"max", &max}, {"sum", &sum}, {"dot", &dot}, {"tgt", &tgt}})
    TRY(Vec(op, name, *t, n, DType::kF32));
  return DoCrossEntropyPartials(logits, targets, vocab_start, max, sum, dot, tgt);
}

absl::Status Backend::CrossEntropyLoss(const Tensor& max, const Tensor& sum, const Tensor& tgt, const Tensor& targets,
                                       float scale, Tensor& lse, Tensor& dloss, Tensor& loss_sum) {
  const char* op = "cross_entropy_loss";
  TRY(CheckTensors(op, device(), {{"max", &max}, {"sum", &sum}, {"tgt", &tgt}, {"targets", &targets}, {"lse", &lse},
                                  {"dloss", &dloss}, {"loss_sum", &loss_sum}}));
  const int64_t n = max.numel();
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"max", &max}, {"sum", &sum}, {"tgt", &tgt}, {"lse", &lse},
                         {"dloss", &dloss}})
    TRY(Vec(op, name, *t, n, DType::kF32));
  TRY(Vec(op, "targets", targets, n, DType::kI32));
  TRY(Vec(op, "loss_sum", loss_sum, 1, DType::kF32));
  return DoCrossEntropyLoss(max, sum, tgt, targets, scale, lse, dloss, loss_sum);
}

absl::Status Backend::CrossEntropyRescale(const Tensor& max, const Tensor& global_max, Tensor& sum) {
  const char* op = "cross_entropy_rescale";
  TRY(CheckTensors(op, device(), {{"max", &max}, {"global_max", &global_max}, {"sum", &sum}}));
  const int64_t n = max.numel();
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"max", &max}, {"global_max", &global_max}, {"sum", &sum}})
    TRY(Vec(op, name, *t, n, DType::kF32));
  return DoCrossEntropyRescale(max, global_max, sum);
}

absl::Status Backend::CrossEntropyBackward(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                                           const Tensor& lse, const Tensor& dloss, Tensor& dlogits, const Tensor* dentropy,
                                           const Tensor* entropy) {
  const char* op = "cross_entropy_backward";
  TRY(CheckTensors(op, device(), {{"logits", &logits}, {"targets", &targets}, {"lse", &lse}, {"dloss", &dloss}, {"dlogits", &dlogits}}));
  if (logits.rank() != 2 || !Float(logits.dtype())) return Bad(op, absl::StrCat("logits must be f32/bf16 [n, v], got ", logits.ShapeString()));
  int64_t n = logits.dim(0);
  TRY(Vec(op, "targets", targets, n, DType::kI32));
  TRY(Vec(op, "lse", lse, n, DType::kF32));
  TRY(Vec(op, "dloss", dloss, n, DType::kF32));
  TRY(SameShape(op, "dlogits", dlogits, "logits", logits));
  TRY(SameDType(op, "dlogits", dlogits, "logits", logits));
  if ((dentropy == nullptr) != (entropy == nullptr)) return Bad(op, "dentropy and entropy come together");
  if (dentropy != nullptr) {
    TRY(CheckTensors(op, device(), {{"dentropy", dentropy}, {"entropy", entropy}}));
    TRY(Vec(op, "dentropy", *dentropy, n, DType::kF32));
    TRY(Vec(op, "entropy", *entropy, n, DType::kF32));
  }
  return DoCrossEntropyBackward(logits, targets, vocab_start, lse, dloss, dlogits, dentropy, entropy);
}

namespace {
// Index tensors (cu_seqlens, block tables, context lengths) may live on the backend's
// device or on the host: a host tensor is read in place, a device one has to come back
// first (which waits for the stream), so hot paths pass host tensors.
absl::Status CheckIndexTensor(const char* op, Device dev, const char* name, const Tensor& t) {
  if (t.defined() && t.device().kind == DeviceKind::kCpu)
    return t.contiguous() ? absl::OkStatus() : Bad(op, absl::StrCat(name, " is not contiguous"));
  return CheckTensors(op, dev, {{name, &t}});
}
absl::StatusOr<std::vector<int32_t>> ReadIndices(Backend& be, const Tensor& t) {
  std::vector<int32_t> h(t.numel());
  if (t.device().kind == DeviceKind::kCpu) std::copy_n(t.data_as<int32_t>(), h.size(), h.begin());
  else TRY(be.CopyToHost(t, h.data()));
  return h;
}

absl::Status CheckAttention(Backend& be, const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& cu, const Tensor& out, const Tensor& lse) {
  TRY(CheckTensors(op, be.device(), {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"lse", &lse}}));
  TRY(CheckIndexTensor(op, be.device(), "cu_seqlens", cu));
  if (q.rank() != 3 || k.rank() != 3 || !Float(q.dtype()))
    return Bad(op, absl::StrCat("q ", q.ShapeString(), " and k ", k.ShapeString(), " must be f32/bf16 [tokens, heads, head_dim]"));
  TRY(SameDType(op, "k", k, "q", q));
  TRY(SameDType(op, "v", v, "q", q));
  TRY(SameShape(op, "v", v, "k", k));
  TRY(SameShape(op, "out", out, "q", q));
  TRY(SameDType(op, "out", out, "q", q));
  if (k.dim(0) != q.dim(0) || k.dim(2) != q.dim(2))
    return Bad(op, absl::StrCat("k ", k.ShapeString(), " must match q ", q.ShapeString(), " in tokens and head_dim"));
  if (k.dim(1) == 0 || q.dim(1) % k.dim(1) != 0)
    return Bad(op, absl::StrCat("query heads (", q.dim(1), ") must be a multiple of kv heads (", k.dim(1), ")"));
  if (lse.dtype() != DType::kF32 || lse.rank() != 2 || lse.dim(0) != q.dim(0) || lse.dim(1) != q.dim(1))
    return Bad(op, absl::StrCat("lse must be f32 [", q.dim(0), ", ", q.dim(1), "], got ", lse.ShapeString()));
  if (cu.rank() != 1 || cu.dtype() != DType::kI32 || cu.dim(0) < 2)
    return Bad(op, absl::StrCat("cu_seqlens must be i32 [batch+1] with batch >= 1, got ", cu.ShapeString()));
  TESSERA_ASSIGN_OR_RETURN(const std::vector<int32_t> h, ReadIndices(be, cu));
  if (h[0] != 0 || h.back() != q.dim(0))
    return Bad(op, absl::StrCat("cu_seqlens must start at 0 and end at tokens=", q.dim(0), ", got ", h[0], " ... ", h.back()));
  for (size_t i = 1; i < h.size(); ++i)
    if (h[i] <= h[i - 1]) return Bad(op, absl::StrCat("cu_seqlens must be strictly increasing; entry ", i, " is ", h[i], " after ", h[i - 1]));
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<int> Backend::Mark() {
  host_marks_.push_back(std::chrono::steady_clock::now());
  return static_cast<int>(host_marks_.size()) - 1;
}

absl::StatusOr<double> Backend::Seconds(int a, int b) {
  const int n = static_cast<int>(host_marks_.size());
  if (a < 0 || b < 0 || a >= n || b >= n)
    return absl::OutOfRangeError(absl::StrCat("timing marks ", a, " and ", b, ": only ", n, " marks"));
  return std::chrono::duration<double>(host_marks_[b] - host_marks_[a]).count();
}

absl::Status Backend::PrepareAttention(int64_t batch, int64_t seq, int64_t q_heads, int64_t kv_heads, int64_t head_dim,
                                       bool causal, DType dtype) {
  if (batch <= 0 || seq <= 0 || q_heads <= 0 || kv_heads <= 0 || head_dim <= 0 || q_heads % kv_heads != 0)
    return absl::InvalidArgumentError(absl::StrCat("PrepareAttention: batch ", batch, ", seq ", seq, ", heads ", q_heads,
                                                   "/", kv_heads, ", head_dim ", head_dim,
                                                   ": sizes must be positive and kv heads divide the heads"));
  return DoPrepareAttention(batch, seq, q_heads, kv_heads, head_dim, causal, dtype);
}

absl::Status Backend::AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu, bool causal,
                                       Tensor& out, Tensor& lse) {
  TRY(CheckAttention(*this, "attention_forward", q, k, v, cu, out, lse));
  return DoAttentionForward(q, k, v, cu, causal, out, lse);
}

absl::Status Backend::AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu, bool causal,
                                        const Tensor& out, const Tensor& dout, const Tensor& lse, Tensor& dq, Tensor& dk,
                                        Tensor& dv) {
  const char* op = "attention_backward";
  TRY(CheckAttention(*this, op, q, k, v, cu, out, lse));
  TRY(CheckTensors(op, device(), {{"dout", &dout}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}}));
  TRY(SameShape(op, "dout", dout, "q", q));
  TRY(SameShape(op, "dq", dq, "q", q));
  TRY(SameShape(op, "dk", dk, "k", k));
  TRY(SameShape(op, "dv", dv, "v", v));
  for (auto [n, t] : {std::pair<const char*, const Tensor*>{"dout", &dout}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}})
    TRY(SameDType(op, n, *t, "q", q));
  return DoAttentionBackward(q, k, v, cu, causal, out, dout, lse, dq, dk, dv);
}

absl::Status Backend::AttentionMerge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  const char* op = "attention_merge";
  TRY(CheckTensors(op, device(), {{"out", &out}, {"lse", &lse}, {"out_b", &out_b}, {"lse_b", &lse_b}}));
  TRY(SameShape(op, "out_b", out_b, "out", out));
  TRY(SameDType(op, "out_b", out_b, "out", out));
  TRY(SameShape(op, "lse_b", lse_b, "lse", lse));
  if (out.rank() != 3 || lse.rank() != 2 || lse.dim(0) != out.dim(0) || lse.dim(1) != out.dim(1) ||
      lse.dtype() != DType::kF32 || lse_b.dtype() != DType::kF32 ||
      !(out.dtype() == DType::kF32 || out.dtype() == DType::kBF16 || out.dtype() == DType::kF16))
    return absl::InvalidArgumentError(absl::StrCat(op, ": need out [T, H, D] (f32/bf16/f16) and lse [T, H] f32, got out ",
                                                   out.ShapeString(), " ", DTypeName(out.dtype()), ", lse ",
                                                   lse.ShapeString(), " ", DTypeName(lse.dtype())));
  return DoAttentionMerge(out, lse, out_b, lse_b);
}

absl::Status Backend::PagedAttention(const Tensor& q, const Tensor& kc, const Tensor& vc, const Tensor& tables,
                                     const Tensor& lens, Tensor& out, Tensor& lse) {
  TRY(CheckPagedAttention(q, kc, vc, tables, lens, out, lse));
  return DoPagedAttention(q, kc, vc, tables, lens, out, lse);
}

absl::Status Backend::CheckPagedAttention(const Tensor& q, const Tensor& kc, const Tensor& vc, const Tensor& tables,
                                          const Tensor& lens, const Tensor& out, const Tensor& lse) {
  const char* op = "paged_attention";
  TRY(CheckTensors(op, device(), {{"q", &q}, {"k_cache", &kc}, {"v_cache", &vc}, {"out", &out}, {"lse", &lse}}));
  TRY(CheckIndexTensor(op, device(), "block_tables", tables));
  TRY(CheckIndexTensor(op, device(), "context_lens", lens));
  if (q.rank() != 3 || !Float(q.dtype())) return Bad(op, absl::StrCat("q must be f32/bf16 [batch, heads, dim], got ", q.ShapeString()));
  if (kc.rank() != 4 || kc.dim(3) != q.dim(2))
    return Bad(op, absl::StrCat("k_cache must be [blocks, block_size, kv_heads, ", q.dim(2), "], got ", kc.ShapeString()));
  TRY(SameShape(op, "v_cache", vc, "k_cache", kc));
  TRY(SameDType(op, "k_cache", kc, "q", q));
  TRY(SameDType(op, "v_cache", vc, "q", q));
  TRY(SameShape(op, "out", out, "q", q));
  TRY(SameDType(op, "out", out, "q", q));
  if (kc.dim(2) == 0 || q.dim(1) % kc.dim(2) != 0)
    return Bad(op, absl::StrCat("query heads (", q.dim(1), ") must be a multiple of kv heads (", kc.dim(2), ")"));
  const int64_t B = q.dim(0);
  if (tables.rank() != 2 || tables.dtype() != DType::kI32 || tables.dim(0) != B)
    return Bad(op, absl::StrCat("block_tables must be i32 [", B, ", max_blocks], got ", tables.ShapeString()));
  TRY(Vec(op, "context_lens", lens, B, DType::kI32));
  if (lse.dtype() != DType::kF32 || lse.rank() != 2 || lse.dim(0) != B || lse.dim(1) != q.dim(1))
    return Bad(op, absl::StrCat("lse must be f32 [", B, ", ", q.dim(1), "], got ", lse.ShapeString()));
  const bool on_host = tables.device().kind == DeviceKind::kCpu && lens.device().kind == DeviceKind::kCpu;
  if (on_host || !trust_device_indices_) {
    TESSERA_ASSIGN_OR_RETURN(const std::vector<int32_t> ht, ReadIndices(*this, tables));
    TESSERA_ASSIGN_OR_RETURN(const std::vector<int32_t> hl, ReadIndices(*this, lens));
    TRY(CheckPagedIndices(kc, ht.data(), B, tables.dim(1), hl.data()));
  }
  return absl::OkStatus();
}

absl::Status Backend::CheckPagedIndices(const Tensor& kc, const int32_t* ht, int64_t B, int64_t maxb, const int32_t* hl) {
  const char* op = "paged_attention";
  const int64_t bs = kc.dim(1);
  for (int64_t b = 0; b < B; ++b) {
    if (hl[b] < 1 || hl[b] > maxb * bs)
      return Bad(op, absl::StrCat("context_lens[", b, "] = ", hl[b], " must be in [1, ", maxb * bs, "]"));
    for (int64_t i = 0; i < (hl[b] + bs - 1) / bs; ++i)
      if (ht[b * maxb + i] < 0 || ht[b * maxb + i] >= kc.dim(0))
        return Bad(op, absl::StrCat("block_tables[", b, "][", i, "] = ", ht[b * maxb + i], " is not a block of the cache (",
                                    kc.dim(0), " blocks)"));
  }
  return absl::OkStatus();
}

absl::Status Backend::CheckCacheSlots(const Tensor& kc, const int32_t* slots, int64_t n) {
  const char* op = "kv_cache_write";
  const int64_t capacity = kc.dim(0) * kc.dim(1);
  std::vector<int32_t> sorted(slots, slots + n);
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (sorted[i] < 0 || sorted[i] >= capacity)
      return Bad(op, absl::StrCat("slot ", sorted[i], " is outside the cache (", capacity, " slots)"));
    if (i > 0 && sorted[i] == sorted[i - 1]) return Bad(op, absl::StrCat("slot ", sorted[i], " is written twice"));
  }
  return absl::OkStatus();
}

absl::Status Backend::KvCacheWrite(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& kc, Tensor& vc) {
  const char* op = "kv_cache_write";
  TRY(CheckTensors(op, device(), {{"k", &k}, {"v", &v}, {"k_cache", &kc}, {"v_cache", &vc}}));
  TRY(CheckIndexTensor(op, device(), "slots", slots));
  if (k.rank() != 3) return Bad(op, absl::StrCat("k must be [tokens, kv_heads, dim], got ", k.ShapeString()));
  TRY(SameShape(op, "v", v, "k", k));
  if (kc.rank() != 4 || kc.dim(2) != k.dim(1) || kc.dim(3) != k.dim(2))
    return Bad(op, absl::StrCat("k_cache must be [blocks, block_size, ", k.dim(1), ", ", k.dim(2), "], got ", kc.ShapeString()));
  TRY(SameShape(op, "v_cache", vc, "k_cache", kc));
  for (auto [n, t] : {std::pair<const char*, const Tensor*>{"v", &v}, {"k_cache", &kc}, {"v_cache", &vc}})
    TRY(SameDType(op, n, *t, "k", k));
  TRY(Vec(op, "slots", slots, k.dim(0), DType::kI32));
  if (slots.device().kind == DeviceKind::kCpu || !trust_device_indices_) {
    TESSERA_ASSIGN_OR_RETURN(const std::vector<int32_t> hs, ReadIndices(*this, slots));
    TRY(CheckCacheSlots(kc, hs.data(), static_cast<int64_t>(hs.size())));
  }
  return DoKvCacheWrite(k, v, slots, kc, vc);
}

namespace {
class HostEvent final : public Backend::Event {
 public:
  absl::Status Record() override { return absl::OkStatus(); }
  absl::Status Wait() override { return absl::OkStatus(); }
};
}  // namespace

absl::StatusOr<std::unique_ptr<Backend::Event>> Backend::NewEvent() { return std::unique_ptr<Event>(new HostEvent()); }

absl::Status Backend::Select(const Tensor& src, const Tensor& from, const Tensor& values, Tensor& out) {
  const char* op = "select";
  TRY(CheckTensors(op, device(), {{"from", &from}, {"values", &values}, {"out", &out}}));
  TRY(CheckIndexTensor(op, device(), "src", src));
  const int64_t n = out.numel();
  TRY(Vec(op, "src", src, n, DType::kI32));
  TRY(Vec(op, "values", values, n, DType::kI32));
  TRY(Vec(op, "out", out, n, DType::kI32));
  if (from.rank() != 1 || from.dtype() != DType::kI32) return Bad(op, absl::StrCat("from must be i32 [m], got ", from.ShapeString()));
  if (src.device().kind == DeviceKind::kCpu || !trust_device_indices_) {
    TESSERA_ASSIGN_OR_RETURN(const std::vector<int32_t> hs, ReadIndices(*this, src));
    for (int64_t i = 0; i < n; ++i)
      if (hs[i] < -1 || hs[i] >= from.numel())
        return Bad(op, absl::StrCat("src[", i, "] = ", hs[i], " is neither -1 nor an index of from [", from.numel(), "]"));
  }
  return DoSelect(src, from, values, out);
}

absl::Status Backend::DecodeLinear(const Tensor& x, const Tensor* norm, float eps, absl::Span<const LinearPart> parts,
                                   const Tensor* residual, bool swiglu) {
  const char* op = "decode_linear";
  TRY(CheckTensors(op, device(), {{"x", &x}}));
  if (x.rank() != 2 || !Float(x.dtype())) return Bad(op, absl::StrCat("x must be f32 or bf16 [rows, k], got ", x.ShapeString()));
  const int64_t m = x.dim(0), k = x.dim(1);
  if (!DecodeLinearSupported(m, k, x.dtype()))
    return Bad(op, absl::StrCat("x ", x.ShapeString(), " ", DTypeName(x.dtype()), " is not a size this backend's decode linear takes"));
  if (parts.empty() || parts.size() > 3) return Bad(op, absl::StrCat(parts.size(), " weights; 1 to 3 expected"));
  if (swiglu && parts.size() != 2) return Bad(op, "swiglu takes two weights (gate, up)");
  if (residual != nullptr && parts.size() != 1) return Bad(op, "a residual takes one weight");
  kernels::DecodeLinearArgs a;
  a.x = x.data(), a.m = m, a.k = k, a.eps = eps, a.swiglu = swiglu, a.num_parts = static_cast<int>(parts.size());
  if (norm != nullptr) {
    TRY(CheckTensors(op, device(), {{"norm", norm}}));
    TRY(SameDType(op, "norm", *norm, "x", x));
    if (norm->rank() != 1 || norm->dim(0) != k) return Bad(op, absl::StrCat("norm ", norm->ShapeString(), " must be [", k, "]"));
    if (!(eps > 0)) return Bad(op, absl::StrCat("eps must be > 0, got ", eps));
    a.norm = norm->data();
  }
  for (size_t j = 0; j < parts.size(); ++j) {
    const LinearPart& p = parts[j];
    const std::string w = absl::StrCat("weights[", j, "]"), b = absl::StrCat("biases[", j, "]"), y = absl::StrCat("outputs[", j, "]");
    if (p.w == nullptr) return Bad(op, absl::StrCat(w, " is missing"));
    TRY(CheckTensors(op, device(), {{w.c_str(), p.w}}));
    TRY(SameDType(op, w.c_str(), *p.w, "x", x));
    if (p.w->rank() != 2 || p.w->dim(1) != k) return Bad(op, absl::StrCat(w, " ", p.w->ShapeString(), " must be [n, ", k, "]"));
    const int64_t n = p.w->dim(0);
    if (swiglu && n != parts[0].w->dim(0)) return Bad(op, "swiglu's gate and up weights must have one shape");
    if (p.bias != nullptr) {
      if (swiglu) return Bad(op, absl::StrCat(b, ": swiglu's gate and up take no bias"));
      TRY(CheckTensors(op, device(), {{b.c_str(), p.bias}}));
      TRY(SameDType(op, b.c_str(), *p.bias, "x", x));
      if (p.bias->rank() != 1 || p.bias->dim(0) != n) return Bad(op, absl::StrCat(b, " ", p.bias->ShapeString(), " must be [", n, "]"));
    }
    const bool needs_y = !(swiglu && j == 1);
    if (needs_y) {
      if (p.y == nullptr) return Bad(op, absl::StrCat(y, " is missing"));
      TRY(CheckTensors(op, device(), {{y.c_str(), p.y}}));
      TRY(SameDType(op, y.c_str(), *p.y, "x", x));
      if (p.y->rank() != 2 || p.y->dim(0) != m || p.y->dim(1) != n)
        return Bad(op, absl::StrCat(y, " ", p.y->ShapeString(), " must be [", m, ", ", n, "]"));
    }
    a.parts[j] = kernels::DecodeLinearPart{p.w->data(), p.bias != nullptr ? p.bias->data() : nullptr,
                                           needs_y ? p.y->data() : nullptr, n};
  }
  if (residual != nullptr) {
    TRY(CheckTensors(op, device(), {{"residual", residual}}));
    TRY(SameShape(op, "residual", *residual, "outputs[0]", *parts[0].y));
    TRY(SameDType(op, "residual", *residual, "x", x));
    a.residual = residual->data();
  }
  return DoDecodeLinear(a, x.dtype());
}

absl::Status Backend::QkRopeCache(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                                  const Tensor& slots, const Tensor* q_norm, const Tensor* k_norm, float eps,
                                  absl::Span<const float> inv_freq, float scale, Tensor& q_out, Tensor& kc, Tensor& vc,
                                  Tensor* k_out) {
  TESSERA_ASSIGN_OR_RETURN(const kernels::QkRopeCacheArgs a,
                           QkRopeCacheArgsOf(q, k, v, positions, slots, q_norm, k_norm, eps, inv_freq, scale, q_out, kc, vc, k_out));
  return DoQkRopeCache(a, q.dtype(), positions, slots);
}

absl::Status Backend::DecodeAttention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& positions,
                                      const Tensor& slots, const Tensor* q_norm, const Tensor* k_norm, float eps,
                                      absl::Span<const float> inv_freq, float scale, Tensor& q_out, Tensor& kc, Tensor& vc,
                                      const Tensor& tables, const Tensor& lens, Tensor& out, Tensor& lse,
                                      absl::Span<const Warm> warm) {
  TESSERA_ASSIGN_OR_RETURN(const kernels::QkRopeCacheArgs a,
                           QkRopeCacheArgsOf(q, k, v, positions, slots, q_norm, k_norm, eps, inv_freq, scale, q_out, kc, vc, nullptr));
  TRY(CheckPagedAttention(q_out, kc, vc, tables, lens, out, lse));
  if (warm.size() > size_t(kernels::kMaxL2Warm))
    return Bad("decode_attention", absl::StrCat("warm: ", warm.size(), " ranges, at most ", kernels::kMaxL2Warm));
  kernels::L2Range ranges[kernels::kMaxL2Warm];
  for (size_t i = 0; i < warm.size(); ++i) {
    const std::string name = absl::StrCat("warm[", i, "]");
    if (warm[i].t == nullptr) return Bad("decode_attention", absl::StrCat(name, " names no tensor"));
    TRY(CheckTensors("decode_attention", device(), {{name.c_str(), warm[i].t}}));
    if (warm[i].bytes < 0 || warm[i].bytes > int64_t(warm[i].t->nbytes()))
      return Bad("decode_attention", absl::StrCat(name, ": ", warm[i].bytes, " bytes, expected 0 to the tensor's ",
                                                  warm[i].t->nbytes()));
    ranges[i] = {warm[i].t->data(), warm[i].bytes};
  }
  const bool on_host = slots.device().kind == DeviceKind::kCpu && tables.device().kind == DeviceKind::kCpu &&
                       lens.device().kind == DeviceKind::kCpu;
  if (on_host || !trust_device_indices_) {  // each row's new token is the last of its context
    TESSERA_ASSIGN_OR_RETURN(const std::vector<int32_t> hs, ReadIndices(*this, slots));
    TESSERA_ASSIGN_OR_RETURN(const std::vector<int32_t> ht, ReadIndices(*this, tables));
    TESSERA_ASSIGN_OR_RETURN(const std::vector<int32_t> hl, ReadIndices(*this, lens));
    const int64_t bs = kc.dim(1), maxb = tables.dim(1);
    for (size_t i = 0; i < hs.size(); ++i) {
      const int64_t last = hl[i] - 1, slot = int64_t(ht[i * maxb + last / bs]) * bs + last % bs;
      if (hs[i] != slot)
        return Bad("decode_attention", absl::StrCat("slots[", i, "] = ", hs[i], " is not the slot of the context's last token (",
                                                    "position ", last, " of row ", i, ": slot ", slot, ")"));
    }
  }
  return DoDecodeAttention(a, q.dtype(), positions, slots, q_out, kc, vc, tables, lens, out, lse, {ranges, warm.size()});
}

absl::StatusOr<kernels::QkRopeCacheArgs> Backend::QkRopeCacheArgsOf(const Tensor& q, const Tensor& k, const Tensor& v,
                                                                    const Tensor& positions, const Tensor& slots,
                                                                    const Tensor* q_norm, const Tensor* k_norm, float eps,
                                                                    absl::Span<const float> inv_freq, float scale,
                                                                    Tensor& q_out, Tensor& kc, Tensor& vc, Tensor* k_out) {
  const char* op = "qk_rope_cache";
  TRY(CheckTensors(op, device(), {{"q", &q}, {"k", &k}, {"v", &v}, {"positions", &positions}, {"q_out", &q_out},
                                  {"k_cache", &kc}, {"v_cache", &vc}}));
  TRY(CheckIndexTensor(op, device(), "slots", slots));
  if (q.rank() != 3 || k.rank() != 3 || !Float(q.dtype()))
    return Bad(op, absl::StrCat("q [tokens, heads, dim] and k [tokens, kv_heads, dim] must be f32/bf16, got ", q.ShapeString(),
                                " and ", k.ShapeString()));
  const int64_t t = q.dim(0), d = q.dim(2);
  if (k.dim(0) != t || k.dim(2) != d) return Bad(op, absl::StrCat("k ", k.ShapeString(), " must be [", t, ", kv_heads, ", d, "]"));
  TRY(SameShape(op, "v", v, "k", k));
  TRY(SameShape(op, "q_out", q_out, "q", q));
  for (auto [n, x] : {std::pair<const char*, const Tensor*>{"k", &k}, {"v", &v}, {"q_out", &q_out}, {"k_cache", &kc},
                      {"v_cache", &vc}})
    TRY(SameDType(op, n, *x, "q", q));
  if (kc.rank() != 4 || kc.dim(2) != k.dim(1) || kc.dim(3) != d)
    return Bad(op, absl::StrCat("k_cache must be [blocks, block_size, ", k.dim(1), ", ", d, "], got ", kc.ShapeString()));
  TRY(SameShape(op, "v_cache", vc, "k_cache", kc));
  if (d % 2 != 0 || d > kernels::kRopeMaxHeadDim || static_cast<int64_t>(inv_freq.size()) != d / 2)
    return Bad(op, absl::StrCat("head dim ", d, " needs ", d / 2, " frequencies (got ", inv_freq.size(), ") and at most ",
                                kernels::kRopeMaxHeadDim));
  TRY(Vec(op, "positions", positions, t, DType::kI32));
  TRY(Vec(op, "slots", slots, t, DType::kI32));
  if ((q_norm == nullptr) != (k_norm == nullptr)) return Bad(op, "q_norm and k_norm go together");
  kernels::QkRopeCacheArgs a;
  if (q_norm != nullptr) {
    TRY(CheckTensors(op, device(), {{"q_norm", q_norm}, {"k_norm", k_norm}}));
    for (auto [n, x] : {std::pair<const char*, const Tensor*>{"q_norm", q_norm}, {"k_norm", k_norm}}) {
      TRY(SameDType(op, n, *x, "q", q));
      if (x->rank() != 1 || x->dim(0) != d) return Bad(op, absl::StrCat(n, " ", x->ShapeString(), " must be [", d, "]"));
    }
    if (!(eps > 0)) return Bad(op, absl::StrCat("eps must be > 0, got ", eps));
    a.q_norm = q_norm->data(), a.k_norm = k_norm->data();
  }
  if (slots.device().kind == DeviceKind::kCpu || !trust_device_indices_) {
    TESSERA_ASSIGN_OR_RETURN(const std::vector<int32_t> hs, ReadIndices(*this, slots));
    TRY(CheckCacheSlots(kc, hs.data(), static_cast<int64_t>(hs.size())));
  }
  a.q = q.data(), a.k = k.data(), a.v = v.data(), a.pos = positions.data_as<int32_t>();
  a.tokens = t, a.q_heads = q.dim(1), a.kv_heads = k.dim(1), a.head_dim = d, a.eps = eps;
  a.inv_freq = inv_freq.data(), a.scale = scale;
  a.q_out = q_out.data(), a.k_cache = kc.data(), a.v_cache = vc.data();
  if (k_out != nullptr) {
    TRY(CheckTensors(op, device(), {{"k_out", k_out}}));
    TRY(SameShape(op, "k_out", *k_out, "k", k));
    TRY(SameDType(op, "k_out", *k_out, "k", k));
    a.k_out = k_out->data();
  }
  return a;
}

absl::Status Backend::Sample(const Tensor& logits, const Tensor& temperature, const Tensor& top_k, const Tensor& top_p,
                             const Tensor& seed, const Tensor& offset, Tensor& token, Tensor& logprob) {
  const char* op = "sample";
  TRY(CheckTensors(op, device(), {{"logits", &logits}, {"temperature", &temperature}, {"top_k", &top_k}, {"top_p", &top_p},
                                  {"seed", &seed}, {"offset", &offset}, {"token", &token}, {"logprob", &logprob}}));
  if (logits.rank() != 2 || !Float(logits.dtype()) || logits.dim(1) == 0)
    return Bad(op, absl::StrCat("logits must be f32/bf16 [n, v] with v > 0, got ", logits.ShapeString()));
  int64_t n = logits.dim(0);
  TRY(Vec(op, "temperature", temperature, n, DType::kF32));
  TRY(Vec(op, "top_k", top_k, n, DType::kI32));
  TRY(Vec(op, "top_p", top_p, n, DType::kF32));
  TRY(Vec(op, "seed", seed, n, DType::kI64));
  TRY(Vec(op, "offset", offset, n, DType::kI64));
  TRY(Vec(op, "token", token, n, DType::kI32));
  TRY(Vec(op, "logprob", logprob, n, DType::kF32));
  return DoSample(logits, temperature, top_k, top_p, seed, offset, token, logprob);
}

absl::Status Backend::SumSquares(const Tensor& x, Tensor& out) {
  TRY(CheckTensors("sum_squares", device(), {{"x", &x}, {"out", &out}}));
  if (!Float(x.dtype())) return Bad("sum_squares", "x must be f32 or bf16");
  TRY(Vec("sum_squares", "out", out, 1, DType::kF32));
  return DoSumSquares(x, out);
}

absl::Status Backend::Scale(Tensor& x, float s) {
  TRY(CheckTensors("scale", device(), {{"x", &x}}));
  if (!Float(x.dtype())) return Bad("scale", "x must be f32 or bf16");
  return DoScale(x, s);
}

absl::Status Backend::Axpby(float alpha, const Tensor& x, float beta, Tensor& y) {
  TRY(CheckTensors("axpby", device(), {{"x", &x}, {"y", &y}}));
  if (!Float(x.dtype()) || !Float(y.dtype())) return Bad("axpby", "x and y must be f32 or bf16");
  TRY(SameShape("axpby", "x", x, "y", y));
  return DoAxpby(alpha, x, beta, y);
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(Device d) {
  if (d.kind == DeviceKind::kCpu) return MakeCpuBackend();
  return MakeCudaBackend(d.index);
}

}  // namespace tessera::runtime
