// Byte layout of the GPU KV cache, pure arithmetic (no CUDA calls), shared by the placements:
//   planes: one run of rows per (layer, KV head, K|V), ordered (layer, head, K|V), each `rows` rows
//           of head_dim elements: [n_layer][n_head_kv(l)][2][rows][head_dim] dtype
//   so the 2g planes of a head group are equally pitched and one 2-D copy moves a unit.
//   staging: two ping-pong buffers, each [g][2][cap][head_dim] dtype, cap from the staging bytes
#pragma once

#include <cstdint>
#include <vector>

#include "kv/cuda/device_kv.h"
#include "policy/placement.h"

namespace kvtier::kv_cuda {

// Staging capacities are rounded down to this many rows (a multiple of the attention tile; keeps
// plane starts aligned for any head_dim).
constexpr int64_t kStagingRowAlign = 64;

struct PlaneLayout {
  int64_t rows = 0;                   // rows per plane
  uint64_t plane_bytes = 0;           // rows * head_dim * element bytes
  std::vector<uint64_t> layer_bytes;  // [n_layer] offset of the layer's first plane
  uint64_t total_bytes = 0;

  // Offset of plane (layer, head, kv) with kv = 0 for K, 1 for V.
  uint64_t plane(uint32_t layer, uint32_t head, uint32_t kv) const {
    return layer_bytes[layer] + (uint64_t{head} * 2 + kv) * plane_bytes;
  }
};

PlaneLayout make_plane_layout(const DeviceKvShape& s, int64_t rows);

// The policy's view of the shape: heads per layer and K+V bytes of one head for one token.
policy::KvShape policy_shape(const DeviceKvShape& s);

uint64_t row_bytes(const DeviceKvShape& s);  // head_dim * element bytes

// Rows each of the two staging buffers holds when `staging_bytes` is sliced for units of g heads,
// rounded down to kStagingRowAlign.
policy::RowsForGroup staging_rows(const DeviceKvShape& s, uint64_t staging_bytes);

// The attention schedule of a pass: a function of its token count only, so that every placement
// (and every head grouping) runs the same kernels in the same order.
enum class PassSchedule { kSingle, kSplit };
PassSchedule pass_schedule(int64_t n_tokens);

}  // namespace kvtier::kv_cuda
