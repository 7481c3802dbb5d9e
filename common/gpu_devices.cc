#include "common/gpu_devices.h"

#include <dlfcn.h>

#include <cstddef>

namespace tessera {
namespace {
// The driver API's entry points used here (cuda.h's signatures; CUresult 0 = success).
using CuInit = int (*)(unsigned int);
using CuDeviceGetCount = int (*)(int*);
using CuDeviceGet = int (*)(int*, int);
using CuDeviceGetName = int (*)(char*, int, int);
using CuDeviceTotalMem = int (*)(size_t*, int);

struct Driver {
  CuInit init = nullptr;
  CuDeviceGetCount count = nullptr;
  CuDeviceGet get = nullptr;
  CuDeviceGetName name = nullptr;
  CuDeviceTotalMem total_mem = nullptr;
  bool ok() const { return init && count && get && name && total_mem; }
};

const Driver& LoadDriver() {
  static const Driver driver = [] {
    Driver d;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return d;
    d.init = reinterpret_cast<CuInit>(dlsym(lib, "cuInit"));
    d.count = reinterpret_cast<CuDeviceGetCount>(dlsym(lib, "cuDeviceGetCount"));
    d.get = reinterpret_cast<CuDeviceGet>(dlsym(lib, "cuDeviceGet"));
    d.name = reinterpret_cast<CuDeviceGetName>(dlsym(lib, "cuDeviceGetName"));
    d.total_mem = reinterpret_cast<CuDeviceTotalMem>(dlsym(lib, "cuDeviceTotalMem_v2"));
    return d;
  }();
  return driver;
}
}  // namespace

std::vector<GpuInfo> VisibleGpus() {
  std::vector<GpuInfo> out;
  const Driver& d = LoadDriver();
  if (!d.ok() || d.init(0) != 0) return out;
  int n = 0;
  if (d.count(&n) != 0) return out;
  for (int i = 0; i < n; ++i) {
    int dev = 0;
    if (d.get(&dev, i) != 0) return {};
    char name[256] = {};
    size_t bytes = 0;
    if (d.name(name, sizeof(name), dev) != 0 || d.total_mem(&bytes, dev) != 0) return {};
    out.push_back(GpuInfo{name, static_cast<int64_t>(bytes)});
  }
  return out;
}

}  // namespace tessera
