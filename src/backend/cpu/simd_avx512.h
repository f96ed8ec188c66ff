// AVX-512 (F/BW/VL + VNNI) helpers, included only by translation units compiled with the AVX-512
// flags. All helpers are static (internal linkage), as in simd_avx2.h.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/block_unpack.h"
#include "backend/cpu/simd_avx2.h"

namespace kvtier::cpu::avx512 {

// (Built from broadcasts and blends: GCC 12's insert/extract intrinsics trip -Wmaybe-uninitialized.)
static inline __m512i join(__m256i lo, __m256i hi) {
  return _mm512_mask_broadcast_i64x4(_mm512_broadcast_i64x4(lo), 0xF0, hi);
}

static inline __m512 join_ps(float lo, float hi) {
  return _mm512_mask_blend_ps(0xFF00, _mm512_set1_ps(lo), _mm512_set1_ps(hi));
}

static inline float reduce_add(__m512 v) {
  const __m512 swapped = _mm512_shuffle_f32x4(v, v, 0x4E);  // 256-bit halves exchanged
  return avx2::hsum_f32(_mm512_castps512_ps256(_mm512_add_ps(v, swapped)));
}

// Signed x signed bytes (|x| <= 128 after abs, a in [-127, 127]) summed in groups of 4 -> 16 x i32.
static inline __m512i dot_s8s8_512(__m512i x, __m512i a) {
  const __mmask64 neg = _mm512_movepi8_mask(x);
  const __m512i sa = _mm512_mask_sub_epi8(a, neg, _mm512_setzero_si512(), a);
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(x), sa);
}

static inline __m256i dot_s8s8_256(__m256i x, __m256i a) {
  const __mmask32 neg = _mm256_movepi8_mask(x);
  const __m256i sa = _mm256_mask_sub_epi8(a, neg, _mm256_setzero_si256(), a);
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(x), sa);
}

// Float weight rows (f32, or f16 when kHalf): 16 elements from element i as f32, and one element.
template <bool kHalf>
static inline __m512 load_w16(const uint8_t* w, int64_t i) {
  if constexpr (kHalf) {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(w) + i)));
  }
  return _mm512_loadu_ps(reinterpret_cast<const float*>(w) + i);
}

template <bool kHalf>
static inline float w_scalar(const uint8_t* w, int64_t i) {
  if constexpr (kHalf) {
    uint16_t h;
    std::memcpy(&h, w + 2 * i, 2);
    return unpack_f16(h);
  }
  float f;
  std::memcpy(&f, w + 4 * i, 4);
  return f;
}

// K-quants (q4_K, q6_K), 64 elements per step: quants as u8 (q4_K nibbles; q6_K q + 32) and the
// step's 16-bit sub-block scales, then VPMADDUBSW + VPDPWSSD add scale x (quant x activation) into
// 16 i32 lanes (exact: pair sums stay within i16, no saturation).
static constexpr __mmask32 kUpperWords = 0xFFFF0000u;  // 16-bit lanes 16..31 (bytes 32..63)

// q4_K chunk c (32 bytes of qs) -> elements 64c .. 64c + 31 (low nibbles), then 64c + 32 .. + 63.
static inline __m512i q4k_quants(const uint8_t* qs32) {
  const __m512i v = _mm512_broadcast_i64x4(avx2::load256(qs32));
  return _mm512_and_si512(_mm512_mask_srli_epi16(v, kUpperWords, v, 4), _mm512_set1_epi8(0x0F));
}

// q4_K chunk c's scale permutation: words 0..15 take scale 2c, words 16..31 scale 2c + 1.
static inline __m512i q4k_scale_idx(int c) {
  return _mm512_mask_blend_epi16(kUpperWords, _mm512_set1_epi16(static_cast<int16_t>(2 * c)),
                                 _mm512_set1_epi16(static_cast<int16_t>(2 * c + 1)));
}

// q6_K step (h, g): elements 128 h + 64 g + [0, 64) as q + 32 in [0, 63].
static inline __m512i q6k_quants(const uint8_t* ql, const uint8_t* qh, int h, int g) {
  const __m512i l = _mm512_loadu_si512(ql + 64 * h);
  const __m512i hb = _mm512_broadcast_i64x4(avx2::load256(qh + 32 * h));
  __m512i lo, hi;  // low 4 bits; high 2 bits at bits 4..5
  if (g == 0) {    // elements 0..31 of the half: qh bits 0..1; 32..63: bits 2..3
    lo = _mm512_and_si512(l, _mm512_set1_epi8(0x0F));
    hi = _mm512_mask_slli_epi16(_mm512_slli_epi16(hb, 4), kUpperWords, hb, 2);
  } else {  // elements 64..95: qh bits 4..5; 96..127: bits 6..7
    lo = _mm512_and_si512(_mm512_srli_epi16(l, 4), _mm512_set1_epi8(0x0F));
    hi = _mm512_mask_srli_epi16(hb, kUpperWords, hb, 2);
  }
  return _mm512_or_si512(lo, _mm512_and_si512(hi, _mm512_set1_epi8(0x30)));
}

// q6_K step hg = 2h + g: sub-blocks 4 hg .. 4 hg + 3, one per 128-bit block of the scale vector.
static inline __m512i q6k_scale_idx(int hg) {
  return _mm512_add_epi16(_mm512_set1_epi16(static_cast<int16_t>(4 * hg)),
                          _mm512_setr_epi64(0, 0, 0x0001000100010001, 0x0001000100010001, 0x0002000200020002,
                                            0x0002000200020002, 0x0003000300030003, 0x0003000300030003));
}

// q8_0: two consecutive blocks' 32 signed quants each, joined (block x0's elements, then x1's).
static inline __m512i q8_0_pair(const BlockQ8_0& x0, const BlockQ8_0& x1) {
  return join(avx2::load256(x0.qs), avx2::load256(x1.qs));
}

}  // namespace kvtier::cpu::avx512
