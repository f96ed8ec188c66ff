#include <gtest/gtest.h>
#include <immintrin.h>

#include <bit>
#include <cmath>
#include <random>

#include "core/half.h"

namespace kvtier {
namespace {

// Hardware conversion (F16C) as the independent reference for f32 -> f16 rounding.
__attribute__((target("f16c"))) uint16_t f16c_from_f32(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float f16c_to_f32(uint16_t h) {
  return _cvtsh_ss(h);
}

TEST(Half, EveryHalfRoundTripsAndMatchesF16c) {
  const bool hw = __builtin_cpu_supports("f16c");
  if (!hw) GTEST_LOG_(WARNING) << "CPU lacks F16C: comparing only the round trip";
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (hw) {
      const float ref = f16c_to_f32(static_cast<uint16_t>(h));
      if (std::isnan(ref)) {
        EXPECT_TRUE(std::isnan(f)) << h;
        continue;
      }
      EXPECT_EQ(std::bit_cast<uint32_t>(f), std::bit_cast<uint32_t>(ref)) << "half 0x" << std::hex << h;
    }
    if (!std::isnan(f)) {
      EXPECT_EQ(f32_to_f16(f), h) << "half 0x" << std::hex << h;
    }
  }
}

TEST(Half, F32ToF16RoundingMatchesF16c) {
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "CPU lacks F16C, no hardware reference";
  std::mt19937 rng(7);
  // Random bit patterns over the whole f32 range, plus values around every half boundary.
  for (int i = 0; i < 2000000; ++i) {
    const float f = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;
    ASSERT_EQ(f32_to_f16(f), f16c_from_f32(f)) << "f32 bits 0x" << std::hex << std::bit_cast<uint32_t>(f);
  }
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    const uint32_t bits = std::bit_cast<uint32_t>(f16_to_f32(static_cast<uint16_t>(h)));
    for (int d = -3; d <= 3; ++d) {
      for (uint32_t half_ulp : {0u, 0x1000u, 0x0fffu, 0x1001u}) {
        const float f = std::bit_cast<float>(bits + half_ulp + d);
        if (std::isnan(f)) continue;
        ASSERT_EQ(f32_to_f16(f), f16c_from_f32(f)) << "f32 bits 0x" << std::hex << std::bit_cast<uint32_t>(f);
        ASSERT_EQ(f32_to_f16(-f), f16c_from_f32(-f));
      }
    }
  }
}

TEST(Half, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  // 1 + 2^-8 is exactly between bf16 neighbours 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 is between 1 + 2^-7 (odd) and 1 + 2^-6: ties to even (up).
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xff80);
}

}  // namespace
}  // namespace kvtier
