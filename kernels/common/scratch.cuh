// A block of DeviceScratch (kernels/common/scratch.h) for the launches of one call: from the
// caller's scratch, else the stream's pool (none for 0 bytes); given back when it goes out
// of scope.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/common/scratch.h"

namespace tessera::kernels {

class ScratchBlock {
 public:
  ScratchBlock(DeviceScratch* scratch, size_t bytes, cudaStream_t stream) : scratch_(scratch), bytes_(bytes), stream_(stream) {
    if (bytes_ == 0) return;
    if (scratch_ != nullptr) {
      p_ = scratch_->Get(bytes_);
    } else if (cudaMallocAsync(&p_, bytes_, stream_) != cudaSuccess) {
      p_ = nullptr;
    }
  }
  ~ScratchBlock() {
    if (p_ == nullptr) return;
    if (scratch_ != nullptr) scratch_->Put(p_, bytes_);
    else cudaFreeAsync(p_, stream_);
  }
  ScratchBlock(const ScratchBlock&) = delete;
  ScratchBlock& operator=(const ScratchBlock&) = delete;
  void* get() const { return p_; }  // null: it could not be had, or 0 bytes were asked for

 private:
  DeviceScratch* scratch_;
  size_t bytes_;
  cudaStream_t stream_;
  void* p_ = nullptr;
};

}  // namespace tessera::kernels
