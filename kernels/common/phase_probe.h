// Where the time of the decode step's kernels goes, CTA by CTA: in a build configured with
// -DTESSERA_KERNEL_PHASES=ON, thread 0 of every CTA of the paged decode attention
// (kernels/paged_attention) and of the decode linears (kernels/decode) stamps the GPU's
// global timer (ns) at fixed points of the kernel and, at its end, appends one record to a
// device buffer (2^19 records; later ones are dropped). A record: the kernel's id, the
// block (x + 1000 y + 100000 z), the grid's size, and 8 stamps (0 where a point was not
// passed):
//   decode linear (id 10 M + KS, + 5 swiglu, + 100 with the norm, + 200 with a residual;
//   M the rows of x staged, KS the warps sharing a tile): 0 start, 1 before the
//   dependency wait (first weights issued), 2 after it, 3 x staged, 7 warp 0's end;
//   paged attention (id 100 + head dim; the q/k pass fused in): 0 start, 1 before the
//   wait (first tiles issued), 2 after it, 3 q/k pass done, 4 tiles done, 5 warps merged,
//   7 end (the cluster's merge done).
// bench/decode_phases.py turns a dump into each kernel's phases against the end of the one
// before it. The stamps cost a few percent of a step; without the option nothing is
// recorded and these calls report that.
#pragma once
#include <string>

#include "absl/status/status.h"

namespace tessera::kernels {
// Whether this build records phases.
bool PhasesRecorded();
// Empties the buffer (device work before it should have finished).
void ResetPhases();
// The records so far, one line each ("id block grid t0 ... t7"), into `path`.
absl::Status DumpPhases(const std::string& path);

namespace phase_probe {
struct Record {  // one CTA's (kernels/common/phase_probe.cuh)
  unsigned long long t[8];
  int id, block, grid, pad;
};
constexpr unsigned kCapacity = 1u << 19;  // records per instrumented file
struct Buffer {                           // an instrumented file's, on the device
  Record* records = nullptr;
  unsigned* count = nullptr;
};
}  // namespace phase_probe
}  // namespace tessera::kernels
