#include <gtest/gtest.h>

#include "core/checked_math.h"

namespace kvtier {
namespace {

TEST(CheckedMath, DetectsOverflow) {
  EXPECT_EQ(checked_mul(1ULL << 31, 1ULL << 31), 1ULL << 62);
  EXPECT_FALSE(checked_mul(1ULL << 32, 1ULL << 32).has_value());
  EXPECT_FALSE(checked_add(UINT64_MAX, 1).has_value());
  EXPECT_EQ(checked_align_up(33, 32), 64u);
  EXPECT_EQ(checked_align_up(64, 32), 64u);
  EXPECT_FALSE(checked_align_up(UINT64_MAX - 3, 32).has_value());
}

}  // namespace
}  // namespace kvtier
