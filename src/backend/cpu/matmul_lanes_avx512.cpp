// AVX-512 kernels over the rows-in-lanes layout (weight_lanes.h): a 512-bit register holds one
// 4-element group of 16 rows, so VPDPBUSD advances all 16 rows' dots and each row's float chain
// lives in one lane, with no horizontal reduction per block.
//
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/blocks.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/lanes_prefetch.h"
#include "backend/cpu/lanes_simd_avx512.h"
#include "backend/cpu/lanes_tokens_avx512.h"
#include "backend/cpu/simd_avx512.h"
#include "backend/cpu/weight_lanes.h"

namespace kvtier::cpu {
namespace {

using lanes::group_of;
using lanes::prefetch_span;
using lanes::rows_mask;
using lanes::widen16;

// q8_0: legacy_chain.h's chain per row, as the q8_0 vec_dot and tiles of this table (the AVX2
// table's): per block the exact integer isum = dot(q + 128, a) - 128 * sum(a) (the layout keeps
// q + 128 as unsigned bytes; VPDPBUSD does not saturate), then s = fma(f32(isum), d * da, s).
void lanes_q8_0(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                float* y, int64_t ldy, int rows) {
  const int64_t nb = k / kQK;
  const __mmask16 keep = rows_mask(rows);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const auto* a = reinterpret_cast<const ActQ8_32*>(act + t * act_bytes);
    __m512 s = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      if (b % 2 == 0) prefetch_span(w + b / 2 * kLanesPairBytes, 0, kLanesPairBytes);  // lanes_prefetch.h
      const uint8_t* q = w + q8_0_quants_at(b);                                        // [8][16][4] u8
      __m512i c0 = _mm512_set1_epi32(-(a[b].sum << 7)), c1 = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
        c0 = _mm512_dpbusd_epi32(c0, _mm512_load_si512(q + 64 * g), group_of(a[b].qs, g));
        c1 = _mm512_dpbusd_epi32(c1, _mm512_load_si512(q + 64 * (g + 4)), group_of(a[b].qs, g + 4));
      }
      const __m512 sc =
          _mm512_mul_ps(_mm512_cvtph_ps(avx2::load256(w + q8_0_scales_at(b, nb))), _mm512_set1_ps(a[b].d));
      s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(c0, c1)), sc, s);
    }
    _mm512_mask_storeu_ps(y + t * ldy, keep, s);
  }
}

// q4_0, q4_1, q5_0, q5_1: legacy_chain.h's chain per row, one lane each. Per block the exact integer
// isum = dot(u, a) - (offset << sum(a)) (VPDPBUSD of the unsigned quants from nibbles, the fifth bits
// added by a masked byte add), then s = fma(f32(isum), d * da, s), and q4_1 / q5_1's second chain
// m = fma(m_w, dsum(a), m) (blocks.h); the result s (+ m).
template <bool kHighBits, bool kMins, int kOffsetShift>
void lanes_legacy(GgmlType type, const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens,
                  int64_t k, float* y, int64_t ldy, int rows) {
  const int64_t nb = k / kQK;
  const LegacyRegions at = legacy_regions(type, nb);
  const int64_t group_bytes = lanes_group_bytes(type, k);
  const __mmask16 keep = rows_mask(rows);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const auto* a = reinterpret_cast<const ActQ8_32*>(act + t * act_bytes);
    __m512 s = _mm512_setzero_ps(), m = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      // the group's bytes in order (the regions are read at their own pace; this keeps the whole
      // stream in flight)
      prefetch_span(w, b * group_bytes / nb, (b + 1) * group_bytes / nb);
      __m512i c0 =
          kOffsetShift != 0 ? _mm512_set1_epi32(-(a[b].sum << kOffsetShift)) : _mm512_setzero_si512();
      __m512i c1 = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        __m512i lo, hi;
        lanes::legacy_unpack_vector<kHighBits>(w, at, b, j, lo, hi);
        c0 = _mm512_dpbusd_epi32(c0, lo, group_of(a[b].qs, j));
        c1 = _mm512_dpbusd_epi32(c1, hi, group_of(a[b].qs, j + 4));
      }
      const __m512i isum = _mm512_add_epi32(c0, c1);
      const __m512 da = _mm512_set1_ps(a[b].d);
      const __m512 sc = _mm512_mul_ps(_mm512_cvtph_ps(avx2::load256(w + at.scales + b * 32)), da);
      s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), sc, s);
      if constexpr (kMins)
        m = _mm512_fmadd_ps(_mm512_cvtph_ps(avx2::load256(w + at.mins + b * 32)), _mm512_set1_ps(a[b].dsum),
                            m);
    }
    if constexpr (kMins) s = _mm512_add_ps(s, m);
    _mm512_mask_storeu_ps(y + t * ldy, keep, s);
  }
}

template <GgmlType kType, bool kHighBits, bool kMins, int kOffsetShift>
void lanes_legacy_of(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                     float* y, int64_t ldy, int rows) {
  lanes_legacy<kHighBits, kMins, kOffsetShift>(kType, w, act, act_bytes, n_tokens, k, y, ldy, rows);
}

// A LanesFn: products of at least kLanesPassTokens tokens in whole passes of several tokens by
// kTokens (lanes_tokens_avx512.h), the remaining tokens (decode's one) by the one-token kernel kOne.
using TokensFn = int64_t (*)(const uint8_t*, const uint8_t*, int64_t, int64_t, int64_t, float*, int64_t, int);
template <TokensFn kTokens, LanesFn kOne>
void lanes_tokens(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                  float* y, int64_t ldy, int rows) {
  const int64_t done =
      n_tokens >= lanes_avx512::kLanesPassTokens ? kTokens(w, act, act_bytes, n_tokens, k, y, ldy, rows) : 0;
  if (done < n_tokens)
    kOne(w, act + done * act_bytes, act_bytes, n_tokens - done, k, y + done * ldy, ldy, rows);
}

// q4_K: vec_dot_avx512.cpp's dot_q4_k per row. Per super-block the exact integers
// isum = sum_j sc_j * dot(q_j, a_j) and msum = sum_j mn_j * (32-element sum of a_j), then
// s += (d * da) * f32(isum) - (dmin * da) * f32(msum).
void lanes_q4_k(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                float* y, int64_t ldy, int rows) {
  const int64_t nb = k / kQKK;
  const __mmask16 keep = rows_mask(rows);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const auto* a = reinterpret_cast<const ActQ8_K*>(act + t * act_bytes);
    __m512 s = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* sb = w + b * kQ4KLanesBytes;
      prefetch_span(sb, 0, kQ4KLanesBytes);
      __m512i isum = _mm512_setzero_si512(), msum = _mm512_setzero_si512();
      for (int c = 0; c < 4; ++c) {
        __m512i lo_dot = _mm512_setzero_si512(), hi_dot = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) {
          const __m512i v = _mm512_load_si512(sb + (8 * c + g) * 64);
          lo_dot = _mm512_dpbusd_epi32(lo_dot, _mm512_and_si512(v, low4), group_of(a[b].qs + 64 * c, g));
          hi_dot = _mm512_dpbusd_epi32(hi_dot, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4),
                                       group_of(a[b].qs + 64 * c + 32, g));
        }
        isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(lo_dot, widen16(sb + 2048 + 16 * (2 * c))));
        isum = _mm512_add_epi32(isum, _mm512_mullo_epi32(hi_dot, widen16(sb + 2048 + 16 * (2 * c + 1))));
      }
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) {
        const int bsum = a[b].bsums[2 * j] + a[b].bsums[2 * j + 1];
        msum =
            _mm512_add_epi32(msum, _mm512_mullo_epi32(widen16(sb + 2176 + 16 * j), _mm512_set1_epi32(bsum)));
      }
      const __m512 da = _mm512_set1_ps(a[b].d);
      const __m512 dd = _mm512_mul_ps(_mm512_cvtph_ps(avx2::load256(sb + 2304)), da);
      const __m512 dm = _mm512_mul_ps(_mm512_cvtph_ps(avx2::load256(sb + 2336)), da);
      s = _mm512_add_ps(s, _mm512_sub_ps(_mm512_mul_ps(dd, _mm512_cvtepi32_ps(isum)),
                                         _mm512_mul_ps(dm, _mm512_cvtepi32_ps(msum))));
    }
    _mm512_mask_storeu_ps(y + t * ldy, keep, s);
  }
}

// q6_K: dot_q6_k per row. Per super-block the exact integer
// total = sum_j sc_j * (dot(q_j + 32, a_j) - 32 * (16-element sum of a_j)), each sub-block's dot
// started at -32 * its sum, then s += (d * da) * f32(total).
void lanes_q6_k(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                float* y, int64_t ldy, int rows) {
  const int64_t nb = k / kQKK;
  const __mmask16 keep = rows_mask(rows);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const auto* a = reinterpret_cast<const ActQ8_K*>(act + t * act_bytes);
    __m512 s = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* sb = w + b * kQ6KLanesBytes;
      prefetch_span(sb, 0, kQ6KLanesBytes);
      __m512i total = _mm512_setzero_si512();
#pragma GCC unroll 2
      for (int j = 0; j < 16; ++j) {  // sub-block j (lanes_simd_avx512.h, q6k_lanes_vector)
        __m512i dot = _mm512_set1_epi32(-32 * a[b].bsums[j]);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i)
          dot = _mm512_dpbusd_epi32(dot, lanes::q6k_lanes_vector(sb, j, i), group_of(a[b].qs + 16 * j, i));
        total = _mm512_add_epi32(total, _mm512_mullo_epi32(dot, widen16<true>(sb + 3072 + 16 * j)));
      }
      const __m512 dd = _mm512_mul_ps(_mm512_cvtph_ps(avx2::load256(sb + 3328)), _mm512_set1_ps(a[b].d));
      s = _mm512_add_ps(s, _mm512_mul_ps(dd, _mm512_cvtepi32_ps(total)));
    }
    _mm512_mask_storeu_ps(y + t * ldy, keep, s);
  }
}

}  // namespace

void fill_avx512_lanes(KernelTable& t) {
  namespace tok = lanes_avx512;
  t.lanes[static_cast<size_t>(GgmlType::kQ4_K)] = lanes_tokens<tok::q4_k_tokens, lanes_q4_k>;
  t.lanes[static_cast<size_t>(GgmlType::kQ6_K)] = lanes_tokens<tok::q6_k_tokens, lanes_q6_k>;
  t.lanes[static_cast<size_t>(GgmlType::kQ8_0)] = lanes_tokens<tok::q8_0_tokens, lanes_q8_0>;
  t.lanes[static_cast<size_t>(GgmlType::kQ4_0)] =
      lanes_tokens<tok::q4_0_tokens, lanes_legacy_of<GgmlType::kQ4_0, false, false, 3>>;
  t.lanes[static_cast<size_t>(GgmlType::kQ4_1)] =
      lanes_tokens<tok::q4_1_tokens, lanes_legacy_of<GgmlType::kQ4_1, false, true, 0>>;
  t.lanes[static_cast<size_t>(GgmlType::kQ5_0)] =
      lanes_tokens<tok::q5_0_tokens, lanes_legacy_of<GgmlType::kQ5_0, true, false, 4>>;
  t.lanes[static_cast<size_t>(GgmlType::kQ5_1)] =
      lanes_tokens<tok::q5_1_tokens, lanes_legacy_of<GgmlType::kQ5_1, true, true, 0>>;
  // Every lanes kernel serves prefill too, several tokens per pass over the group's weights (where
  // AMX tiles exist, make_table hands prefill of the types they cover back to them; q8_0 has none).
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                        GgmlType::kQ4_K, GgmlType::kQ6_K})
    t.lanes_any_tokens[static_cast<size_t>(type)] = true;
}

}  // namespace kvtier::cpu
