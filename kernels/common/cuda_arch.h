// Which GPUs this build's CUDA kernels run on. The build compiles them for the
// architectures CMake's TESSERA_CUDA_ARCHITECTURES lists (TESSERA_CUDA_ARCHS below;
// "80-real;90a-real" by default: Ampere/Ada and Hopper), and a CUDA backend checks its
// device against that list before it uses it, so a GPU the kernels were not built for is
// refused with its name and compute capability at start — not with "no kernel image is
// available" at the first kernel of a job. Hopper's own kernels (wgmma, TMA, thread-block
// clusters, programmatic dependent launch) exist only in a 90a pass; on any other GPU, or
// a build without 90a, their callers take the portable kernels (HopperKernels).
// Plain C++ (no CUDA headers): the check is testable without a GPU.
#pragma once
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tessera::kernels {

// The architectures the build compiled its kernels for (CMake's list, ','-separated);
// empty in a build without CUDA.
absl::string_view BuiltCudaArchitectures();

// OK when a device of compute capability major.minor runs kernels built for `archs`
// (',' or ';'-separated, in CMake's forms: "90a" and "90a-real" run on 9.0 only —
// arch-specific features carry to no other GPU; "100f" on 10.x from 10.0; "86-real"
// (SASS) on 8.6 and later 8.x; "80-virtual" (PTX, compiled by the driver) on 8.0 and
// every later GPU; "80" is both). Otherwise FAILED_PRECONDITION naming the device, its
// capability and the architectures the build has. A list it cannot read ("native", "all",
// or empty) refuses nothing: the driver decides.
absl::Status CheckComputeCapability(absl::string_view archs, int device, absl::string_view name, int major, int minor);

// Whether Hopper's own kernels run on a device of compute capability major.minor with a
// build for `archs`: a 9.0 GPU and a 90a entry in the list (a list it cannot read: no).
bool HopperKernels(absl::string_view archs, int major, int minor);

}  // namespace tessera::kernels
