// The CPU backend: host memory, synchronous ops, the reference implementations.
#include <cstring>

#include "kernels/adamw/adamw.h"
#include "kernels/attention/attention.h"

#include <cmath>
#include "kernels/cast/cast.h"
#include "kernels/cross_entropy/cross_entropy.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/embedding/embedding.h"
#include "kernels/reduce/reduce.h"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/rope/rope.h"
#include "kernels/sampling/sampling.h"
#include "kernels/gemm/gemm.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/swiglu/swiglu.h"
#include "worker/runtime/backend.h"

namespace tessera::runtime {
namespace {

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::Cpu(); }
  Allocator* allocator() override { return CpuAllocator(); }
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::Status CopyFromHost(const void* src, Tensor& dst) override {
    std::memcpy(dst.data(), src, dst.nbytes());
    return absl::OkStatus();
  }
  absl::Status CopyToHost(const Tensor& src, void* dst) override {
    std::memcpy(dst, src.data(), src.nbytes());
    return absl::OkStatus();
  }
  absl::Status Fill(Tensor& t, uint8_t byte) override {
    std::memset(t.data(), byte, t.nbytes());
    return absl::OkStatus();
  }

 protected:
  absl::Status DoCopy2D(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t row_bytes,
                        int64_t rows) override {
    for (int64_t r = 0; r < rows; ++r)
      std::memmove(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch, row_bytes);
    return absl::OkStatus();
  }
  absl::Status DoCast(const Tensor& x, Tensor& y) override {
    return kernels::CastCpu(x.data(), x.dtype(), y.data(), y.dtype(), x.numel());
  }
  absl::Status DoRmsNormForward(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd) override {
    return kernels::RmsNormForwardCpu(x.data(), w.data(), y.data(), rstd.data_as<float>(), x.dim(0), x.dim(1), eps, x.dtype());
  }
  absl::Status DoRmsNormBackward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx,
                                 Tensor& dw, const Tensor* add) override {
    return kernels::RmsNormBackwardCpu(dy.data(), x.data(), w.data(), rstd.data_as<float>(), dx.data(),
                                       dw.data_as<float>(), x.dim(0), x.dim(1), x.dtype(),
                                       add != nullptr ? add->data() : nullptr);
  }
  absl::Status DoSwiGluForward(const Tensor& g, const Tensor& u, Tensor& y) override {
    return kernels::SwiGluForwardCpu(g.data(), u.data(), y.data(), g.numel(), g.dtype());
  }
  absl::Status DoSwiGluBackward(const Tensor& dy, const Tensor& g, const Tensor& u, Tensor& dg, Tensor& du,
                                Tensor* y) override {
    return kernels::SwiGluBackwardCpu(dy.data(), g.data(), u.data(), dg.data(), du.data(), g.numel(), g.dtype(),
                                      y != nullptr ? y->data() : nullptr);
  }
  absl::Status DoGemm(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha, float beta,
                      const Tensor* c_in) override {
    int64_t m = c.dim(0), n = c.dim(1), k = ta ? a.dim(0) : a.dim(1);
    return kernels::GemmCpu(a.data(), ta, b.data(), tb, c.data(), m, n, k, alpha, beta, a.dtype(), c.dtype(),
                            c_in != nullptr ? c_in->data() : nullptr);
  }
  absl::Status DoEmbeddingForward(const Tensor& ids, const Tensor& table, int64_t vs, Tensor& out) override {
    return kernels::EmbeddingForwardCpu(ids.data_as<int32_t>(), table.data(), out.data(), ids.dim(0), table.dim(0),
                                        table.dim(1), vs, table.dtype());
  }
  absl::Status DoEmbeddingBackward(const Tensor& ids, const Tensor& dout, int64_t vs, Tensor& dtable) override {
    return kernels::EmbeddingBackwardCpu(ids.data_as<int32_t>(), dout.data(), dtable.data_as<float>(), ids.dim(0),
                                         dtable.dim(0), dtable.dim(1), vs, dout.dtype());
  }
  absl::Status DoRope(const Tensor& x, const Tensor& pos, const float* inv_freq, float scale, Tensor& y,
                      float sign) override {
    return kernels::RopeCpu(x.data(), pos.data_as<int32_t>(), y.data(), x.dim(0), x.dim(1), x.dim(2), inv_freq, scale, sign,
                            x.dtype(), x.strides()[0], y.strides()[0]);
  }
  absl::Status DoCrossEntropyPartials(const Tensor& z, const Tensor& t, int64_t vs, Tensor& mx, Tensor& sm, Tensor& dt,
                                      Tensor& tg) override {
    return kernels::CrossEntropyPartialsCpu(z.data(), t.data_as<int32_t>(), mx.data_as<float>(), sm.data_as<float>(),
                                            dt.data_as<float>(), tg.data_as<float>(), z.dim(0), z.dim(1), vs, z.dtype());
  }
  absl::Status DoCrossEntropyRescale(const Tensor& mx, const Tensor& gmx, Tensor& sm) override {
    return kernels::CrossEntropyRescaleCpu(mx.data_as<float>(), gmx.data_as<float>(), sm.data_as<float>(), mx.numel());
  }
  absl::Status DoCrossEntropyLoss(const Tensor& mx, const Tensor& sm, const Tensor& tg, const Tensor& t, float scale,
                                  Tensor& lse, Tensor& dl, Tensor& loss) override {
    return kernels::CrossEntropyLossCpu(mx.data_as<float>(), sm.data_as<float>(), tg.data_as<float>(), t.data_as<int32_t>(),
                                        scale, lse.data_as<float>(), dl.data_as<float>(), loss.data_as<float>(), mx.numel());
  }
  absl::Status DoCrossEntropyBackward(const Tensor& z, const Tensor& t, int64_t vs, const Tensor& lse, const Tensor& dl,
                                      Tensor& dz, const Tensor* dh, const Tensor* h) override {
    return kernels::CrossEntropyBackwardCpu(z.data(), t.data_as<int32_t>(), lse.data_as<float>(), dl.data_as<float>(),
                                            dz.data(), z.dim(0), z.dim(1), vs, z.dtype(),
                                            dh ? dh->data_as<float>() : nullptr, h ? h->data_as<float>() : nullptr);
  }
  absl::Status DoSumSquares(const Tensor& x, Tensor& out) override {
    return kernels::SumSquaresCpu(x.data(), x.numel(), x.dtype(), out.data_as<float>());
  }
  absl::Status DoScale(Tensor& x, float s) override { return kernels::ScaleCpu(x.data(), x.numel(), s, x.dtype()); }
  absl::Status DoAxpby(float alpha, const Tensor& x, float beta, Tensor& y) override {
    return kernels::AxpbyCpu(alpha, x.data(), x.dtype(), beta, y.data(), y.dtype(), x.numel());
  }
  absl::Status DoAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu, bool causal,
                                  Tensor& out, Tensor& lse) override {
    return kernels::AttentionForwardCpu(q.data(), k.data(), v.data(), cu.data_as<int32_t>(), out.data(), lse.data_as<float>(),
                                        kernels::AttentionDims{q.dim(0), q.dim(1), k.dim(1), q.dim(2), cu.dim(0) - 1, causal, static_cast<float>(1.0 / std::sqrt(double(q.dim(2))))}, q.dtype());
  }
  absl::Status DoAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu, bool causal,
                                   const Tensor& out, const Tensor& dout, const Tensor& lse, Tensor& dq, Tensor& dk,
                                   Tensor& dv) override {
    return kernels::AttentionBackwardCpu(q.data(), k.data(), v.data(), cu.data_as<int32_t>(), out.data(), dout.data(),
                                         lse.data_as<float>(), dq.data(), dk.data(), dv.data(), kernels::AttentionDims{q.dim(0), q.dim(1), k.dim(1), q.dim(2), cu.dim(0) - 1, causal, static_cast<float>(1.0 / std::sqrt(double(q.dim(2))))}, q.dtype());
  }
  absl::Status DoAttentionMerge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) override {
    return kernels::AttentionMergeCpu(out.data(), lse.data_as<float>(), out_b.data(), lse_b.data_as<float>(),
                                      out.dim(0) * out.dim(1), out.dim(2), out.dtype());
  }
  absl::Status DoSample(const Tensor& z, const Tensor& temp, const Tensor& k, const Tensor& p, const Tensor& seed,
                        const Tensor& offset, Tensor& token, Tensor& logprob) override {
    kernels::SampleArgs a{temp.data_as<float>(), k.data_as<int32_t>(), p.data_as<float>(), seed.data_as<uint64_t>(),
                          offset.data_as<uint64_t>()};
    return kernels::SampleCpu(z.data(), z.dim(0), z.dim(1), z.dtype(), a, token.data_as<int32_t>(), logprob.data_as<float>());
  }
  absl::Status DoPagedAttention(const Tensor& q, const Tensor& kc, const Tensor& vc, const Tensor& bt, const Tensor& cl,
                                Tensor& out, Tensor& lse) override {
    return kernels::PagedAttentionCpu(q.data(), kc.data(), vc.data(), bt.data_as<int32_t>(), cl.data_as<int32_t>(), out.data(),
                                      lse.data_as<float>(), kernels::PagedDims{q.dim(0), q.dim(1), kc.dim(2), q.dim(2), kc.dim(1), bt.dim(1), static_cast<float>(1.0 / std::sqrt(double(q.dim(2))))}, q.dtype());
  }
  absl::Status DoKvCacheWrite(const Tensor& k, const Tensor& v, const Tensor& slots, Tensor& kc, Tensor& vc) override {
    return kernels::KvCacheWriteCpu(k.data(), v.data(), slots.data_as<int32_t>(), kc.data(), vc.data(), k.dim(0),
                                    k.nbytes() / std::max<int64_t>(k.dim(0), 1));
  }
  absl::Status DoSelect(const Tensor& src, const Tensor& from, const Tensor& values, Tensor& out) override {
    return kernels::SelectCpu(src.data_as<int32_t>(), from.data_as<int32_t>(), values.data_as<int32_t>(),
                              out.data_as<int32_t>(), out.numel());
  }
  absl::Status DoDecodeLinear(const kernels::DecodeLinearArgs& a, DType t) override { return kernels::DecodeLinearCpu(a, t); }
  absl::Status DoQkRopeCache(const kernels::QkRopeCacheArgs& a, DType t, const Tensor&, const Tensor& slots) override {
    kernels::QkRopeCacheArgs h = a;
    h.slots = slots.data_as<int32_t>();
    return kernels::QkRopeCacheCpu(h, t);
  }
  absl::Status DoAdamW(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWParams& a, Tensor* lowp) override {
    return kernels::AdamWCpu(p.data_as<float>(), g.data(), g.dtype(), m.data_as<float>(), v.data_as<float>(),
                             lowp ? lowp->data_as<uint16_t>() : nullptr, p.numel(),
                             {a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.step, a.grad_scale});
  }
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace tessera::runtime
