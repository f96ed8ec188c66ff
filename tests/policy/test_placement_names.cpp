// Placement names as the CLI takes them (--kv-policy P1,P2,...).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "policy/placement.h"

namespace kvtier::policy {
namespace {

TEST(PlacementNames, KnownUnknownAndRepeated) {
  EXPECT_EQ(parse_placement("resident"), Placement::kResident);
  EXPECT_EQ(parse_placement_list("layer,headinfer"),
            (std::vector<Placement>{Placement::kLayer, Placement::kHeadInfer}));
  EXPECT_EQ(placement_names(), "resident, layer, headinfer");
  try {
    parse_placement_list("resident,nonsense");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nonsense"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("resident"), std::string::npos);
  }
  try {
    parse_placement_list("resident,resident");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("listed twice"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_placement(""), Error);
  EXPECT_THROW(parse_placement_list("layer,"), Error);
}

}  // namespace
}  // namespace kvtier::policy
