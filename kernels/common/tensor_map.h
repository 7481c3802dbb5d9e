// The driver's cuTensorMapEncodeTiled (TMA descriptors), looked up once through the
// runtime (no link against libcuda); null where the driver lacks it.
#pragma once
#include <cudaTypedefs.h>

namespace tessera::kernels {
PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder();
}  // namespace tessera::kernels
