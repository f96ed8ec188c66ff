// Helpers shared by the AVX-512 kernels over the rows-in-lanes layout (matmul_lanes_avx512.cpp,
// matmul_lanes_avx512_tokens.cpp); included only by files compiled with the AVX-512 flags. Static:
// each including translation unit keeps its own copy.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/weight_lanes.h"

namespace kvtier::cpu::lanes {

// The lanes of a group's real rows (rows <= kLaneRows): the outputs a kernel stores.
static inline __mmask16 rows_mask(int rows) {
  return rows >= kLaneRows ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << rows) - 1);
}

// The 4 activation bytes of group g as one i32, broadcast.
static inline __m512i group_of(const int8_t* qs, int g) {
  int32_t v;
  std::memcpy(&v, qs + 4 * g, 4);
  return _mm512_set1_epi32(v);
}

// 16 rows' u8 (or, kSigned, i8) values at p as 16 x i32.
template <bool kSigned = false>
static inline __m512i widen16(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return kSigned ? _mm512_cvtepi8_epi32(v) : _mm512_cvtepu8_epi32(v);
}

}  // namespace kvtier::cpu::lanes
