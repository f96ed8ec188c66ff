// One row of K or V, f32 in, stored in the cache's dtype, and back. Every placement stores rows through
// store_kv_row, so their bytes (and hence attention results) are identical.
#pragma once

#include <cstdint>
#include <cstring>

#include "backend/cpu/attention.h"
#include "core/half.h"

namespace kvtier::kv {

inline void store_kv_row(cpu::KvDtype dt, const float* src, int64_t n, uint8_t* dst) {
  if (dt == cpu::KvDtype::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  auto* h = reinterpret_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = f32_to_f16(src[i]);
}

// A stored row back to f32 (exact: f16 -> f32 loses nothing).
inline void load_kv_row(cpu::KvDtype dt, const uint8_t* src, int64_t n, float* dst) {
  if (dt == cpu::KvDtype::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const auto* h = reinterpret_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(h[i]);
}

}  // namespace kvtier::kv
