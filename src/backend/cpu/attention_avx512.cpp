// AVX-512 tile kernels of the blocked attention, bit-identical to attention_avx2.cpp's:
//   - scores: a (row, key) score there is an 8-lane FMA chain over d, hsum_f32, plus a scalar tail.
//     Here each 512-bit register holds two such chains side by side (rows r and r + 1 in the low and
//     high 256 bits, against the same key broadcast to both halves), so every chain is the same
//     sequence of 8-lane FMAs, and its half is reduced by the same hsum_f32;
//   - accumulate, f16_to_f32, scale: element-wise operations (one FMA / conversion / product per
//     element), the same in any vector width;
//   - exp_sum: the AVX2 kernel itself (its lane sums depend on the width);
//   - scores_f16, accumulate_f16 (decode's in-place f16 rows): the AVX2 kernels themselves. A 512-bit
//     variant was not written: they were built on an AVX2-only machine, where it could not be tested.
#include <immintrin.h>

#include "backend/cpu/attention.h"
#include "backend/cpu/simd_avx2.h"
#include "core/half.h"

namespace kvtier::cpu {
namespace {

using avx2::hsum_f32;

float dot_tail(const float* a, const float* b, int64_t i0, int64_t d) {
  float s = 0.0f;
  for (int64_t i = i0; i < d; ++i) s += a[i] * b[i];
  return s;
}

__m512 load_pair(const float* lo, const float* hi) {
  const __m512d l = _mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(lo)));
  return _mm512_castpd_ps(_mm512_insertf64x4(l, _mm256_castps_pd(_mm256_loadu_ps(hi)), 1));
}

__m512 broadcast8(const float* p) {
  return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(p))));
}

__m256 high_half(__m512 v) {
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

// Rows q, q + q_stride, ... (NP pairs) x NK keys from key j0, chains of 8 lanes two per register.
template <int NP, int NK>
void score_block(const float* q, int64_t q_stride, const float* k, int64_t j0, int64_t n, int64_t d,
                 float* s) {
  const int64_t d8 = d & ~int64_t{7};
  __m512 a[NP][NK];
  for (int p = 0; p < NP; ++p)
    for (int c = 0; c < NK; ++c) a[p][c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < d8; i += 8) {
    __m512 vq[NP];
    for (int p = 0; p < NP; ++p) vq[p] = load_pair(q + 2 * p * q_stride + i, q + (2 * p + 1) * q_stride + i);
    for (int c = 0; c < NK; ++c) {
      const __m512 vk = broadcast8(k + (j0 + c) * d + i);
      for (int p = 0; p < NP; ++p) a[p][c] = _mm512_fmadd_ps(vq[p], vk, a[p][c]);
    }
  }
  for (int p = 0; p < NP; ++p) {
    for (int c = 0; c < NK; ++c) {
      const float* kj = k + (j0 + c) * d;
      const float* q0 = q + 2 * p * q_stride;
      const float* q1 = q0 + q_stride;
      s[2 * p * n + j0 + c] = hsum_f32(_mm512_castps512_ps256(a[p][c])) + dot_tail(q0, kj, d8, d);
      s[(2 * p + 1) * n + j0 + c] = hsum_f32(high_half(a[p][c])) + dot_tail(q1, kj, d8, d);
    }
  }
}

template <int NP, int NK>
void score_rows(const float* q, int64_t q_stride, const float* k, int64_t n, int64_t d, float* s) {
  int64_t j = 0;
  for (; j + NK <= n; j += NK) score_block<NP, NK>(q, q_stride, k, j, n, d, s);
  for (; j < n; ++j) score_block<NP, 1>(q, q_stride, k, j, n, d, s);
}

void scores(const float* q, int64_t q_stride, int64_t rows, const float* k, int64_t n, int64_t d, float* s) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) score_rows<2, 4>(q + r * q_stride, q_stride, k, n, d, s + r * n);
  if (rows - r >= 2) {
    score_rows<1, 8>(q + r * q_stride, q_stride, k, n, d, s + r * n);
    r += 2;
  }
  if (r < rows) attn_tile_ops_avx2().scores(q + r * q_stride, q_stride, 1, k, n, d, s + r * n);
}

// acc[r * dv + i] = fma(p[r * n + j], v[j * dv + i], acc[r * dv + i]) for j in order (per element
// the AVX2 kernel's chain); NR rows share each V load, NV registers of 16 elements per row.
template <int NR, int NV>
void accumulate_rows(const float* p, int64_t n, const float* v, int64_t dv, float* acc) {
  int64_t i0 = 0;
  for (; i0 + 16 * NV <= dv; i0 += 16 * NV) {
    __m512 a[NR][NV];
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < NV; ++c) a[r][c] = _mm512_loadu_ps(acc + r * dv + i0 + 16 * c);
    for (int64_t j = 0; j < n; ++j) {
      __m512 vv[NV];
      for (int c = 0; c < NV; ++c) vv[c] = _mm512_loadu_ps(v + j * dv + i0 + 16 * c);
      for (int r = 0; r < NR; ++r) {
        const __m512 vp = _mm512_set1_ps(p[r * n + j]);
        for (int c = 0; c < NV; ++c) a[r][c] = _mm512_fmadd_ps(vp, vv[c], a[r][c]);
      }
    }
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < NV; ++c) _mm512_storeu_ps(acc + r * dv + i0 + 16 * c, a[r][c]);
  }
  for (; i0 < dv; i0 += 16) {  // 16 or fewer elements (masked: lanes past dv are neither read nor written)
    const __mmask16 m = dv - i0 >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (dv - i0)) - 1);
    for (int r = 0; r < NR; ++r) {
      __m512 a0 = _mm512_maskz_loadu_ps(m, acc + r * dv + i0);
      for (int64_t j = 0; j < n; ++j)
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[r * n + j]), _mm512_maskz_loadu_ps(m, v + j * dv + i0), a0);
      _mm512_mask_storeu_ps(acc + r * dv + i0, m, a0);
    }
  }
}

void accumulate(const float* p, int64_t rows, const float* v, int64_t n, int64_t dv, float* acc) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) accumulate_rows<4, 4>(p + r * n, n, v, dv, acc + r * dv);
  for (; r + 2 <= rows; r += 2) accumulate_rows<2, 4>(p + r * n, n, v, dv, acc + r * dv);
  if (r < rows) accumulate_rows<1, 4>(p + r * n, n, v, dv, acc + r * dv);
}

void f16_to_f32_row(const uint16_t* src, int64_t n, float* dst) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

void scale(float* x, int64_t n, float c) {
  const __m512 vc = _mm512_set1_ps(c);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), vc));
  for (; i < n; ++i) x[i] *= c;
}

}  // namespace

const AttnTileOps& attn_tile_ops_avx512() {
  static const AttnTileOps ops{
      scores,         accumulate, attn_tile_ops_avx2().scores_f16, attn_tile_ops_avx2().accumulate_f16,
      f16_to_f32_row, scale,      attn_tile_ops_avx2().exp_sum,    kivi_dequant_avx512};
  return ops;
}

}  // namespace kvtier::cpu
