// Element access for the CPU kernels: f32 or bf16 storage, f32 values.
#pragma once
#include <cstdint>

#include "worker/runtime/dtype.h"

namespace tessera::kernels {
inline float LoadElem(const void* p, int64_t i, runtime::DType t) {
  return t == runtime::DType::kF32 ? static_cast<const float*>(p)[i]
                                   : runtime::Bf16ToFloat(static_cast<const uint16_t*>(p)[i]);
}
inline void StoreElem(void* p, int64_t i, float v, runtime::DType t) {
  if (t == runtime::DType::kF32) static_cast<float*>(p)[i] = v;
  else static_cast<uint16_t*>(p)[i] = runtime::FloatToBf16(v);
}
}  // namespace tessera::kernels
