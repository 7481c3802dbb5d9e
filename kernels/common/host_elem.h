// Element access for the CPU kernels: f32, bf16 or f16 storage, f32 values.
#pragma once
#include <cstdint>

#include "common/dtype.h"

namespace tessera::kernels {
inline float LoadElem(const void* p, int64_t i, tessera::DType t) {
  if (t == tessera::DType::kF32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return t == tessera::DType::kF16 ? tessera::F16ToFloat(h) : tessera::Bf16ToFloat(h);
}
inline void StoreElem(void* p, int64_t i, float v, tessera::DType t) {
  if (t == tessera::DType::kF32) static_cast<float*>(p)[i] = v;
  else if (t == tessera::DType::kF16) static_cast<uint16_t*>(p)[i] = tessera::FloatToF16(v);
  else static_cast<uint16_t*>(p)[i] = tessera::FloatToBf16(v);
}
}  // namespace tessera::kernels
