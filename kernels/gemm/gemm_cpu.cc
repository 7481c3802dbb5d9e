// CPU reference (see the header); reductions accumulate in double.
#include <cblas.h>

#include <cmath>
#include <vector>

#include "common/status.h"
#include "kernels/cast/cast.h"
#include "kernels/common/host_elem.h"
#include "kernels/gemm/gemm.h"

namespace tessera::kernels {

absl::Status GemmCpu(const void* a, bool ta, const void* b, bool tb, void* c, int64_t m, int64_t n, int64_t k, float alpha,
                     float beta, DType t) {
  if (m == 0 || n == 0) return absl::OkStatus();
  if (t == DType::kF32) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha,
                static_cast<const float*>(a), ta ? m : k, static_cast<const float*>(b), tb ? k : n, beta,
                static_cast<float*>(c), n);
    return absl::OkStatus();
  }
  std::vector<float> af(m * k), bf(k * n), cf(m * n);
  TESSERA_RETURN_IF_ERROR(CastCpu(a, t, af.data(), DType::kF32, m * k));
  TESSERA_RETURN_IF_ERROR(CastCpu(b, t, bf.data(), DType::kF32, k * n));
  if (beta != 0) TESSERA_RETURN_IF_ERROR(CastCpu(c, t, cf.data(), DType::kF32, m * n));
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, af.data(),
              ta ? m : k, bf.data(), tb ? k : n, beta, cf.data(), n);
  return CastCpu(cf.data(), DType::kF32, c, t, m * n);
}

}  // namespace tessera::kernels
