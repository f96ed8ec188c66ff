// AVX2 activation quantisation: the same bytes as the scalar quantize_act_row (quantize_act.h), as
// quantize_act_avx512.cpp does 16 lanes at a time. Per block: amax by lane maxima (exact in any
// order), d = amax / 127 and 1 / d as scalars exactly as the reference computes them,
// q = round-to-nearest-even(x * (1 / d)) clamped to [-127, 127] (integer bounds, so clamping before
// rounding gives the same integers; VCVTPS2DQ rounds by MXCSR, which is to-nearest-even, as
// std::nearbyint in the reference), exact integer sums.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "backend/cpu/blocks.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/quantize_act.h"

namespace kvtier::cpu {
namespace {

// max(|x_i|, acc) lane-wise; the accumulator is the second operand, so a NaN element is skipped as
// std::max(amax, NaN) does in the reference.
__m256 abs_max(__m256 acc, __m256 v) {
  return _mm256_max_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), v), acc);
}

float reduce_max(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

int reduce_add(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

float inverse_scale(float amax, float* d) {
  *d = amax / 127.0f;
  return *d != 0.0f ? 1.0f / *d : 0.0f;
}

// 8 floats -> 8 quants as i32.
__m256i quantize8(__m256 v, __m256 id) {
  __m256 s = _mm256_mul_ps(v, id);
  s = _mm256_min_ps(_mm256_max_ps(s, _mm256_set1_ps(-127.0f)), _mm256_set1_ps(127.0f));
  return _mm256_cvtps_epi32(s);
}

// 32 quants as 4 x 8 i32 -> 32 bytes in element order.
void store32(__m256i q0, __m256i q1, __m256i q2, __m256i q3, int8_t* q) {
  const __m256i w01 = _mm256_packs_epi32(q0, q1);  // lanes: q0[0..3] q1[0..3] | q0[4..7] q1[4..7]
  const __m256i w23 = _mm256_packs_epi32(q2, q3);
  const __m256i b = _mm256_packs_epi16(w01, w23);  // 0..3 8..11 16..19 24..27 | 4..7 12..15 20..23 28..31
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(b, order));
}

template <bool kMin>
void quantize_q8_32(const float* x, int64_t k, uint8_t* dst) {
  for (int64_t b = 0; b < k / kQK; ++b) {
    const float* xb = x + b * kQK;
    const __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8), v2 = _mm256_loadu_ps(xb + 16),
                 v3 = _mm256_loadu_ps(xb + 24);
    const __m256 m = abs_max(abs_max(abs_max(abs_max(_mm256_setzero_ps(), v0), v1), v2), v3);
    ActQ8_32 blk;
    const __m256 id = _mm256_set1_ps(inverse_scale(reduce_max(m), &blk.d));
    const __m256i q0 = quantize8(v0, id), q1 = quantize8(v1, id), q2 = quantize8(v2, id),
                  q3 = quantize8(v3, id);
    store32(q0, q1, q2, q3, blk.qs);
    const int32_t sum = reduce_add(_mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3)));
    set_act_sum<kMin>(blk, sum);
    std::memcpy(dst + b * sizeof(ActQ8_32), &blk, sizeof(blk));
  }
}

void quantize_q8_k(const float* x, int64_t k, uint8_t* dst) {
  for (int64_t b = 0; b < k / kQKK; ++b) {
    const float* xb = x + b * kQKK;
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < kQKK / 8; ++j) m = abs_max(m, _mm256_loadu_ps(xb + 8 * j));
    ActQ8_K blk;
    const __m256 id = _mm256_set1_ps(inverse_scale(reduce_max(m), &blk.d));
    for (int j = 0; j < kQKK / 32; ++j) {
      const float* xj = xb + 32 * j;
      const __m256i q0 = quantize8(_mm256_loadu_ps(xj), id), q1 = quantize8(_mm256_loadu_ps(xj + 8), id),
                    q2 = quantize8(_mm256_loadu_ps(xj + 16), id),
                    q3 = quantize8(_mm256_loadu_ps(xj + 24), id);
      store32(q0, q1, q2, q3, blk.qs + 32 * j);
      blk.bsums[2 * j] = static_cast<int16_t>(reduce_add(_mm256_add_epi32(q0, q1)));
      blk.bsums[2 * j + 1] = static_cast<int16_t>(reduce_add(_mm256_add_epi32(q2, q3)));
    }
    std::memcpy(dst + b * sizeof(ActQ8_K), &blk, sizeof(blk));
  }
}

}  // namespace

void fill_avx2_quantize_act(KernelTable& t) {
  t.quantize_act[static_cast<size_t>(ActFormat::kQ8_32)] = quantize_q8_32<false>;
  t.quantize_act[static_cast<size_t>(ActFormat::kQ8_32Min)] = quantize_q8_32<true>;
  t.quantize_act[static_cast<size_t>(ActFormat::kQ8_K)] = quantize_q8_k;
}

}  // namespace kvtier::cpu
