// AVX-512 tile kernels of the blocked attention, bit-identical to attention_avx2.cpp's:
//   - scores: a (row, key) score there is an 8-lane FMA chain over d, hsum_f32, plus a scalar tail.
//     Here each 512-bit register holds two such chains side by side (rows r and r + 1 in the low and
//     high 256 bits, against the same key broadcast to both halves), so every chain is the same
//     sequence of 8-lane FMAs, and its half is reduced by the same hsum_f32;
//   - accumulate, f16_to_f32, scale: element-wise operations (one FMA / conversion / product per
//     element), the same in any vector width;
//   - exp_sum: the AVX2 kernel itself (its lane sums depend on the width);
//   - scores_f16 (decode's in-place f16 keys): a (row, key) score there is the same 8-lane chain over
//     the converted key. Here two keys share a register (keys c and c + 1 in the low and high 256
//     bits, against the row broadcast to both halves), so each 16-element conversion and each FMA
//     serve two chains, and each half is reduced by the same hsum_f32;
//   - accumulate_f16: element-wise (one FMA per element), 16 lanes, f16 values converted in registers.
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

// 16 values of a V row as f32 (f16 converted in registers, exact); the masked forms read only the
// lanes of m and zero the others.
__m512 load16(const float* x) {
  return _mm512_loadu_ps(x);
}
__m512 load16(const uint16_t* x) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));
}
__m512 load16(const float* x, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, x);
}
__m512 load16(const uint16_t* x, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x));
}

// acc[r * dv + i] = fma(p[r * n + j], v[j * dv + i], acc[r * dv + i]) for j in order (per element
// the AVX2 kernel's chain); NR rows share each V load, NV registers of 16 elements per row. V rows
// are f32 or f16 (T).
template <int NR, int NV, typename T>
void accumulate_rows(const float* p, int64_t n, const T* v, int64_t dv, float* acc) {
  int64_t i0 = 0;
  for (; i0 + 16 * NV <= dv; i0 += 16 * NV) {
    __m512 a[NR][NV];
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < NV; ++c) a[r][c] = _mm512_loadu_ps(acc + r * dv + i0 + 16 * c);
    for (int64_t j = 0; j < n; ++j) {
      __m512 vv[NV];
      for (int c = 0; c < NV; ++c) vv[c] = load16(v + j * dv + i0 + 16 * c);
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
        a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[r * n + j]), load16(v + j * dv + i0, m), a0);
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

// f16 keys: NR rows x 2 CP keys per pass, two keys per register (low half key 2c, high half key
// 2c + 1); each (row, key) chain is attention_avx2.cpp's 8-lane chain over the first d8 elements,
// hsum_f32 of its half, plus the same scalar tail. The last odd key runs the 8-lane chain alone.
float dot_tail_f16(const float* a, const uint16_t* b, int64_t i0, int64_t d) {
  float s = 0.0f;
  for (int64_t i = i0; i < d; ++i) s += a[i] * f16_to_f32(b[i]);
  return s;
}

__m512 load_key_pair_f16(const uint16_t* lo, const uint16_t* hi) {
  const __m128i l = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lo));
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi));
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(l), h, 1));
}

template <int NR, int CP>
void scores_f16_rows(const float* q, int64_t q_stride, const uint16_t* k, int64_t n, int64_t d, float* s) {
  const int64_t d8 = d & ~int64_t{7};
  int64_t j = 0;
  for (; j + 2 * CP <= n; j += 2 * CP) {
    const uint16_t* k0 = k + j * d;
    __m512 a[NR][CP];  // [row][key pair]
    for (int r = 0; r < NR; ++r)
      for (int c = 0; c < CP; ++c) a[r][c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < d8; i += 8) {
      __m512 vk[CP];
      for (int c = 0; c < CP; ++c) vk[c] = load_key_pair_f16(k0 + 2 * c * d + i, k0 + (2 * c + 1) * d + i);
      for (int r = 0; r < NR; ++r) {
        const __m512 vq = broadcast8(q + r * q_stride + i);
        for (int c = 0; c < CP; ++c) a[r][c] = _mm512_fmadd_ps(vq, vk[c], a[r][c]);
      }
    }
    for (int r = 0; r < NR; ++r) {
      const float* qr = q + r * q_stride;
      for (int c = 0; c < CP; ++c) {
        const uint16_t* k_lo = k0 + 2 * c * d;
        s[r * n + j + 2 * c] = hsum_f32(_mm512_castps512_ps256(a[r][c])) + dot_tail_f16(qr, k_lo, d8, d);
        s[r * n + j + 2 * c + 1] = hsum_f32(high_half(a[r][c])) + dot_tail_f16(qr, k_lo + d, d8, d);
      }
    }
  }
  for (; j < n; ++j) {
    const uint16_t* kj = k + j * d;
    for (int r = 0; r < NR; ++r) {
      const float* qr = q + r * q_stride;
      __m256 a0 = _mm256_setzero_ps();
      for (int64_t i = 0; i < d8; i += 8) {
        const __m256 vk = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(kj + i)));
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qr + i), vk, a0);
      }
      s[r * n + j] = hsum_f32(a0) + dot_tail_f16(qr, kj, d8, d);
    }
  }
}

// The rows of a GQA group take one pass over the keys (each conversion shared by the group's rows).
void scores_f16(const float* q, int64_t q_stride, int64_t rows, const uint16_t* k, int64_t n, int64_t d,
                float* s) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) scores_f16_rows<4, 2>(q + r * q_stride, q_stride, k, n, d, s + r * n);
  switch (rows - r) {
    case 3:
      scores_f16_rows<3, 3>(q + r * q_stride, q_stride, k, n, d, s + r * n);
      break;
    case 2:
      scores_f16_rows<2, 4>(q + r * q_stride, q_stride, k, n, d, s + r * n);
      break;
    case 1:
      scores_f16_rows<1, 4>(q + r * q_stride, q_stride, k, n, d, s + r * n);
      break;
    default:
      break;
  }
}

void accumulate_f16(const float* p, int64_t rows, const uint16_t* v, int64_t n, int64_t dv, float* acc) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) accumulate_rows<4, 4>(p + r * n, n, v, dv, acc + r * dv);
  if (rows - r == 3) {
    accumulate_rows<3, 4>(p + r * n, n, v, dv, acc + r * dv);
    return;
  }
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
  static const AttnTileOps ops{scores,
                               accumulate,
                               scores_f16,
                               accumulate_f16,
                               f16_to_f32_row,
                               scale,
                               attn_tile_ops_avx2().exp_sum,
                               kivi_dequant_avx512};
  return ops;
}

}  // namespace kvtier::cpu
