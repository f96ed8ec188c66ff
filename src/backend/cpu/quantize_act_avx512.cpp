// AVX-512 activation quantisation: the same bytes as the scalar quantize_act_row (quantize_act.h).
// Per block: amax by lane maxima (exact in any order), d = amax / 127 and 1 / d as scalars exactly as
// the reference computes them, q = round-to-nearest-even(x * (1 / d)) clamped to [-127, 127] (the
// bounds are integers, so clamping before rounding gives the same integers), exact integer sums.
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
__m512 abs_max(__m512 acc, __m512 v) {
  return _mm512_max_ps(_mm512_abs_ps(v), acc);
}

float inverse_scale(float amax, float* d) {
  *d = amax / 127.0f;
  return *d != 0.0f ? 1.0f / *d : 0.0f;
}

// 16 floats -> 16 quants as i32 (written as bytes to q).
__m512i quantize16(__m512 v, __m512 id, int8_t* q) {
  __m512 s = _mm512_mul_ps(v, id);
  s = _mm512_min_ps(_mm512_max_ps(s, _mm512_set1_ps(-127.0f)), _mm512_set1_ps(127.0f));
  const __m512i i = _mm512_cvt_roundps_epi32(s, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(i));
  return i;
}

template <bool kMin>
void quantize_q8_32(const float* x, int64_t k, uint8_t* dst) {
  for (int64_t b = 0; b < k / kQK; ++b) {
    const float* xb = x + b * kQK;
    const __m512 v0 = _mm512_loadu_ps(xb), v1 = _mm512_loadu_ps(xb + 16);
    const float amax = _mm512_reduce_max_ps(abs_max(abs_max(_mm512_setzero_ps(), v0), v1));
    ActQ8_32 blk;
    const __m512 id = _mm512_set1_ps(inverse_scale(amax, &blk.d));
    const __m512i q0 = quantize16(v0, id, blk.qs);
    const __m512i q1 = quantize16(v1, id, blk.qs + 16);
    const int32_t sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    set_act_sum<kMin>(blk, sum);
    std::memcpy(dst + b * sizeof(ActQ8_32), &blk, sizeof(blk));
  }
}

void quantize_q8_k(const float* x, int64_t k, uint8_t* dst) {
  for (int64_t b = 0; b < k / kQKK; ++b) {
    const float* xb = x + b * kQKK;
    __m512 m = _mm512_setzero_ps();
    for (int j = 0; j < kQKK / 16; ++j) m = abs_max(m, _mm512_loadu_ps(xb + 16 * j));
    ActQ8_K blk;
    const __m512 id = _mm512_set1_ps(inverse_scale(_mm512_reduce_max_ps(m), &blk.d));
    for (int j = 0; j < kQKK / 16; ++j) {
      const __m512i q = quantize16(_mm512_loadu_ps(xb + 16 * j), id, blk.qs + 16 * j);
      blk.bsums[j] = static_cast<int16_t>(_mm512_reduce_add_epi32(q));
    }
    std::memcpy(dst + b * sizeof(ActQ8_K), &blk, sizeof(blk));
  }
}

}  // namespace

void fill_avx512_quantize_act(KernelTable& t) {
  t.quantize_act[static_cast<size_t>(ActFormat::kQ8_32)] = quantize_q8_32<false>;
  t.quantize_act[static_cast<size_t>(ActFormat::kQ8_32Min)] = quantize_q8_32<true>;
  t.quantize_act[static_cast<size_t>(ActFormat::kQ8_K)] = quantize_q8_k;
}

}  // namespace kvtier::cpu
