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

// Vector j (0..3) of block b of a legacy type's group (weight_lanes.h), unpacked: lo = the low
// nibbles (group j's 4 elements of 16 rows), hi = the high ones (group j + 4), each with its fifth
// bits added where kHighBits (q5_0, q5_1), as unsigned bytes.
template <bool kHighBits>
static inline void legacy_unpack_vector(const uint8_t* w, const LegacyRegions& at, int64_t b, int j,
                                        __m512i& lo, __m512i& hi) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), fifth = _mm512_set1_epi8(0x10);
  const __m512i v = _mm512_load_si512(w + at.nibbles + b * 256 + 64 * j);
  lo = _mm512_and_si512(v, low4);
  hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
  if constexpr (kHighBits) {
    uint64_t ml, mh;
    std::memcpy(&ml, w + at.high_bits + b * 64 + 8 * j, 8);
    std::memcpy(&mh, w + at.high_bits + b * 64 + 8 * (j + 4), 8);
    lo = _mm512_mask_add_epi8(lo, _cvtu64_mask64(ml), lo, fifth);
    hi = _mm512_mask_add_epi8(hi, _cvtu64_mask64(mh), hi, fifth);
  }
}

// Group i (0..3) of sub-block j (0..15) of a q6_K super-block of 16 rows (weight_lanes.h), as
// unsigned bytes q + 32: sub-block j is elements 16j .. 16j + 15, half h = j / 8, bit pair
// p = (j % 8) / 2; its groups are the qh vectors gh = 4 (j % 2) .. + 3 and the ql vectors gh
// (+ 8 for odd p), the low nibbles for p < 2, and bits 2p, 2p + 1 of qh go to bits 4, 5.
static inline __m512i q6k_lanes_vector(const uint8_t* sb, int j, int i) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  const int h = j / 8, p = (j % 8) / 2, gh = 4 * (j % 2) + i;
  const __m512i ql = _mm512_loadu_si512(sb + (16 * h + gh + 8 * (p % 2)) * 64);
  const __m512i qh = _mm512_loadu_si512(sb + 2048 + (8 * h + gh) * 64);
  const __m512i lo = p < 2 ? _mm512_and_si512(ql, low4) : _mm512_and_si512(_mm512_srli_epi16(ql, 4), low4);
  const __m512i hb = p == 0   ? _mm512_slli_epi16(qh, 4)
                     : p == 1 ? _mm512_slli_epi16(qh, 2)
                     : p == 2 ? qh
                              : _mm512_srli_epi16(qh, 2);
  return _mm512_or_si512(lo, _mm512_and_si512(hb, bits45));
}

}  // namespace kvtier::cpu::lanes
