#include "kernels/common/phase_probe.h"

#include <cstdio>

#include "absl/strings/str_cat.h"

#ifdef TESSERA_KERNEL_PHASES
namespace tessera::kernels::phase_probe {
// The instrumented files' buffers (PHASE_PROBE_TU in each).
void Reset_paged_split();
bool Dump_paged_split(FILE* f);
void Reset_decode_linear();
bool Dump_decode_linear(FILE* f);
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
  phase_probe::Reset_paged_split();
  phase_probe::Reset_decode_linear();
#endif
}

absl::Status DumpPhases(const std::string& path) {
#ifdef TESSERA_KERNEL_PHASES
  FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return absl::UnavailableError(absl::StrCat("phases: cannot write ", path));
  const bool ok = phase_probe::Dump_paged_split(f) && phase_probe::Dump_decode_linear(f);
  const bool closed = std::fclose(f) == 0;
  if (!ok) return absl::InternalError("phases: reading the device's records failed");
  if (!closed) return absl::UnavailableError(absl::StrCat("phases: writing ", path, " failed"));
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError(
      absl::StrCat("phases: this build records none (configure with -DTESSERA_KERNEL_PHASES=ON); not writing ", path));
#endif
}

}  // namespace tessera::kernels
