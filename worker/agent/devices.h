// The devices a node agent registers: GPUs found through the CUDA runtime (in a
// CUDA build) and `cpu_slots` CPU devices.
#pragma once
#include <vector>

#include "tessera/v1/common.pb.h"

namespace tessera::agent {
std::vector<v1::Device> DiscoverDevices(int cpu_slots, bool use_gpus);
}  // namespace tessera::agent
