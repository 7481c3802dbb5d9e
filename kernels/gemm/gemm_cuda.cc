// GEMM through cuBLASLt. Row-major C = op(A) op(B) is computed as the column-major
// C^T = op(B)^T op(A)^T, i.e. cuBLAS sees B as its first operand.
//
// Plans: a GEMM's descriptors and algorithm depend only on its shape, transposes, dtypes,
// workspace size and device, so they are made once per such key and kept (a training
// step runs the same few dozen shapes thousands of times; making them cost seven
// descriptor calls and a heuristic query per GEMM on the host). At most kMaxPlans keys
// are kept — generation's shapes follow the batch — and past that a GEMM makes its
// descriptors for the call, as before.
//
// TESSERA_GEMM_TUNE=1 (or SetGemmTuning): a key's first GEMM large enough to matter times cuBLASLt's top
// heuristic candidates on the stream (into a scratch output, so the call's C is
// untouched) and keeps the fastest. The choice can differ between runs (timing noise),
// and with it the last bits of a result, as with PyTorch's cudnn.benchmark — off unless
// asked for. Not during CUDA graph capture (the timing waits for the stream).
#include <cuda_runtime.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/gemm/cublaslt_loader.h"
#include "kernels/gemm/gemm.h"

namespace tessera::kernels {
namespace {
absl::Status Lt(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cublasLt ", what, ": status ", static_cast<int>(s)));
}
struct Descs {
  const CublasLt* api = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  Descs() = default;
  Descs(const Descs&) = delete;
  Descs& operator=(const Descs&) = delete;
  ~Descs() {
    if (pref) api->MatmulPreferenceDestroy(pref);
    if (c) api->MatrixLayoutDestroy(c);
    if (b) api->MatrixLayoutDestroy(b);
    if (a) api->MatrixLayoutDestroy(a);
    if (op) api->MatmulDescDestroy(op);
  }
};
struct Plan {
  Descs d;
  cublasLtMatmulAlgo_t algo{};
  bool tuned = false;
};
using Key = std::tuple<int, int64_t, int64_t, int64_t, bool, bool, int, int, size_t>;
constexpr size_t kMaxPlans = 1024;
constexpr int kCandidates = 8;
// Worth timing: ~1 GFLOP and up (a 1B model's projections are 10-100x that), or, for the
// few rows of a decode step (memory-bound), a pass over 1 MiB of operands and up.
constexpr double kTuneMinFlops = 1e9, kTuneMinBytes = 1 << 20;

std::mutex g_mu;
std::map<Key, std::unique_ptr<Plan>>& Plans() {
  static auto* plans = new std::map<Key, std::unique_ptr<Plan>>();
  return *plans;
}

absl::Status MakeDescs(const CublasLt* api, Descs& d, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                       cudaDataType_t dt, cudaDataType_t cdt, size_t workspace_bytes) {
  d.api = api;
  absl::Status s;
  if (!(s = Lt(api->MatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc")).ok()) return s;
  cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  api->MatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa));
  api->MatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb));
  // First operand: B (row-major [k,n], or [n,k] if tb) seen column-major.
  if (!(s = Lt(api->MatrixLayoutCreate(&d.a, dt, tb ? k : n, tb ? n : k, tb ? k : n), "layout A")).ok()) return s;
  // Second operand: A (row-major [m,k], or [k,m] if ta) seen column-major.
  if (!(s = Lt(api->MatrixLayoutCreate(&d.b, dt, ta ? m : k, ta ? k : m, ta ? m : k), "layout B")).ok()) return s;
  if (!(s = Lt(api->MatrixLayoutCreate(&d.c, cdt, n, m, n), "layout C")).ok()) return s;
  if (!(s = Lt(api->MatmulPreferenceCreate(&d.pref), "preference")).ok()) return s;
  api->MatmulPreferenceSetAttribute(d.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                    sizeof(workspace_bytes));
  return absl::OkStatus();
}

// The fastest of `found` candidates, timed on `stream` writing into a scratch D (C read
// from `c_read` when beta != 0); the first candidate if timing cannot run.
cublasLtMatmulAlgo_t Fastest(const CublasLt* api, cublasLtHandle_t lt, const Descs& d,
                             const cublasLtMatmulHeuristicResult_t* h, int found, const void* a, const void* b,
                             const void* c_read, size_t c_bytes, float alpha, float beta, void* workspace,
                             size_t workspace_bytes, cudaStream_t stream) {
  cublasLtMatmulAlgo_t best = h[0].algo;
  void* scratch = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaMallocAsync(&scratch, c_bytes, stream) != cudaSuccess || cudaEventCreate(&start) != cudaSuccess ||
      cudaEventCreate(&stop) != cudaSuccess) {
    (void)cudaGetLastError();
  } else {
    float best_ms = 0;
    for (int i = 0; i < found; ++i) {
      auto run = [&] {
        return api->Matmul(lt, d.op, &alpha, b, d.a, a, d.b, &beta, c_read, d.c, scratch, d.c, &h[i].algo, workspace,
                           workspace_bytes, stream) == CUBLAS_STATUS_SUCCESS;
      };
      if (!run()) continue;  // warm-up; an algorithm that fails is not a candidate
      cudaEventRecord(start, stream);
      bool ok = true;
      for (int r = 0; r < 3 && ok; ++r) ok = run();
      cudaEventRecord(stop, stream);
      float ms = 0;
      if (!ok || cudaEventSynchronize(stop) != cudaSuccess || cudaEventElapsedTime(&ms, start, stop) != cudaSuccess)
        continue;
      if (best_ms == 0 || ms < best_ms) best_ms = ms, best = h[i].algo;
    }
  }
  if (scratch != nullptr) cudaFreeAsync(scratch, stream);
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  (void)cudaGetLastError();
  return best;
}
}  // namespace

absl::Status GemmCuda(const void* a, bool ta, const void* b, bool tb, void* c, int64_t m, int64_t n, int64_t k,
                      float alpha, float beta, DType t, DType ct, void* handle, void* workspace, size_t workspace_bytes,
                      void* stream, const void* c_in) {
  if (m == 0 || n == 0) return absl::OkStatus();
  cudaDataType_t dt = t == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  cudaDataType_t cdt = ct == DType::kF32 ? CUDA_R_32F : CUDA_R_16BF;
  const absl::StatusOr<const CublasLt*> loaded = GetCublasLt();
  if (!loaded.ok()) return loaded.status();
  const CublasLt* api = *loaded;
  auto lt = static_cast<cublasLtHandle_t>(handle);
  auto st = static_cast<cudaStream_t>(stream);
  const void* c_read = c_in != nullptr ? c_in : c;
  int device = 0;
  cudaGetDevice(&device);
  const Key key{device, m, n, k, ta, tb, static_cast<int>(t), static_cast<int>(ct), workspace_bytes};
  const Descs* kept = nullptr;  // a kept plan's descriptors (never freed) and, copied under the lock, its algorithm
  cublasLtMatmulAlgo_t algo{};
  bool tuned = false;
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto it = Plans().find(key);
    if (it != Plans().end()) kept = &it->second->d, algo = it->second->algo, tuned = it->second->tuned;
  }
  const double bytes = double(m * k + k * n + m * n) * (t == DType::kF32 ? 4.0 : 2.0);
  const bool tune = GemmTuning() && (2.0 * double(m) * double(n) * double(k) >= kTuneMinFlops || bytes >= kTuneMinBytes);
  if (kept != nullptr && (tuned || !tune))
    return Lt(api->Matmul(lt, kept->op, &alpha, b, kept->a, a, kept->b, &beta, c_read, kept->c, c, kept->c, &algo,
                          workspace, workspace_bytes, st),
              "matmul");

  // A new key (or one to time): descriptors and the heuristic's candidates.
  auto fresh = std::make_unique<Plan>();
  TESSERA_RETURN_IF_ERROR(MakeDescs(api, fresh->d, ta, tb, m, n, k, dt, cdt, workspace_bytes));
  cublasLtMatmulHeuristicResult_t h[kCandidates];
  int found = 0;
  TESSERA_RETURN_IF_ERROR(Lt(api->MatmulAlgoGetHeuristic(lt, fresh->d.op, fresh->d.a, fresh->d.b, fresh->d.c,
                                                         fresh->d.c, fresh->d.pref, tune ? kCandidates : 1, h, &found),
                             "heuristic"));
  if (found == 0) return absl::UnimplementedError(absl::StrCat("cublasLt has no algorithm for gemm m=", m, " n=", n, " k=", k));
  fresh->algo = h[0].algo;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(st, &capturing);
  if (tune && found > 1 && capturing == cudaStreamCaptureStatusNone) {
    const size_t c_bytes = static_cast<size_t>(m) * n * (ct == DType::kF32 ? 4 : 2);
    fresh->algo = Fastest(api, lt, fresh->d, h, found, a, b, c_read, c_bytes, alpha, beta, workspace, workspace_bytes, st);
    fresh->tuned = true;
  } else if (tune && found <= 1) {
    fresh->tuned = true;  // nothing to choose between
  }
  const cublasStatus_t rs = api->Matmul(lt, fresh->d.op, &alpha, b, fresh->d.a, a, fresh->d.b, &beta, c_read,
                                        fresh->d.c, c, fresh->d.c, &fresh->algo, workspace, workspace_bytes, st);
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto& plans = Plans();
    auto it = plans.find(key);
    if (it == plans.end()) {
      if (plans.size() < kMaxPlans) plans.emplace(key, std::move(fresh));
    } else if (fresh->tuned && !it->second->tuned) {
      it->second->algo = fresh->algo;  // the descriptors in place stay (another thread may be using them)
      it->second->tuned = true;
    }
  }
  return Lt(rs, "matmul");
}
}  // namespace tessera::kernels
