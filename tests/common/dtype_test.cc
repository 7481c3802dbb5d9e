// Host bf16/f16 conversions against known bit patterns and exhaustively against
// themselves (every f16 value survives f16 -> f32 -> f16).
#include "common/dtype.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"

namespace tessera::runtime {
namespace {

float Bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(DTypeTest, FloatToF16KnownValues) {
  EXPECT_EQ(FloatToF16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToF16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToF16(0.1f), 0x2e66);
  EXPECT_EQ(FloatToF16(65504.0f), 0x7bff);            // largest finite
  EXPECT_EQ(FloatToF16(65519.996f), 0x7bff);          // just below the rounding boundary
  EXPECT_EQ(FloatToF16(65520.0f), 0x7c00);            // tie, rounds to even = inf
  EXPECT_EQ(FloatToF16(1e9f), 0x7c00);
  EXPECT_EQ(FloatToF16(-1e9f), 0xfc00);
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -25)), 0x0000);  // tie between 0 and 1 ulp: even
  EXPECT_EQ(FloatToF16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: tie, rounds to even 2
  EXPECT_EQ(FloatToF16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25)), 0x0400);  // subnormal rounding up to normal
  EXPECT_EQ(FloatToF16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie at 1 + half ulp: even (down)
  EXPECT_EQ(FloatToF16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie above an odd: up
  EXPECT_EQ(FloatToF16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(FloatToF16(std::nanf("")) & 0x7c00, 0x7c00);
  EXPECT_NE(FloatToF16(std::nanf("")) & 0x03ff, 0);
}

TEST(DTypeTest, F16ToFloatKnownValues) {
  EXPECT_EQ(F16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(F16ToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(F16ToFloat(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(F16ToFloat(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(F16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(F16ToFloat(0x7e00)));
  EXPECT_TRUE(std::signbit(F16ToFloat(0x8000)));
}

TEST(DTypeTest, EveryF16RoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = F16ToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToF16(f), h) << std::hex << h;
  }
}

TEST(DTypeTest, Bf16KnownValues) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(Bits(0x3f808000u)), 0x3f80);  // tie: even (down)
  EXPECT_EQ(FloatToBf16(Bits(0x3f818000u)), 0x3f82);  // tie above an odd: up
  EXPECT_EQ(Bf16ToFloat(0xc040), -3.0f);
}

}  // namespace
}  // namespace tessera::runtime
