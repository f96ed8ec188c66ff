// AVX2 helpers, included only by translation units compiled with -mavx2 -mfma -mf16c. All helpers
// are static (internal linkage) so no copy can be shared with code running on other CPUs.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace kvtier::cpu::avx2 {

static inline float hsum_f32(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

static inline uint32_t load_u32(const void* p) {
  uint32_t u;
  std::memcpy(&u, p, 4);
  return u;
}

static inline float f16(uint16_t h) {
  return _cvtsh_ss(h);
}

// 16 packed bytes -> 32 bytes: low nibbles (elements 0..15) then high nibbles (16..31). The 16 bytes
// are loaded into both halves and the upper half shifted by 4 (one variable shift, no insert).
static inline __m256i nibbles_32(const uint8_t* qs) {
  const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  const __m256i shifted = _mm256_srlv_epi32(both, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
  return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
}

// 32 bits (little-endian) -> 32 bytes, byte i = 0x10 if bit i is set, else 0.
static inline __m256i bits_to_0x10(const uint8_t* qh) {
  uint32_t x;
  std::memcpy(&x, qh, 4);
  // byte i picks source byte i / 8, then tests bit i % 8
  const __m256i pick = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(x)), pick);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// Sum over pairs of u8 x s8 products -> 8 x i32 (u * s pairs stay within int16: |u| <= 128, |s| <= 127).
static inline __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// Same for two signed operands (|x| <= 128 as u8 after abs, a in [-127, 127]).
static inline __m256i dot_s8s8(__m256i x, __m256i a) {
  return dot_u8s8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(a, x));
}

// Q4_K/Q5_K: sum_j mn[j] * (bsums[2j] + bsums[2j + 1]) over the 8 sub-blocks (exact integers).
static inline int min_sum_k4(const uint8_t* mn, const int16_t* bsums) {
  const __m128i b_lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bsums));
  const __m128i b_hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bsums + 8));
  const __m128i pairs = _mm_hadd_epi16(b_lo, b_hi);  // [8] i16, |.| <= 2 * 16 * 127
  uint64_t m;
  std::memcpy(&m, mn, 8);
  const __m128i mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(m)));
  __m128i s = _mm_madd_epi16(mins, pairs);  // [4] i32
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// One-token tiles read R rows side by side, R short streams that the hardware prefetchers pick up
// late (measured: 2-5x slower than one row after another once the weights come from memory). They
// prefetch instead: the R rows are one contiguous span of R * row_bytes, consumed at
// `step` = R * block bytes per block, so prefetching `step` bytes at `kPrefetchAhead` past the
// consumption point (which runs on into the next rows' span) keeps a steady distance ahead.
constexpr int64_t kPrefetchAhead = 6144;

static inline void prefetch_ahead(const uint8_t* span, int64_t b, int64_t step) {
  const uint8_t* p = span + kPrefetchAhead + b * step;
  for (int64_t o = 0; o < step; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T0);
}

// Q6_K: the block's 16 signed scales as 16 x i16.
static inline __m256i q6k_scales16(const int8_t* scales) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales)));
}

// Q6_K's +32 offset folded into the integer lanes: acc - 32 * (sc_j * bsum_j summed in pairs), so
// that hsum gives sum(acc) - 32 * sum_j sc_j * bsum_j, the same integer as the scalar loop (no lane
// overflows: |acc| < 2^28, |32 * sc * bsum| < 2^23).
static inline __m256i q6k_offset_out(__m256i acc, __m256i sc16, const int16_t* bsums) {
  const __m256i corr = _mm256_madd_epi16(sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bsums)));
  return _mm256_sub_epi32(acc, _mm256_slli_epi32(corr, 5));
}

// A panel tile's row r (lane t: token t of 8) written to y[t * ldy + r].
static inline void store_token_lanes(__m256 v, float* y, int64_t ldy, int r) {
  alignas(32) float out[8];
  _mm256_store_ps(out, v);
  for (int t = 0; t < 8; ++t) y[t * ldy + r] = out[t];
}

static inline __m256i load256(const void* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

}  // namespace kvtier::cpu::avx2
