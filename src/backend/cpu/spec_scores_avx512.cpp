// spec_scores on AVX-512: 16 rows per vector, spec_scores_avx2.cpp's method at twice the width. Rows i and
// i + 8 of a block of 16 share a register (low and high 256 bits), their f16 keys loaded 8 columns at a
// time and widened to f32 (exact); the 8 x 8 transpose runs in both halves at once, so lane i holds row i's
// column c and lane 8 + i row i + 8's. Each lane then runs the scalar order (mul, then add, columns
// ascending; max as std::max(best, v)), so every output has spec_scores_ref's bits. The rows past the last
// whole block of 16 go to the AVX2 kernel (same bits).
#include <immintrin.h>

#include <cstring>
#include <limits>

#include "backend/cpu/spec_scores.h"

namespace kvtier::cpu {
namespace {

// r[i] = [row i's 8 columns | row i + 8's 8 columns] -> r[c] = [column c of rows 0..7 | of rows 8..15].
inline void transpose8x2(__m512 r[8]) {
  const __m512 t0 = _mm512_unpacklo_ps(r[0], r[1]), t1 = _mm512_unpackhi_ps(r[0], r[1]);
  const __m512 t2 = _mm512_unpacklo_ps(r[2], r[3]), t3 = _mm512_unpackhi_ps(r[2], r[3]);
  const __m512 t4 = _mm512_unpacklo_ps(r[4], r[5]), t5 = _mm512_unpackhi_ps(r[4], r[5]);
  const __m512 t6 = _mm512_unpacklo_ps(r[6], r[7]), t7 = _mm512_unpackhi_ps(r[6], r[7]);
  const __m512 s0 = _mm512_shuffle_ps(t0, t2, 0x44), s1 = _mm512_shuffle_ps(t0, t2, 0xEE);
  const __m512 s2 = _mm512_shuffle_ps(t1, t3, 0x44), s3 = _mm512_shuffle_ps(t1, t3, 0xEE);
  const __m512 s4 = _mm512_shuffle_ps(t4, t6, 0x44), s5 = _mm512_shuffle_ps(t4, t6, 0xEE);
  const __m512 s6 = _mm512_shuffle_ps(t5, t7, 0x44), s7 = _mm512_shuffle_ps(t5, t7, 0xEE);
  // Per 256-bit half: the low 128 bits of a then of b (lo), or the high ones (hi).
  const __m512i lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27);
  const __m512i hi = _mm512_setr_epi32(4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31);
  r[0] = _mm512_permutex2var_ps(s0, lo, s4);
  r[1] = _mm512_permutex2var_ps(s1, lo, s5);
  r[2] = _mm512_permutex2var_ps(s2, lo, s6);
  r[3] = _mm512_permutex2var_ps(s3, lo, s7);
  r[4] = _mm512_permutex2var_ps(s0, hi, s4);
  r[5] = _mm512_permutex2var_ps(s1, hi, s5);
  r[6] = _mm512_permutex2var_ps(s2, hi, s6);
  r[7] = _mm512_permutex2var_ps(s3, hi, s7);
}

// 8 halves of rows `lo` and `hi` as f32 in the two halves of a register. `over` (the block is not at the
// end of the keys): the 16-byte loads may run past a row's last column into the rows after it, whose
// values land in lanes no sum uses; otherwise only the w halves that exist are read.
inline __m512 load_rows(const uint16_t* lo, const uint16_t* hi, int64_t w, bool over) {
  if (w == 8 || over) {
    const __m128i l = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lo));
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(l), h, 1));
  }
  alignas(32) uint16_t tmp[16] = {};
  std::memcpy(tmp, lo, static_cast<size_t>(w) * sizeof(uint16_t));
  std::memcpy(tmp + 8, hi, static_cast<size_t>(w) * sizeof(uint16_t));
  return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(tmp)));
}

// acc[j] (+)= q[j][c] · column c of 16 rows at `base` (rows K halves apart), c ascending, for NJ query
// heads (a compile-time count, so the accumulators stay in registers).
template <int NJ>
inline void sweep(const float* qj, int64_t K, const uint16_t* base, bool over, __m512 acc[NJ]) {
  constexpr int64_t kCols = 8;
  for (int j = 0; j < NJ; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t c0 = 0; c0 < K; c0 += kCols) {
    const int64_t w = K - c0 < kCols ? K - c0 : kCols;
    __m512 col[kCols];  // [8 row pairs][8 columns] -> [8 columns][16 rows]
    for (int64_t i = 0; i < kCols; ++i)
      col[i] = load_rows(base + i * K + c0, base + (i + 8) * K + c0, w, over);
    transpose8x2(col);
    for (int64_t c = 0; c < w; ++c)
      for (int j = 0; j < NJ; ++j)
        acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(_mm512_set1_ps(qj[j * K + c0 + c]), col[c]));
  }
}

constexpr int64_t kRows = 16;     // rows per block (one lane each)
constexpr int64_t kHeads = 4;     // query heads per sweep over the columns (accumulators in registers)
constexpr int64_t kPrefetch = 4;  // blocks of 16 rows

// Runs sweep<nj> for nj = 1..4 query heads from qj.
inline void sweep_heads(int64_t nj, const float* qj, int64_t K, const uint16_t* base, bool over,
                        __m512 acc[kHeads]) {
  switch (nj) {
    case 1:
      sweep<1>(qj, K, base, over, acc);
      break;
    case 2:
      sweep<2>(qj, K, base, over, acc);
      break;
    case 3:
      sweep<3>(qj, K, base, over, acc);
      break;
    default:
      sweep<4>(qj, K, base, over, acc);
      break;
  }
}

// The block of rows from `base`: the rows kPrefetch blocks ahead are prefetched (the partial keys stream
// from memory once per decode step). Returns whether the block's loads may read past a row (see load_rows):
// a last partial 8-column group reads at most 7 halves past its row, in bounds when the rows after this
// block hold that many.
inline bool start_block(const uint16_t* base, int64_t t, int64_t T, int64_t K) {
  if (t + (kPrefetch + 1) * kRows <= T) {
    const auto* ahead = reinterpret_cast<const char*>(base + kPrefetch * kRows * K);
    for (int64_t b = 0; b < kRows * K * 2; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
  }
  return (T - t - kRows) * K >= 8;
}

}  // namespace

void spec_scores_avx512(const float* q, int64_t G, int64_t K, const uint16_t* pk, int64_t T, float scale,
                        float* out) {
  const __m512 vscale = _mm512_set1_ps(scale);
  int64_t t = 0;
  for (; t + kRows <= T; t += kRows) {
    const uint16_t* base = pk + t * K;
    const bool over = start_block(base, t, T, K);
    __m512 best = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t j0 = 0; j0 < G; j0 += kHeads) {
      const int64_t nj = G - j0 < kHeads ? G - j0 : kHeads;
      __m512 acc[kHeads];
      sweep_heads(nj, q + j0 * K, K, base, over, acc);
      for (int64_t j = 0; j < nj; ++j) best = _mm512_max_ps(_mm512_mul_ps(vscale, acc[j]), best);
    }
    _mm512_storeu_ps(out + t, best);
  }
  spec_scores_avx2(q, G, K, pk + t * K, T - t, scale, out + t);
}

void spec_head_scores_avx512(const float* q, int64_t G, int64_t K, const uint16_t* pk, int64_t T, float scale,
                             float* out, int64_t ld) {
  const __m512 vscale = _mm512_set1_ps(scale);
  int64_t t = 0;
  for (; t + kRows <= T; t += kRows) {
    const uint16_t* base = pk + t * K;
    const bool over = start_block(base, t, T, K);
    for (int64_t j0 = 0; j0 < G; j0 += kHeads) {
      const int64_t nj = G - j0 < kHeads ? G - j0 : kHeads;
      __m512 acc[kHeads];
      sweep_heads(nj, q + j0 * K, K, base, over, acc);
      for (int64_t j = 0; j < nj; ++j)
        _mm512_storeu_ps(out + (j0 + j) * ld + t, _mm512_mul_ps(vscale, acc[j]));
    }
  }
  spec_head_scores_avx2(q, G, K, pk + t * K, T - t, scale, out + t, ld);
}

}  // namespace kvtier::cpu
