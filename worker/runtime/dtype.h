// Element types of tensors and collectives, and bf16/f16 conversions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tessera::runtime {

enum class DType { kF32, kBF16, kF16, kI32, kI64, kU8 };

constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kBF16: case DType::kF16: return 2;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
  }
  return 0;
}

const char* DTypeName(DType t);

inline float Bf16ToFloat(uint16_t v) {
  uint32_t u = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace tessera::runtime
