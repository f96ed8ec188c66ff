// AVX2 dot products for the float types and the K-quants (q4_0, q4_1, q5_0, q5_1 and q8_0 are in
// matmul_avx2_panel.cpp, one float chain per output over exact block integers). K-quants reduce each
// super-block to the same integers as the reference and combine them with the reference's float expression,
// so they equal the scalar result exactly.
#include "backend/cpu/block_unpack.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_avx2.h"

namespace kvtier::cpu {
namespace {

using namespace avx2;

template <typename T>
const T* as(const uint8_t* p) {
  return reinterpret_cast<const T*>(p);
}

float dot_f32(const uint8_t* w8, const uint8_t* a8, int64_t k) {
  const float* w = as<float>(w8);
  const float* a = as<float>(a8);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
         acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(a + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(a + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(a + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(a + i + 24), acc3);
  }
  for (; i + 8 <= k; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(a + i), acc0);
  float s = hsum_f32(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < k; ++i) s += w[i] * a[i];
  return s;
}

template <bool kBf16>
__m256 load_half8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if constexpr (kBf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}

template <bool kBf16>
float dot_half(const uint8_t* w8, const uint8_t* a8, int64_t k) {
  const uint16_t* w = as<uint16_t>(w8);
  const float* a = as<float>(a8);
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
         acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    acc0 = _mm256_fmadd_ps(load_half8<kBf16>(w + i), _mm256_loadu_ps(a + i), acc0);
    acc1 = _mm256_fmadd_ps(load_half8<kBf16>(w + i + 8), _mm256_loadu_ps(a + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(load_half8<kBf16>(w + i + 16), _mm256_loadu_ps(a + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(load_half8<kBf16>(w + i + 24), _mm256_loadu_ps(a + i + 24), acc3);
  }
  for (; i + 8 <= k; i += 8) acc0 = _mm256_fmadd_ps(load_half8<kBf16>(w + i), _mm256_loadu_ps(a + i), acc0);
  float s = hsum_f32(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < k; ++i) s += (kBf16 ? unpack_bf16(w[i]) : unpack_f16(w[i])) * a[i];
  return s;
}

// Multiplies int16 pair sums by per-half scales: lanes 0..7 (elements 0..15) by s0, 8..15 by s1.
__m256i scale_halves(__m256i p16, int s0, int s1) {
  const __m256i sc = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<int16_t>(s0))),
                                             _mm_set1_epi16(static_cast<int16_t>(s1)), 1);
  return _mm256_madd_epi16(p16, sc);
}

float dot_q2_k(const uint8_t* w8, const uint8_t* a8, int64_t k) {
  const BlockQ2_K* x = as<BlockQ2_K>(w8);
  const ActQ8_K* a = as<ActQ8_K>(a8);
  float s = 0.0f;
  for (int64_t b = 0; b < k / kQKK; ++b) {
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i q = load256(x[b].qs + 32 * h);
      for (int f = 0; f < 4; ++f) {
        const __m256i qf = _mm256_and_si256(_mm256_srli_epi16(q, 2 * f), _mm256_set1_epi8(3));
        const int j = 8 * h + 2 * f;  // first of the two 16-element sub-blocks
        const __m256i p = _mm256_maddubs_epi16(qf, load256(a[b].qs + 16 * j));
        acc = _mm256_add_epi32(acc, scale_halves(p, x[b].scales[j] & 0xF, x[b].scales[j + 1] & 0xF));
      }
    }
    int msum = 0;
    for (int j = 0; j < 16; ++j) msum += (x[b].scales[j] >> 4) * a[b].bsums[j];
    s += (f16(x[b].d) * a[b].d) * static_cast<float>(hsum_i32(acc)) -
         (f16(x[b].dmin) * a[b].d) * static_cast<float>(msum);
  }
  return s;
}

float dot_q3_k(const uint8_t* w8, const uint8_t* a8, int64_t k) {
  const BlockQ3_K* x = as<BlockQ3_K>(w8);
  const ActQ8_K* a = as<ActQ8_K>(a8);
  float s = 0.0f;
  for (int64_t b = 0; b < k / kQKK; ++b) {
    int8_t sc[16];
    unpack_scales_q3_k(x[b].scales, sc);
    const __m256i hm = load256(x[b].hmask);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i q = load256(x[b].qs + 32 * h);
      for (int f = 0; f < 4; ++f) {
        const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(q, 2 * f), _mm256_set1_epi8(3));
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(hm, 4 * h + f), _mm256_set1_epi8(1));
        const __m256i qu = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 2));  // q + 4, in [0, 7]
        const int j = 8 * h + 2 * f;
        const __m256i p = _mm256_maddubs_epi16(qu, load256(a[b].qs + 16 * j));
        acc = _mm256_add_epi32(acc, scale_halves(p, sc[j], sc[j + 1]));
      }
    }
    int corr = 0;  // the +4 offset: sum_j sc_j * 4 * bsum_j
    for (int j = 0; j < 16; ++j) corr += sc[j] * a[b].bsums[j];
    s += (f16(x[b].d) * a[b].d) * static_cast<float>(hsum_i32(acc) - 4 * corr);
  }
  return s;
}

template <bool kFifthBit, typename Block>
float dot_q45_k(const uint8_t* w8, const uint8_t* a8, int64_t k) {
  const Block* x = as<Block>(w8);
  const ActQ8_K* a = as<ActQ8_K>(a8);
  float s = 0.0f;
  for (int64_t b = 0; b < k / kQKK; ++b) {
    uint8_t sc[8], mn[8];
    unpack_scales_mins_k4(x[b].scales, sc, mn);
    __m256i acc = _mm256_setzero_si256();
    __m256i qh = _mm256_setzero_si256();
    if constexpr (kFifthBit) qh = load256(x[b].qh);
    for (int c = 0; c < 4; ++c) {
      const __m256i q = load256(x[b].qs + 32 * c);
      __m256i lo = _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), _mm256_set1_epi8(0x0F));
      if constexpr (kFifthBit) {
        const __m256i one = _mm256_set1_epi8(1);
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
        hi = _mm256_or_si256(hi,
                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
      }
      const __m256i plo = _mm256_maddubs_epi16(lo, load256(a[b].qs + 64 * c));
      const __m256i phi = _mm256_maddubs_epi16(hi, load256(a[b].qs + 64 * c + 32));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(plo, _mm256_set1_epi16(sc[2 * c])));
      acc = _mm256_add_epi32(acc, _mm256_madd_epi16(phi, _mm256_set1_epi16(sc[2 * c + 1])));
    }
    const int msum = min_sum_k4(mn, a[b].bsums);
    s += (f16(x[b].d) * a[b].d) * static_cast<float>(hsum_i32(acc)) -
         (f16(x[b].dmin) * a[b].d) * static_cast<float>(msum);
  }
  return s;
}

float dot_q6_k(const uint8_t* w8, const uint8_t* a8, int64_t k) {
  const BlockQ6_K* x = as<BlockQ6_K>(w8);
  const ActQ8_K* a = as<ActQ8_K>(a8);
  float s = 0.0f;
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
  for (int64_t b = 0; b < k / kQKK; ++b) {
    const int8_t* sc = x[b].scales;
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i l0 = load256(x[b].ql + 64 * h);
      const __m256i l1 = load256(x[b].ql + 64 * h + 32);
      const __m256i qh = load256(x[b].qh + 32 * h);
      const __m256i lows[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                               _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
      for (int f = 0; f < 4; ++f) {
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * f), m2);
        const __m256i qu = _mm256_or_si256(lows[f], _mm256_slli_epi16(hi, 4));  // q + 32, in [0, 63]
        const int j = 8 * h + 2 * f;
        const __m256i p = _mm256_maddubs_epi16(qu, load256(a[b].qs + 16 * j));
        acc = _mm256_add_epi32(acc, scale_halves(p, sc[j], sc[j + 1]));
      }
    }
    const __m256i total = q6k_offset_out(acc, q6k_scales16(sc), a[b].bsums);  // the +32 offset out
    s += (f16(x[b].d) * a[b].d) * static_cast<float>(hsum_i32(total));
  }
  return s;
}

}  // namespace

void fill_avx2_kernels(KernelTable& t) {
  auto set = [&t](GgmlType type, VecDotFn fn) { t.vec_dot[static_cast<size_t>(type)] = fn; };
  set(GgmlType::kF32, dot_f32);
  set(GgmlType::kF16, dot_half<false>);
  set(GgmlType::kBF16, dot_half<true>);
  // q4_0, q4_1, q5_0, q5_1, q8_0: matmul_avx2_panel.cpp (one float chain per output, for its panel tiles).
  set(GgmlType::kQ2_K, dot_q2_k);
  set(GgmlType::kQ3_K, dot_q3_k);
  set(GgmlType::kQ4_K, dot_q45_k<false, BlockQ4_K>);
  set(GgmlType::kQ5_K, dot_q45_k<true, BlockQ5_K>);
  set(GgmlType::kQ6_K, dot_q6_k);
  fill_avx2_float_kernels(t.fops);
}

}  // namespace kvtier::cpu
