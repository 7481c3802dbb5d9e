// cuBLASLt, loaded on first use (dlopen) instead of linked. Linked, cuBLASLt's large
// static TLS block goes on the stack of every thread of the process, and threads that
// ask for small stacks then fail to start — civetweb's (the Prometheus /metrics
// server) among them, so any daemon that links the CUDA backend (agent, `tessera
// local`) could not serve metrics. Loaded with dlopen, its TLS is allocated per thread
// on first use and only processes that run a GEMM on a GPU load it.
#pragma once

#include <cublasLt.h>

#include "absl/status/statusor.h"

namespace tessera::kernels {

struct CublasLt {
  decltype(&cublasLtCreate) Create;
  decltype(&cublasLtDestroy) Destroy;
  decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
  decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmul) Matmul;
};

// The library's entry points (loaded once, thread-safe); UNAVAILABLE naming the
// library and the loader's error when it cannot be found or lacks a symbol.
absl::StatusOr<const CublasLt*> GetCublasLt();

}  // namespace tessera::kernels
