// Built without CUDA: there are no GPU devices, so there is no device memory to test with.
#include "worker/executor/cuda_buffer_space.h"

namespace tessera::executor {
std::unique_ptr<BufferSpace> MakeCudaBufferSpace(int) { return nullptr; }
}  // namespace tessera::executor
