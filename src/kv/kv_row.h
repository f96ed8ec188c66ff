// One row of K or V, f32 in, stored in the cache's dtype. Every placement stores rows through this
// function, so their bytes (and hence attention results) are identical.
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

}  // namespace kvtier::kv
