// The GPUs this process can see, asked of the CUDA driver (libcuda.so.1, loaded with
// dlopen at first use and never linked), so that the node agent, the `tessera` CLI and the
// controller's image run without the CUDA runtime or NCCL. The driver honours
// CUDA_VISIBLE_DEVICES and numbers devices as the CUDA runtime does.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

struct GpuInfo {
  std::string name;          // as cudaDeviceProp::name, e.g. "NVIDIA H100 80GB HBM3"
  int64_t memory_bytes = 0;  // total device memory
};

// Empty where there is no driver, no GPU, or the driver fails to initialize.
std::vector<GpuInfo> VisibleGpus();

}  // namespace tessera
