// The CPU backend: host memory, synchronous ops, the reference implementations.
#include <cstring>

#include "kernels/adamw/adamw.h"
#include "kernels/cast/cast.h"
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
  absl::Status DoCast(const Tensor& x, Tensor& y) override {
    return kernels::CastCpu(x.data(), x.dtype(), y.data(), y.dtype(), x.numel());
  }
  absl::Status DoRmsNormForward(const Tensor& x, const Tensor& w, float eps, Tensor& y, Tensor& rstd) override {
    return kernels::RmsNormForwardCpu(x.data(), w.data(), y.data(), rstd.data_as<float>(), x.dim(0), x.dim(1), eps, x.dtype());
  }
  absl::Status DoRmsNormBackward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd, Tensor& dx,
                                 Tensor& dw) override {
    return kernels::RmsNormBackwardCpu(dy.data(), x.data(), w.data(), rstd.data_as<float>(), dx.data(),
                                       dw.data_as<float>(), x.dim(0), x.dim(1), x.dtype());
  }
  absl::Status DoSwiGluForward(const Tensor& g, const Tensor& u, Tensor& y) override {
    return kernels::SwiGluForwardCpu(g.data(), u.data(), y.data(), g.numel(), g.dtype());
  }
  absl::Status DoSwiGluBackward(const Tensor& dy, const Tensor& g, const Tensor& u, Tensor& dg, Tensor& du) override {
    return kernels::SwiGluBackwardCpu(dy.data(), g.data(), u.data(), dg.data(), du.data(), g.numel(), g.dtype());
  }
  absl::Status DoGemm(const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c, float alpha, float beta) override {
    int64_t m = c.dim(0), n = c.dim(1), k = ta ? a.dim(0) : a.dim(1);
    return kernels::GemmCpu(a.data(), ta, b.data(), tb, c.data(), m, n, k, alpha, beta, a.dtype());
  }
  absl::Status DoAdamW(Tensor& p, const Tensor& g, Tensor& m, Tensor& v, const AdamWParams& a, Tensor* lowp) override {
    return kernels::AdamWCpu(p.data_as<float>(), g.data(), g.dtype(), m.data_as<float>(), v.data_as<float>(),
                             lowp ? lowp->data_as<uint16_t>() : nullptr, p.numel(),
                             {a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.step});
  }
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

}  // namespace tessera::runtime
