// A device's dense peak FLOP/s for a compute dtype: MFU's denominator. bf16: the vendor's
// dense (no sparsity) tensor-core figure; f32: the non-tensor figure (the engine's f32
// GEMMs do not use TF32). 0 for a device not in the table (and for CPUs): no MFU is
// reported then, rather than a made-up one.
#pragma once

#include <string>

#include "common/dtype.h"

namespace tessera::runtime {

// `device_name` as CUDA reports it (cudaDeviceProp::name, e.g. "NVIDIA H100 80GB HBM3").
double PeakFlops(const std::string& device_name, DType dtype);

}  // namespace tessera::runtime
