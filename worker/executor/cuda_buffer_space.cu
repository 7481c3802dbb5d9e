// Device-memory BufferSpace for comm-check (see cuda_buffer_space.h). Host code only.
#include <cuda_runtime.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "worker/executor/cuda_buffer_space.h"

namespace tessera::executor {
namespace {
class CudaSpace final : public BufferSpace {
 public:
  explicit CudaSpace(int device) : device_(device) {}
  absl::StatusOr<void*> Alloc(size_t bytes) override {
    cudaSetDevice(device_);
    void* p = nullptr;
    if (auto e = cudaMalloc(&p, bytes); e != cudaSuccess)
      return absl::ResourceExhaustedError(absl::StrCat("cudaMalloc(", bytes, "): ", cudaGetErrorString(e)));
    return p;
  }
  void Free(void* p) override { cudaFree(p); }
  absl::Status Upload(void* d, const void* s, size_t n) override {
    auto e = cudaMemcpy(d, s, n, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? absl::OkStatus() : absl::InternalError(cudaGetErrorString(e));
  }
  absl::Status Download(void* d, const void* s, size_t n) override {
    auto e = cudaMemcpy(d, s, n, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? absl::OkStatus() : absl::InternalError(cudaGetErrorString(e));
  }
  absl::Status Fill(void* d, uint8_t b, size_t n) override {
    auto e = cudaMemset(d, b, n);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    return e == cudaSuccess ? absl::OkStatus() : absl::InternalError(cudaGetErrorString(e));
  }
  // Times with host clocks around enqueue + Synchronize (the stream is private to
  // the communicator and nothing else runs on the device).
  absl::StatusOr<double> Time(const std::function<absl::Status()>& fn, comm::Communicator& c) override {
    auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = fn(); !s.ok()) return s;
    if (absl::Status s = c.Synchronize(); !s.ok()) return s;
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  int device_;
};
}  // namespace
std::unique_ptr<BufferSpace> MakeCudaBufferSpace(int device) { return std::make_unique<CudaSpace>(device); }
}  // namespace tessera::executor
