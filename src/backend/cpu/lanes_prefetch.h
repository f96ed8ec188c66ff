// Software prefetch for the kernels over the rows-in-lanes layout (matmul_lanes_avx2.cpp,
// matmul_lanes_avx512.cpp). One core's sequential stream reads slower than the memory allows;
// prefetching 8 q8_0 block pairs (about 9 KiB) ahead of use read the Gemma-3 output matrix about
// 1.3x faster (docs/benchmarks.md, "Rows in lanes"). Static: each including translation unit keeps
// its own copy, compiled for its own ISA.
#pragma once

#include <xmmintrin.h>

#include <cstdint>

#include "backend/cpu/weight_lanes.h"

namespace kvtier::cpu::lanes {

constexpr int64_t kPrefetchBytes = 8 * kLanesPairBytes;

// The bytes [from, to) of a packed group, kPrefetchBytes ahead of w, one 64-byte line at a time.
static inline void prefetch_span(const uint8_t* w, int64_t from, int64_t to) {
  for (int64_t o = from / 64 * 64; o < to; o += 64)
    _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchBytes + o), _MM_HINT_T0);
}

}  // namespace kvtier::cpu::lanes
