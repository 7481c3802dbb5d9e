#include "worker/runtime/backend.h"

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

absl::Status Backend::Cast(const Tensor& x, Tensor& y) {
  TRY(CheckTensors("cast", device(), {{"x", &x}, {"y", &y}}));
  TRY(SameShape("cast", "x", x, "y", y));
  if (!Float(x.dtype()) || !Float(y.dtype())) return Bad("cast", "only f32 <-> bf16 casts are supported");
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
                                      Tensor& dw) {
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
  return DoRmsNormBackward(dy, x, w, rstd, dx, dw);
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

absl::Status Backend::SwiGluBackward(const Tensor& dy, const Tensor& gate, const Tensor& up, Tensor& dgate, Tensor& dup) {
  const char* op = "swiglu_backward";
  TRY(CheckTensors(op, device(), {{"dy", &dy}, {"gate", &gate}, {"up", &up}, {"dgate", &dgate}, {"dup", &dup}}));
  if (!Float(gate.dtype())) return Bad(op, "gate must be f32 or bf16");
  for (auto [n, t] : {std::pair<const char*, const Tensor*>{"dy", &dy}, {"up", &up}, {"dgate", &dgate}, {"dup", &dup}}) {
    TRY(SameShape(op, n, *t, "gate", gate));
    TRY(SameDType(op, n, *t, "gate", gate));
  }
  return DoSwiGluBackward(dy, gate, up, dgate, dup);
}

absl::Status Backend::Gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha, float beta) {
  const char* op = "gemm";
  TRY(CheckTensors(op, device(), {{"a", &a}, {"b", &b}, {"c", &c}}));
  if (a.rank() != 2 || b.rank() != 2 || c.rank() != 2)
    return Bad(op, absl::StrCat("a ", a.ShapeString(), ", b ", b.ShapeString(), ", c ", c.ShapeString(), " must be 2-D"));
  TRY(SameDType(op, "a", a, "b", b));
  TRY(SameDType(op, "a", a, "c", c));
  if (!Float(a.dtype())) return Bad(op, "only f32 and bf16 are supported");
  int64_t m = ta ? a.dim(1) : a.dim(0), k = ta ? a.dim(0) : a.dim(1);
  int64_t kb = tb ? b.dim(1) : b.dim(0), n = tb ? b.dim(0) : b.dim(1);
  if (k != kb)
    return Bad(op, absl::StrCat("inner dimensions differ: op(a) is [", m, ", ", k, "], op(b) is [", kb, ", ", n, "]"));
  if (c.dim(0) != m || c.dim(1) != n) return Bad(op, absl::StrCat("c is ", c.ShapeString(), ", expected [", m, ", ", n, "]"));
  return DoGemm(a, ta, b, tb, c, alpha, beta);
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

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(Device d) {
  if (d.kind == DeviceKind::kCpu) return MakeCpuBackend();
  return MakeCudaBackend(d.index);
}

}  // namespace tessera::runtime
