#include <gtest/gtest.h>

#include <set>

#include "core/ggml_type.h"

namespace kvtier {
namespace {

TEST(GgmlType, IdsAreUniqueAndNamesRoundTrip) {
  std::set<uint32_t> ids;
  for (const auto& t : ggml_all_types()) {
    EXPECT_TRUE(ids.insert(static_cast<uint32_t>(t.type)).second) << t.name;
    EXPECT_EQ(ggml_type_from_name(t.name), t.type);
    EXPECT_GT(t.block_size, 0u);
    EXPECT_GT(t.type_size, 0u);
  }
  EXPECT_EQ(ggml_all_types().size(), 32u);
  EXPECT_EQ(ggml_type_from_name("Q4_K"), GgmlType::kQ4_K);
  EXPECT_FALSE(ggml_type_from_name("q4_2").has_value());
  EXPECT_FALSE(ggml_type_traits(4).has_value());   // removed Q4_2
  EXPECT_FALSE(ggml_type_traits(31).has_value());  // removed repacked type
  EXPECT_FALSE(ggml_type_traits(1000).has_value());
}

TEST(GgmlType, RowBytes) {
  EXPECT_EQ(ggml_row_bytes(GgmlType::kQ4_0, 64), 36u);
  EXPECT_EQ(ggml_row_bytes(GgmlType::kQ4_K, 512), 288u);
  EXPECT_FALSE(ggml_row_bytes(GgmlType::kQ4_K, 100).has_value());
  EXPECT_FALSE(ggml_row_bytes(GgmlType::kF32, UINT64_MAX).has_value());
  EXPECT_EQ(ggml_row_bytes(GgmlType::kF16, 3), 6u);
}

}  // namespace
}  // namespace kvtier
