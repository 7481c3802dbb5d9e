// Device memory a kernel needs between its launches (a split's partial results, say),
// taken from the caller. Get returns `bytes` of stream-ordered memory, or null when it
// cannot; Put gives it back once the launches that use it are enqueued. A launcher given
// no DeviceScratch uses the stream's pool (cudaMallocAsync / cudaFreeAsync), which under
// graph capture records allocation and free nodes between the kernels; the CUDA backend
// passes its allocator's, whose blocks under capture come from its capture arena
// (worker/runtime/capture_arena.h).
#pragma once
#include <cstddef>

namespace tessera::kernels {

class DeviceScratch {
 public:
  virtual void* Get(size_t bytes) = 0;
  virtual void Put(void* p, size_t bytes) = 0;

 protected:
  ~DeviceScratch() = default;
};

}  // namespace tessera::kernels
