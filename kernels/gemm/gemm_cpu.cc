// CPU reference (see the header); reductions accumulate in double.
#include <cblas.h>
#include <dlfcn.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

#include "common/status.h"
#include "kernels/cast/cast.h"
#include "kernels/common/host_elem.h"
#include "kernels/gemm/gemm.h"

namespace tessera::kernels {
namespace {
// OpenBLAS is loaded at first use, not linked: a library linked into an executable gets
// its thread-local storage carved out of every thread's stack, and OpenBLAS's (60 KiB)
// left civetweb's 100 KiB threads (the Prometheus exposer of the agent) too little
// stack — the agent crashed when scraped (docs/operations.md). Loaded with dlopen, its
// TLS is allocated on demand instead.
using Sgemm = decltype(&cblas_sgemm);
absl::StatusOr<Sgemm> LoadSgemm() {
  std::string errors;
  for (const char* name : {"libopenblas.so.0", "libopenblas.so", "libblas.so.3"}) {
    void* lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      absl::StrAppend(&errors, errors.empty() ? "" : "; ", dlerror());
      continue;
    }
    if (auto fn = reinterpret_cast<Sgemm>(dlsym(lib, "cblas_sgemm")); fn != nullptr) return fn;
    absl::StrAppend(&errors, errors.empty() ? "" : "; ", name, " has no cblas_sgemm");
  }
  return absl::UnavailableError(absl::StrCat("cannot load OpenBLAS for CPU GEMMs: ", errors));
}
absl::StatusOr<Sgemm> GetSgemm() {
  static const absl::StatusOr<Sgemm> loaded = LoadSgemm();  // thread-safe static init
  return loaded;
}
}  // namespace

namespace {
std::atomic<int> g_tune{-1};  // -1: TESSERA_GEMM_TUNE decides
}  // namespace

void SetGemmTuning(bool on) { g_tune.store(on ? 1 : 0); }

bool GemmTuning() {
  int v = g_tune.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* e = std::getenv("TESSERA_GEMM_TUNE");
    int unset = -1;
    g_tune.compare_exchange_strong(unset, e != nullptr && e[0] == '1' ? 1 : 0);
    v = g_tune.load(std::memory_order_relaxed);
  }
  return v == 1;
}

absl::Status GemmCpu(const void* a, bool ta, const void* b, bool tb, void* c, int64_t m, int64_t n, int64_t k, float alpha,
                     float beta, DType t, DType ct, const void* c_in) {
  if (m == 0 || n == 0) return absl::OkStatus();
  if (c_in != nullptr && c_in != c && beta != 0)  // C = ... + beta C_in: start from a copy of C_in
    std::memcpy(c, c_in, static_cast<size_t>(m * n) * DTypeSize(ct));
  TESSERA_ASSIGN_OR_RETURN(Sgemm cblas_sgemm, GetSgemm());
  if (t == DType::kF32) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha,
                static_cast<const float*>(a), ta ? m : k, static_cast<const float*>(b), tb ? k : n, beta,
                static_cast<float*>(c), n);
    return absl::OkStatus();
  }
  std::vector<float> af(m * k), bf(k * n), cf(ct == DType::kF32 ? 0 : m * n);
  TESSERA_RETURN_IF_ERROR(CastCpu(a, t, af.data(), DType::kF32, m * k));
  TESSERA_RETURN_IF_ERROR(CastCpu(b, t, bf.data(), DType::kF32, k * n));
  // An f32 C (bf16 inputs, f32 gradient) is accumulated in place; a bf16 one through f32.
  float* cp = ct == DType::kF32 ? static_cast<float*>(c) : cf.data();
  if (ct != DType::kF32 && beta != 0) TESSERA_RETURN_IF_ERROR(CastCpu(c, ct, cp, DType::kF32, m * n));
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, af.data(),
              ta ? m : k, bf.data(), tb ? k : n, beta, cp, n);
  return ct == DType::kF32 ? absl::OkStatus() : CastCpu(cp, DType::kF32, c, ct, m * n);
}

}  // namespace tessera::kernels
