// Attention of a pass's queries over one unit of KV heads in device memory: the single call every
// placement makes (resident: a whole layer; layer/headinfer: one staged unit), with the schedule
// taken from the pass's token count and the key positions only (kv_layout.h pass_schedule), so
// placements differ in where the rows are, never in the arithmetic.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kv/cuda/device_kv.h"

namespace kvtier::kv_cuda {

// Device scratch of the split (decode) schedule, sized once for the widest call.
struct SplitScratch {
  void* ptr = nullptr;
  size_t bytes = 0;
};
size_t split_scratch_bytes(const DeviceKvShape& s);

// A unit: KV heads of one layer in device memory, K of head j at k + j * head_stride elements and
// V at v + j * head_stride, rows = positions [0, n_keys).
struct UnitRows {
  const void* k = nullptr;
  const void* v = nullptr;
  int64_t head_stride = 0;  // elements
  int64_t n_keys = 0;
};

// Queries: [n_tokens, n_q_heads_total, head_dim] f32; this unit serves query heads
// [q_head0, q_head0 + n_kv * q_per_kv), written to the same columns of o (same layout as q).
struct UnitQueries {
  const float* q = nullptr;
  float* o = nullptr;
  int64_t n_tokens = 0;
  int64_t pos0 = 0;
  int64_t n_q_heads_total = 0;
  int64_t q_head0 = 0;
  int64_t n_kv = 0;
  int64_t q_per_kv = 1;
};

void attend_unit(const DeviceKvShape& s, const kv::LayerAttention& la, const UnitQueries& q,
                 const UnitRows& rows, SplitScratch scratch, cudaStream_t stream);

}  // namespace kvtier::kv_cuda
