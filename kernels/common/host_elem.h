// Element access for the CPU kernels: f32, bf16 or f16 storage, f32 values.
#pragma once
#include <cstdint>

#include "worker/runtime/dtype.h"

namespace tessera::kernels {
inline float LoadElem(const void* p, int64_t i, runtime::DType t) {
  if (t == runtime::DType::kF32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return t == runtime::DType::kF16 ? runtime::F16ToFloat(h) : runtime::Bf16ToFloat(h);
}
inline void StoreElem(void* p, int64_t i, float v, runtime::DType t) {
  if (t == runtime::DType::kF32) static_cast<float*>(p)[i] = v;
  else if (t == runtime::DType::kF16) static_cast<uint16_t*>(p)[i] = runtime::FloatToF16(v);
  else static_cast<uint16_t*>(p)[i] = runtime::FloatToBf16(v);
}
}  // namespace tessera::kernels
