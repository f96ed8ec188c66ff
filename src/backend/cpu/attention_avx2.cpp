// AVX2 + FMA + F16C tile kernels of the blocked attention. exp is the polynomial of
// float_ops_avx2.cpp (2^n e^r, degree-6 Taylor on |r| <= ln2/2, a few ulp from std::exp).
#include <immintrin.h>

#include <cmath>

#include "backend/cpu/attention.h"
#include "backend/cpu/simd_avx2.h"
#include "core/half.h"

namespace kvtier::cpu {
namespace {

using avx2::hsum_f32;

__m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.4426950408889634f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i pow2n =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(pow2n));
}

float dot_tail(const float* a, const float* b, int64_t i0, int64_t d) {
  float s = 0.0f;
  for (int64_t i = i0; i < d; ++i) s += a[i] * b[i];
  return s;
}

void scores(const float* q, const float* k, int64_t n, int64_t d, float* s) {
  const int64_t d8 = d & ~int64_t{7};
  int64_t j = 0;
  for (; j + 4 <= n; j += 4) {
    const float* k0 = k + j * d;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
           a3 = _mm256_setzero_ps();
    for (int64_t i = 0; i < d8; i += 8) {
      const __m256 vq = _mm256_loadu_ps(q + i);
      a0 = _mm256_fmadd_ps(vq, _mm256_loadu_ps(k0 + i), a0);
      a1 = _mm256_fmadd_ps(vq, _mm256_loadu_ps(k0 + d + i), a1);
      a2 = _mm256_fmadd_ps(vq, _mm256_loadu_ps(k0 + 2 * d + i), a2);
      a3 = _mm256_fmadd_ps(vq, _mm256_loadu_ps(k0 + 3 * d + i), a3);
    }
    s[j] = hsum_f32(a0) + dot_tail(q, k0, d8, d);
    s[j + 1] = hsum_f32(a1) + dot_tail(q, k0 + d, d8, d);
    s[j + 2] = hsum_f32(a2) + dot_tail(q, k0 + 2 * d, d8, d);
    s[j + 3] = hsum_f32(a3) + dot_tail(q, k0 + 3 * d, d8, d);
  }
  for (; j < n; ++j) {  // same per-key arithmetic as above
    const float* kj = k + j * d;
    __m256 a0 = _mm256_setzero_ps();
    for (int64_t i = 0; i < d8; i += 8)
      a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), _mm256_loadu_ps(kj + i), a0);
    s[j] = hsum_f32(a0) + dot_tail(q, kj, d8, d);
  }
}

void accumulate(const float* p, const float* v, int64_t n, int64_t dv, float* acc) {
  const int64_t d8 = dv & ~int64_t{7};
  int64_t i0 = 0;
  for (; i0 + 32 <= d8; i0 += 32) {  // 4 registers of acc stay live over all keys
    __m256 r0 = _mm256_loadu_ps(acc + i0), r1 = _mm256_loadu_ps(acc + i0 + 8),
           r2 = _mm256_loadu_ps(acc + i0 + 16), r3 = _mm256_loadu_ps(acc + i0 + 24);
    for (int64_t j = 0; j < n; ++j) {
      const __m256 vp = _mm256_set1_ps(p[j]);
      const float* vj = v + j * dv + i0;
      r0 = _mm256_fmadd_ps(vp, _mm256_loadu_ps(vj), r0);
      r1 = _mm256_fmadd_ps(vp, _mm256_loadu_ps(vj + 8), r1);
      r2 = _mm256_fmadd_ps(vp, _mm256_loadu_ps(vj + 16), r2);
      r3 = _mm256_fmadd_ps(vp, _mm256_loadu_ps(vj + 24), r3);
    }
    _mm256_storeu_ps(acc + i0, r0);
    _mm256_storeu_ps(acc + i0 + 8, r1);
    _mm256_storeu_ps(acc + i0 + 16, r2);
    _mm256_storeu_ps(acc + i0 + 24, r3);
  }
  for (; i0 < d8; i0 += 8) {
    __m256 r0 = _mm256_loadu_ps(acc + i0);
    for (int64_t j = 0; j < n; ++j)
      r0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + j * dv + i0), r0);
    _mm256_storeu_ps(acc + i0, r0);
  }
  for (int64_t i = d8; i < dv; ++i) {
    for (int64_t j = 0; j < n; ++j) acc[i] = std::fma(p[j], v[j * dv + i], acc[i]);
  }
}

void f16_to_f32_row(const uint16_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

void scale(float* x, int64_t n, float c) {
  const __m256 vc = _mm256_set1_ps(c);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), vc));
  for (; i < n; ++i) x[i] *= c;
}

float exp_sum(const float* s, int64_t n, float m, float* p) {
  const __m256 vm = _mm256_set1_ps(m);
  __m256 vs = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm));
    _mm256_storeu_ps(p + j, e);
    vs = _mm256_add_ps(vs, e);
  }
  float sum = hsum_f32(vs);
  for (; j < n; ++j) {
    p[j] = std::exp(s[j] - m);
    sum += p[j];
  }
  return sum;
}

constexpr AttnTileOps kOps{scores, accumulate, f16_to_f32_row, scale, exp_sum};

}  // namespace

const AttnTileOps& attn_tile_ops_avx2() {
  return kOps;
}

}  // namespace kvtier::cpu
