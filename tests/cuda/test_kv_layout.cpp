// Host-only checks of the GPU KV cache's pure parts (run without a GPU): the plane layout, the
// staging capacity per group size, the attention schedule of a pass, and the group sizes the
// placement policy picks from that capacity as the context grows.
#include <gtest/gtest.h>

#include "core/error.h"
#include "kv/cuda/kv_layout.h"
#include "kv/cuda/unit_attention.h"

namespace kvtier::kv_cuda {
namespace {

DeviceKvShape gqa8_shape() {
  DeviceKvShape s;
  s.n_head_kv = {8, 8, 8};
  s.head_dim = 32;
  s.dtype = cuda::KvDtype::kF16;
  s.max_positions = 1024;
  s.max_pass_tokens = 96;
  s.max_q_heads = 16;
  return s;
}

TEST(CudaKvLayout, PlanesAreOrderedLayerHeadKv) {
  DeviceKvShape s = gqa8_shape();
  s.n_head_kv = {2, 3};
  const PlaneLayout p = make_plane_layout(s, 10);
  EXPECT_EQ(p.plane_bytes, 10u * 32 * 2);
  EXPECT_EQ(p.plane(0, 0, 0), 0u);
  EXPECT_EQ(p.plane(0, 0, 1), p.plane_bytes);
  EXPECT_EQ(p.plane(0, 1, 0), 2 * p.plane_bytes);
  EXPECT_EQ(p.plane(1, 0, 0), 4 * p.plane_bytes);
  EXPECT_EQ(p.plane(1, 2, 1), 9 * p.plane_bytes);
  EXPECT_EQ(p.total_bytes, 10 * p.plane_bytes);
}

TEST(CudaKvLayout, StagingRowsRoundDownPerGroup) {
  const DeviceKvShape s = gqa8_shape();
  // Two buffers of g heads, K and V, 64 bytes a row: 2 * g * 2 * 64 = 256 g bytes per position.
  const auto rows = staging_rows(s, 262144);
  EXPECT_EQ(rows(8), 128);
  EXPECT_EQ(rows(4), 256);
  EXPECT_EQ(rows(2), 512);
  EXPECT_EQ(rows(1), 1024);
  EXPECT_EQ(staging_rows(s, 262144 - 1)(8), 64);  // rounded down to kStagingRowAlign
}

TEST(CudaKvLayout, AdaptiveGroupShrinksAsTheContextGrows) {
  const DeviceKvShape s = gqa8_shape();
  policy::PlacementConfig c;
  c.placement = policy::Placement::kHeadInfer;
  const auto rows = staging_rows(s, 262144);
  EXPECT_EQ(policy::plan_pass(c, policy_shape(s), 96, rows).group, 8u);
  EXPECT_EQ(policy::plan_pass(c, policy_shape(s), 192, rows).group, 4u);
  EXPECT_EQ(policy::plan_pass(c, policy_shape(s), 300, rows).group, 2u);
  const auto plan = policy::plan_pass(c, policy_shape(s), 300, rows);
  ASSERT_EQ(plan.units.size(), 12u);  // 3 layers x 4 groups, layer-major
  EXPECT_EQ(plan.units[5].layer, 1u);
  EXPECT_EQ(plan.units[5].head0, 2u);
  EXPECT_EQ(plan.unit_capacity, 512);
  c.placement = policy::Placement::kLayer;
  EXPECT_THROW(policy::plan_pass(c, policy_shape(s), 192, rows), Error);  // a whole layer holds 128
}

TEST(CudaKvLayout, ScheduleDependsOnTheTokenCountOnly) {
  EXPECT_EQ(pass_schedule(1), PassSchedule::kSplit);
  EXPECT_EQ(pass_schedule(2), PassSchedule::kSingle);
  EXPECT_EQ(pass_schedule(512), PassSchedule::kSingle);
  const DeviceKvShape s = gqa8_shape();
  // One decode query row per query head and chunk of 256 keys, head_dim + m + l floats each.
  EXPECT_EQ(split_scratch_bytes(s), size_t{4} * 16 * (32 + 2) * 4);
}

}  // namespace
}  // namespace kvtier::kv_cuda
