// Device-memory BufferSpace for comm-check on GPUs (nullptr in a build without CUDA).
#pragma once
#include <memory>

#include "worker/executor/comm_check.h"

namespace tessera::executor {
std::unique_ptr<BufferSpace> MakeCudaBufferSpace(int device);
}  // namespace tessera::executor
