#include "kv/cuda/kv_layout.h"

#include "core/error.h"

namespace kvtier::kv_cuda {

uint64_t row_bytes(const DeviceKvShape& s) {
  return uint64_t{s.head_dim} * cuda::kv_dtype_bytes(s.dtype);
}

PlaneLayout make_plane_layout(const DeviceKvShape& s, int64_t rows) {
  KVTIER_ASSERT(rows >= 0);
  PlaneLayout p;
  p.rows = rows;
  p.plane_bytes = static_cast<uint64_t>(rows) * row_bytes(s);
  uint64_t off = 0;
  for (uint32_t h : s.n_head_kv) {
    p.layer_bytes.push_back(off);
    off += uint64_t{h} * 2 * p.plane_bytes;
  }
  p.total_bytes = off;
  return p;
}

policy::KvShape policy_shape(const DeviceKvShape& s) {
  policy::KvShape k;
  k.n_head_kv = s.n_head_kv;
  k.head_bytes_per_token = 2 * row_bytes(s);
  return k;
}

policy::RowsForGroup staging_rows(const DeviceKvShape& s, uint64_t staging_bytes) {
  const uint64_t head_token = 2 * row_bytes(s);
  return [=](uint32_t g) {
    const uint64_t per_buffer = staging_bytes / 2;
    const auto rows = static_cast<int64_t>(per_buffer / (uint64_t{g} * head_token));
    return rows / kStagingRowAlign * kStagingRowAlign;
  };
}

PassSchedule pass_schedule(int64_t n_tokens) {
  return n_tokens == 1 ? PassSchedule::kSplit : PassSchedule::kSingle;
}

}  // namespace kvtier::kv_cuda
