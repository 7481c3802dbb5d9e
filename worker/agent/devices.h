// The devices a node agent registers: the GPUs the CUDA driver shows this process
// (common/gpu_devices.h; none without a driver) and `cpu_slots` CPU devices.
#pragma once
#include <vector>

#include "tessera/v1/common.pb.h"

namespace tessera::agent {
std::vector<v1::Device> DiscoverDevices(int cpu_slots, bool use_gpus);
}  // namespace tessera::agent
