// Shared pieces of the CUDA kernels: bf16 <-> f32, launch checks.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/cuda_arch.h"

// Device code of Hopper's own kernels (wgmma, TMA and mbarriers, clusters, setmaxnreg)
// compiles in the 90a pass only; elsewhere such a kernel's body is a trap, and its
// launcher is not called there (HopperPaths below). The host pass sees the real body.
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TESSERA_SM90A 1
#else
#define TESSERA_SM90A 0
#endif

namespace tessera::kernels {

__device__ __forceinline__ float ToF(float v) { return v; }
__device__ __forceinline__ float ToF(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float ToF(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T FromF(float v);
template <> __device__ __forceinline__ float FromF<float>(float v) { return v; }
template <> __device__ __forceinline__ __nv_bfloat16 FromF<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half FromF<__half>(float v) { return __float2half_rn(v); }

// Block-wide reductions for blockDim.x == kThreads (a multiple of 32); every thread
// gets the result.
template <int kThreads, typename Op>
__device__ __forceinline__ float BlockReduce(float v, Op op) {
  const float identity = Op::kIdentity;
  __shared__ float partial[kThreads / 32];
  __shared__ float total;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffff, v, o));
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < kThreads / 32 ? partial[lane] : identity;
    for (int o = 16; o > 0; o >>= 1) t = op(t, __shfl_xor_sync(0xffffffff, t, o));
    if (lane == 0) total = t;
  }
  __syncthreads();
  float r = total;
  __syncthreads();  // `total` may be reused by the next reduction
  return r;
}
struct SumOp {
  static constexpr float kIdentity = 0.f;
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  static constexpr float kIdentity = -__builtin_huge_valf();
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

inline absl::Status LaunchStatus(const char* kernel) {
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(kernel, ": ", cudaGetErrorString(e)));
}

// compute(device) for the current device, remembered in `cache` per device (the first 16;
// a value is kept once it is > 0); `fallback` when there is no current device.
template <typename F>
inline int OncePerDevice(std::atomic<int> (&cache)[16], int fallback, F compute) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return fallback;
  if (dev < 16) {
    const int v = cache[dev].load(std::memory_order_relaxed);
    if (v > 0) return v;
  }
  const int v = compute(dev);
  if (dev < 16 && v > 0) cache[dev].store(v, std::memory_order_relaxed);
  return v;
}

// A device attribute of the current device, looked up once per device (the fallback
// where the lookup fails).
template <cudaDeviceAttr kAttr, int kFallback>
inline int CachedDeviceAttribute() {
  static std::atomic<int> cache[16] = {};
  return OncePerDevice(cache, kFallback, [](int dev) {
    int n = kFallback;
    cudaDeviceGetAttribute(&n, kAttr, dev);
    return n;
  });
}
// Multiprocessors of the current device (persistent and split-work launches size their
// grids with it).
inline int SmCount() { return CachedDeviceAttribute<cudaDevAttrMultiProcessorCount, 132>(); }
// The shared memory a block may opt into on the current device.
inline int OptinSharedMemory() { return CachedDeviceAttribute<cudaDevAttrMaxSharedMemoryPerBlockOptin, 0>(); }

// Whether the current device takes Hopper's own kernels: a 9.0 GPU and a build with a 90a
// pass (HopperKernels in cuda_arch.h). Every other GPU runs the portable kernels, launched
// without programmatic dependence or clusters. Looked up once per device.
inline bool HopperPaths() {
  static std::atomic<int> cache[16] = {};  // 1 no, 2 yes
  return OncePerDevice(cache, 1, [](int dev) {
           int major = 0, minor = 0;
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
           return HopperKernels(BuiltCudaArchitectures(), major, minor) ? 2 : 1;
         }) == 2;
}

inline unsigned GridFor(int64_t n, int threads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65535 * 8 ? (b > 0 ? b : 1) : 65535 * 8);
}

}  // namespace tessera::kernels
