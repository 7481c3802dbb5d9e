// GEMM through cuBLASLt. Row-major C = op(A) op(B) is computed as the column-major
// C^T = op(B)^T op(A)^T, i.e. cuBLAS sees B as its first operand.
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "kernels/gemm/cublaslt_loader.h"
#include "kernels/gemm/gemm.h"

namespace tessera::kernels {
namespace {
absl::Status Lt(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cublasLt ", what, ": status ", static_cast<int>(s)));
}
struct Descs {
  const CublasLt* api;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  ~Descs() {
    if (pref) api->MatmulPreferenceDestroy(pref);
    if (c) api->MatrixLayoutDestroy(c);
    if (b) api->MatrixLayoutDestroy(b);
    if (a) api->MatrixLayoutDestroy(a);
    if (op) api->MatmulDescDestroy(op);
  }
};
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
  Descs d{api};
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
  cublasLtMatmulHeuristicResult_t h;
  int found = 0;
  auto lt = static_cast<cublasLtHandle_t>(handle);
  if (!(s = Lt(api->MatmulAlgoGetHeuristic(lt, d.op, d.a, d.b, d.c, d.c, d.pref, 1, &h, &found), "heuristic")).ok())
    return s;
  if (found == 0) return absl::UnimplementedError(absl::StrCat("cublasLt has no algorithm for gemm m=", m, " n=", n, " k=", k));
  return Lt(api->Matmul(lt, d.op, &alpha, b, d.a, a, d.b, &beta, c_in != nullptr ? c_in : c, d.c, c, d.c, &h.algo,
                        workspace, workspace_bytes, static_cast<cudaStream_t>(stream)),
            "matmul");
}
}  // namespace tessera::kernels
