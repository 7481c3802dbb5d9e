#include "worker/agent/devices.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "worker/comm/nccl_communicator.h"

namespace tessera::agent {
std::vector<v1::Device> DiscoverDevices(int cpu_slots, bool use_gpus) {
  std::vector<v1::Device> out;
  int n = use_gpus ? comm::CudaDeviceCount() : 0;
  for (int i = 0; i < n; ++i) {
    auto info = comm::CudaDevice(i);
    v1::Device d;
    d.set_index(i);
    d.set_type(v1::GPU);
    d.set_name(info.name);
    d.set_memory_bytes(info.memory_bytes);
    out.push_back(d);
  }
  int64_t mem = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  for (int i = 0; i < cpu_slots; ++i) {
    v1::Device d;
    d.set_index(i);
    d.set_type(v1::CPU);
    d.set_name(absl::StrCat("cpu-slot-", i));
    d.set_memory_bytes(cpu_slots > 0 ? mem / cpu_slots : 0);
    out.push_back(d);
  }
  return out;
}
}  // namespace tessera::agent
