// Element types of tensors and collectives, and bf16/f16 conversions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tessera {

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

inline float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in f32
    float f = static_cast<float>(mant) * (1.0f / 16777216.0f);
    std::memcpy(&u, &f, 4);
    u |= sign;
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);  // inf or NaN
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even, as CUDA's __float2half_rn: overflow to inf (from 65520 up),
// subnormals kept, NaN stays NaN.
inline uint16_t FloatToF16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);
  if (a >= 0x47800000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 2^16
  if (a < 0x38800000u) {  // below 2^-14: a subnormal (or zero) f16, round(|f| * 2^24) ulps
    float af;
    std::memcpy(&af, &a, 4);
    const float scaled = af * 16777216.0f;  // exact: a power of two
    uint32_t m = static_cast<uint32_t>(scaled);
    const float rest = scaled - static_cast<float>(m);
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++m;
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t h = (((a >> 23) - 112) << 10) | ((a & 0x7fffffu) >> 13);
  const uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry may reach inf: right
  return static_cast<uint16_t>(sign | h);
}

}  // namespace tessera
