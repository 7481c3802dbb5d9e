#include "kernels/common/phase_probe.h"

#include <cstdio>
#include <vector>

#include "absl/strings/str_cat.h"

#ifdef TESSERA_KERNEL_PHASES
#include <cuda_runtime.h>

namespace tessera::kernels::phase_probe {
// The instrumented files' buffers (PHASE_PROBE_TU in each).
Buffer Buffer_paged_split();
Buffer Buffer_decode_linear();
namespace {
std::vector<Buffer> Buffers() { return {Buffer_paged_split(), Buffer_decode_linear()}; }
}  // namespace
}  // namespace tessera::kernels::phase_probe
#endif

namespace tessera::kernels {

bool PhasesRecorded() {
#ifdef TESSERA_KERNEL_PHASES
  return true;
#else
  return false;
#endif
}

void ResetPhases() {
#ifdef TESSERA_KERNEL_PHASES
  cudaDeviceSynchronize();
  for (const phase_probe::Buffer& b : phase_probe::Buffers()) cudaMemset(b.count, 0, sizeof(*b.count));
  cudaDeviceSynchronize();
#endif
}

absl::Status DumpPhases(const std::string& path) {
#ifdef TESSERA_KERNEL_PHASES
  std::vector<phase_probe::Record> all;
  for (const phase_probe::Buffer& b : phase_probe::Buffers()) {
    unsigned n = 0;
    if (b.count == nullptr || cudaMemcpy(&n, b.count, sizeof(n), cudaMemcpyDeviceToHost) != cudaSuccess)
      return absl::InternalError("phases: reading the device's record count failed");
    n = n < phase_probe::kCapacity ? n : phase_probe::kCapacity;
    const size_t at = all.size();
    all.resize(at + n);
    if (n > 0 && cudaMemcpy(all.data() + at, b.records, sizeof(phase_probe::Record) * n, cudaMemcpyDeviceToHost) != cudaSuccess)
      return absl::InternalError("phases: reading the device's records failed");
  }
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return absl::UnavailableError(absl::StrCat("phases: cannot write ", path));
  for (const phase_probe::Record& r : all) {
    std::fprintf(f, "%d %d %d", r.id, r.block, r.grid);
    for (unsigned long long t : r.t) std::fprintf(f, " %llu", t);
    std::fprintf(f, "\n");
  }
  if (std::fclose(f) != 0) return absl::UnavailableError(absl::StrCat("phases: writing ", path, " failed"));
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError(
      absl::StrCat("phases: this build records none (configure with -DTESSERA_KERNEL_PHASES=ON); not writing ", path));
#endif
}

}  // namespace tessera::kernels
