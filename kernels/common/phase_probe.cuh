// The device side of kernels/common/phase_probe.h: PHASE_DECL at a kernel's start,
// PHASE(i) at its points (thread 0 stamps), PHASE_END(id) at its end (thread 0 appends the
// record), and PHASE_PROBE_TU(name) once in each instrumented file (its buffer: one per
// file, as device variables are without relocatable device code; phase_probe.cc lists
// them). All empty unless the build defines TESSERA_KERNEL_PHASES.
#pragma once
#ifdef TESSERA_KERNEL_PHASES
#include <cuda_runtime.h>

#include "kernels/common/phase_probe.h"

namespace tessera::kernels::phase_probe {
__device__ __forceinline__ unsigned long long Now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
}  // namespace tessera::kernels::phase_probe

#define PHASE_DECL unsigned long long phase_t_[8] = {};
#define PHASE(i)                                                                   \
  do {                                                                             \
    if (threadIdx.x == 0) phase_t_[i] = ::tessera::kernels::phase_probe::Now();    \
  } while (0)
#define PHASE_END(ID)                                                                          \
  do {                                                                                         \
    if (threadIdx.x == 0) {                                                                    \
      phase_t_[7] = ::tessera::kernels::phase_probe::Now();                                    \
      const unsigned i_ = atomicAdd(&g_phase_count, 1u);                                       \
      if (i_ < ::tessera::kernels::phase_probe::kCapacity) {                                   \
        ::tessera::kernels::phase_probe::Record& r_ = g_phase_records[i_];                     \
        for (int j_ = 0; j_ < 8; ++j_) r_.t[j_] = phase_t_[j_];                                \
        r_.id = (ID), r_.block = blockIdx.x + 1000 * blockIdx.y + 100000 * blockIdx.z;         \
        r_.grid = gridDim.x * gridDim.y * gridDim.z;                                           \
      }                                                                                        \
    }                                                                                          \
  } while (0)
// The file's buffer and where it lies (phase_probe.cc reads and empties it).
#define PHASE_PROBE_TU(NAME)                                                                              \
  namespace {                                                                                             \
  __device__ ::tessera::kernels::phase_probe::Record g_phase_records[::tessera::kernels::phase_probe::kCapacity]; \
  __device__ unsigned g_phase_count;                                                                      \
  }                                                                                                       \
  namespace tessera::kernels::phase_probe {                                                               \
  Buffer Buffer_##NAME() {                                                                                \
    Buffer b;                                                                                             \
    cudaGetSymbolAddress(reinterpret_cast<void**>(&b.records), g_phase_records);                          \
    cudaGetSymbolAddress(reinterpret_cast<void**>(&b.count), g_phase_count);                              \
    return b;                                                                                             \
  }                                                                                                       \
  }
#else
#define PHASE_DECL
#define PHASE(i)
#define PHASE_END(ID)
#define PHASE_PROBE_TU(NAME)
#endif
