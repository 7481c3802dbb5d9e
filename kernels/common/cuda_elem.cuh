// Shared pieces of the CUDA kernels: bf16 <-> f32, launch checks.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tessera::kernels {

__device__ __forceinline__ float ToF(float v) { return v; }
__device__ __forceinline__ float ToF(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T FromF(float v);
template <> __device__ __forceinline__ float FromF<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 FromF<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

inline absl::Status LaunchStatus(const char* kernel) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(kernel, ": ", cudaGetErrorString(e)));
}

inline unsigned GridFor(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65535 * 8 ? (b > 0 ? b : 1) : 65535 * 8);
}

}  // namespace tessera::kernels
