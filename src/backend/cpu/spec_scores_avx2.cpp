// spec_scores on AVX2 (+F16C): 8 rows per vector. The 8 rows' f16 keys are loaded as they lie (contiguous,
// K halves apart) 8 columns at a time, widened to f32 (exact) and transposed in registers, so lane i holds
// row i's column c; each lane then runs the scalar order (mul, then add, columns ascending; max as
// std::max(best, v)).
#include <immintrin.h>

#include <cstring>
#include <limits>

#include "backend/cpu/spec_scores.h"

namespace kvtier::cpu {
namespace {

// r[i] = row i's 8 columns -> r[c] = column c of the 8 rows (lane i = row i).
inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
  r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
  r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
  r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
  r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
  r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
  r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
  r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// 8 halves of a row from `p` as f32. `over` (the block is not at the end of the keys): the 16-byte load
// may run past the row's last column into the rows after it, whose values land in lanes no sum uses;
// otherwise only the w halves that exist are read.
inline __m256 load_row(const uint16_t* p, int64_t w, bool over) {
  if (w == 8 || over) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  alignas(16) uint16_t tmp[8] = {};
  std::memcpy(tmp, p, static_cast<size_t>(w) * sizeof(uint16_t));
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(tmp)));
}

// acc[j] (+)= q[j][c] · column c of 8 rows at `base` (rows K halves apart), c ascending, for NJ query
// heads (a compile-time count, so the accumulators stay in registers).
template <int NJ>
inline void sweep(const float* qj, int64_t K, const uint16_t* base, bool over, __m256 acc[NJ]) {
  constexpr int64_t kLanes = 8;
  for (int j = 0; j < NJ; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t c0 = 0; c0 < K; c0 += kLanes) {
    const int64_t w = K - c0 < kLanes ? K - c0 : kLanes;
    __m256 col[kLanes];  // [8 rows][8 columns] -> [8 columns][8 rows]
    for (int64_t i = 0; i < kLanes; ++i) col[i] = load_row(base + i * K + c0, w, over);
    transpose8(col);
    for (int64_t c = 0; c < w; ++c)
      for (int j = 0; j < NJ; ++j)
        acc[j] = _mm256_add_ps(acc[j], _mm256_mul_ps(_mm256_set1_ps(qj[j * K + c0 + c]), col[c]));
  }
}

}  // namespace

void spec_scores_avx2(const float* q, int64_t G, int64_t K, const uint16_t* pk, int64_t T, float scale,
                      float* out) {
  constexpr int64_t kLanes = 8;
  constexpr int64_t kHeads = 4;     // query heads per sweep over the columns (accumulators in registers)
  constexpr int64_t kPrefetch = 8;  // blocks of 8 rows
  const __m256 vscale = _mm256_set1_ps(scale);
  int64_t t = 0;
  for (; t + kLanes <= T; t += kLanes) {
    const uint16_t* base = pk + t * K;
    // The rows kPrefetch blocks ahead (the partial keys stream from memory once per decode step).
    if (t + (kPrefetch + 1) * kLanes <= T) {
      const auto* ahead = reinterpret_cast<const char*>(base + kPrefetch * kLanes * K);
      for (int64_t b = 0; b < kLanes * K * 2; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
    }
    // A last partial 8-column group reads at most 7 halves past its row: in bounds when the rows after this
    // block hold that many.
    const bool over = (T - t - kLanes) * K >= kLanes;
    __m256 best = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t j0 = 0; j0 < G; j0 += kHeads) {
      const int64_t nj = G - j0 < kHeads ? G - j0 : kHeads;
      const float* qj = q + j0 * K;
      __m256 acc[kHeads];
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
      for (int64_t j = 0; j < nj; ++j) best = _mm256_max_ps(_mm256_mul_ps(vscale, acc[j]), best);
    }
    _mm256_storeu_ps(out + t, best);
  }
  spec_scores_ref(q, G, K, pk + t * K, T - t, scale, out + t);
}

void spec_head_scores_avx2(const float* q, int64_t G, int64_t K, const uint16_t* pk, int64_t T, float scale,
                           float* out, int64_t ld) {
  constexpr int64_t kLanes = 8;
  constexpr int64_t kHeads = 4;
  constexpr int64_t kPrefetch = 8;
  const __m256 vscale = _mm256_set1_ps(scale);
  int64_t t = 0;
  for (; t + kLanes <= T; t += kLanes) {
    const uint16_t* base = pk + t * K;
    if (t + (kPrefetch + 1) * kLanes <= T) {
      const auto* ahead = reinterpret_cast<const char*>(base + kPrefetch * kLanes * K);
      for (int64_t b = 0; b < kLanes * K * 2; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
    }
    const bool over = (T - t - kLanes) * K >= kLanes;
    for (int64_t j0 = 0; j0 < G; j0 += kHeads) {
      const int64_t nj = G - j0 < kHeads ? G - j0 : kHeads;
      const float* qj = q + j0 * K;
      __m256 acc[kHeads];
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
      for (int64_t j = 0; j < nj; ++j)
        _mm256_storeu_ps(out + (j0 + j) * ld + t, _mm256_mul_ps(vscale, acc[j]));
    }
  }
  spec_head_scores_ref(q, G, K, pk + t * K, T - t, scale, out + t, ld);
}

}  // namespace kvtier::cpu
