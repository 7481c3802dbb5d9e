// Programmatic dependent launch (Hopper): a kernel launched with LaunchDependent may start
// while the kernel before it on the stream is still finishing; it must call
// GridDependencyWait() before it reads anything that kernel wrote or writes anything that
// kernel may still read (its output buffers, say). What it does before the wait — loading
// constants, prefetching weights into L2 — overlaps the other kernel's tail and the
// launch. GridDependentsLaunch() lets the next such kernel be scheduled early. On a kernel
// launched without the attribute both are no-ops; under stream capture the dependency is
// recorded in the graph. Where HopperPaths() is false (another GPU, or a build without a
// 90a pass) LaunchDependent is a plain launch.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/common/cuda_elem.cuh"

namespace tessera::kernels {

__device__ __forceinline__ void GridDependencyWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void GridDependentsLaunch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// `bytes` (a multiple of 16) from `p` (16-byte aligned) into L2, asynchronously.
__device__ __forceinline__ void PrefetchL2(const void* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

template <typename... KArgs, typename... Args>
cudaError_t LaunchDependent(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                            Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr, cfg.numAttrs = HopperPaths() ? 1 : 0;  // elsewhere a plain launch
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// The same, with the grid in thread-block clusters of `cluster` blocks (cluster.x must
// divide grid.x; at most 8 blocks: the portable size). Hopper only (cudaErrorNotSupported
// where !HopperPaths(): the kernel's cluster code exists in the 90a pass alone).
template <typename... KArgs, typename... Args>
cudaError_t LaunchDependentCluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                   dim3 cluster, Args&&... args) {
  if (!HopperPaths()) return cudaErrorNotSupported;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = cluster.x, attr[1].val.clusterDim.y = cluster.y, attr[1].val.clusterDim.z = cluster.z;
  cfg.attrs = attr, cfg.numAttrs = 2;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// The status of a LaunchDependent: its own error, else the launch's (cudaGetLastError).
inline absl::Status Launched(cudaError_t e, const char* kernel) {
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::InternalError(absl::StrCat(kernel, ": ", cudaGetErrorString(e)));
  }
  e = cudaGetLastError();
  return e == cudaSuccess ? absl::OkStatus() : absl::InternalError(absl::StrCat(kernel, ": ", cudaGetErrorString(e)));
}

}  // namespace tessera::kernels
