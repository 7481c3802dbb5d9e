#include "worker/agent/devices.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/gpu_devices.h"

namespace tessera::agent {
std::vector<v1::Device> DiscoverDevices(int cpu_slots, bool use_gpus) {
  std::vector<v1::Device> out;
  const std::vector<GpuInfo> gpus = use_gpus ? VisibleGpus() : std::vector<GpuInfo>{};
  for (int i = 0; i < static_cast<int>(gpus.size()); ++i) {
    const GpuInfo& info = gpus[i];
    v1::Device d;
    d.set_index(i);
    d.set_type(v1::DEVICE_TYPE_GPU);
    d.set_name(info.name);
    d.set_memory_bytes(info.memory_bytes);
    out.push_back(d);
  }
  int64_t mem = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  for (int i = 0; i < cpu_slots; ++i) {
    v1::Device d;
    d.set_index(i);
    d.set_type(v1::DEVICE_TYPE_CPU);
    d.set_name(absl::StrCat("cpu-slot-", i));
    d.set_memory_bytes(cpu_slots > 0 ? mem / cpu_slots : 0);
    out.push_back(d);
  }
  return out;
}
}  // namespace tessera::agent
