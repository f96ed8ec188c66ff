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

// Key and value rows are f32 or f16 (converted in registers; F16C's conversion is exact, so a chain
// over f16 rows is the chain over their f32 values).
__m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
__m256 load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
float to_f32(float x) {
  return x;
}
float to_f32(uint16_t x) {
  return f16_to_f32(x);
}

template <typename T>
float dot_tail(const float* a, const T* b, int64_t i0, int64_t d) {
  float s = 0.0f;
  for (int64_t i = i0; i < d; ++i) s += a[i] * to_f32(b[i]);
  return s;
}

// One (row, key) score is always an 8-lane FMA chain over the first d8 elements, hsum_f32, plus
// the scalar tail; NR rows x C keys run as NR C independent chains, each key load shared by the rows.
template <int NR, int C, typename T>
void scores_rows(const float* q, int64_t q_stride, const T* k, int64_t n, int64_t d, float* s) {
  const int64_t d8 = d & ~int64_t{7};
  int64_t j = 0;
  for (; j + C <= n; j += C) {
    const T* k0 = k + j * d;
    __m256 a[NR][C];
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < C; ++c) a[r][c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < d8; i += 8) {
      __m256 vk[C];
      for (int c = 0; c < C; ++c) vk[c] = load8(k0 + c * d + i);
      for (int r = 0; r < NR; ++r) {
        const __m256 vq = _mm256_loadu_ps(q + r * q_stride + i);
        for (int c = 0; c < C; ++c) a[r][c] = _mm256_fmadd_ps(vq, vk[c], a[r][c]);
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < C; ++c)
        s[r * n + j + c] = hsum_f32(a[r][c]) + dot_tail(q + r * q_stride, k0 + c * d, d8, d);
  }
  for (; j < n; ++j) {
    const T* kj = k + j * d;
    for (int r = 0; r < NR; ++r) {
      const float* qr = q + r * q_stride;
      __m256 a0 = _mm256_setzero_ps();
      for (int64_t i = 0; i < d8; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qr + i), load8(kj + i), a0);
      s[r * n + j] = hsum_f32(a0) + dot_tail(qr, kj, d8, d);
    }
  }
}

void scores(const float* q, int64_t q_stride, int64_t rows, const float* k, int64_t n, int64_t d, float* s) {
  int64_t r = 0;
  for (; r + 2 <= rows; r += 2) scores_rows<2, 4>(q + r * q_stride, q_stride, k, n, d, s + r * n);
  for (; r < rows; ++r) scores_rows<1, 4>(q + r * q_stride, q_stride, k, n, d, s + r * n);
}

// f16 keys: the rows of a GQA group take one pass over the keys (each conversion shared by up to 4
// rows), since a second pass would convert every key again.
void scores_f16(const float* q, int64_t q_stride, int64_t rows, const uint16_t* k, int64_t n, int64_t d,
                float* s) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) scores_rows<4, 2>(q + r * q_stride, q_stride, k, n, d, s + r * n);
  switch (rows - r) {
    case 3:
      scores_rows<3, 3>(q + r * q_stride, q_stride, k, n, d, s + r * n);
      break;
    case 2:
      scores_rows<2, 4>(q + r * q_stride, q_stride, k, n, d, s + r * n);
      break;
    case 1:
      scores_rows<1, 4>(q + r * q_stride, q_stride, k, n, d, s + r * n);
      break;
    default:
      break;
  }
}

// Element i of a row is always the FMA chain acc[i] = fma(p[j], v[j, i], acc[i]) over j in order;
// NR rows share each V load, NV registers of 8 elements per row are live (NR x NV chains).
template <int NR, int NV, typename T>
void accumulate_rows(const float* p, int64_t n, const T* v, int64_t dv, float* acc) {
  const int64_t d8 = dv & ~int64_t{7};
  int64_t i0 = 0;
  for (; i0 + 8 * NV <= d8; i0 += 8 * NV) {
    __m256 a[NR][NV];
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < NV; ++c) a[r][c] = _mm256_loadu_ps(acc + r * dv + i0 + 8 * c);
    for (int64_t j = 0; j < n; ++j) {
      __m256 vv[NV];
      for (int c = 0; c < NV; ++c) vv[c] = load8(v + j * dv + i0 + 8 * c);
      for (int r = 0; r < NR; ++r) {
        const __m256 vp = _mm256_set1_ps(p[r * n + j]);
        for (int c = 0; c < NV; ++c) a[r][c] = _mm256_fmadd_ps(vp, vv[c], a[r][c]);
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < NV; ++c) _mm256_storeu_ps(acc + r * dv + i0 + 8 * c, a[r][c]);
  }
  for (; i0 < d8; i0 += 8) {
    for (int r = 0; r < NR; ++r) {
      __m256 a0 = _mm256_loadu_ps(acc + r * dv + i0);
      for (int64_t j = 0; j < n; ++j)
        a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[r * n + j]), load8(v + j * dv + i0), a0);
      _mm256_storeu_ps(acc + r * dv + i0, a0);
    }
  }
  for (int r = 0; r < NR; ++r) {
    for (int64_t i = d8; i < dv; ++i) {
      for (int64_t j = 0; j < n; ++j)
        acc[r * dv + i] = std::fma(p[r * n + j], to_f32(v[j * dv + i]), acc[r * dv + i]);
    }
  }
}

template <typename T>
void accumulate_any(const float* p, int64_t rows, const T* v, int64_t n, int64_t dv, float* acc) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) accumulate_rows<4, 2>(p + r * n, n, v, dv, acc + r * dv);
  if (rows - r == 3) {
    accumulate_rows<3, 2>(p + r * n, n, v, dv, acc + r * dv);
    return;
  }
  if (rows - r == 2) {
    accumulate_rows<2, 4>(p + r * n, n, v, dv, acc + r * dv);
    return;
  }
  if (rows - r == 1) accumulate_rows<1, 4>(p + r * n, n, v, dv, acc + r * dv);
}

void accumulate(const float* p, int64_t rows, const float* v, int64_t n, int64_t dv, float* acc) {
  accumulate_any(p, rows, v, n, dv, acc);
}

void accumulate_f16(const float* p, int64_t rows, const uint16_t* v, int64_t n, int64_t dv, float* acc) {
  accumulate_any(p, rows, v, n, dv, acc);
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

constexpr AttnTileOps kOps{scores,         accumulate, scores_f16, accumulate_f16,
                           f16_to_f32_row, scale,      exp_sum,    kivi_dequant_avx2};

}  // namespace

const AttnTileOps& attn_tile_ops_avx2() {
  return kOps;
}

}  // namespace kvtier::cpu
