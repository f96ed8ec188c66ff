// AVX2 kernels over the rows-in-lanes layout (weight_lanes.h). The layout's 64-byte vectors hold one
// 4-element group of 16 rows; a 256-bit register takes half of one (rows 0-7 or rows 8-15), so each
// kernel runs the group's two halves over the same activation groups, and each row's float chain
// lives in one lane, with no horizontal reduction per block. The integer dots use VPMADDUBSW (u8 x
// i8 pairs to i16) and VPMADDWD, so the same code runs on every AVX2 CPU (no VNNI).
//
// Every output keeps the bits of the AVX2 table's vec_dot (vec_dot_avx2.cpp, legacy_chain.h): the
// per-block (q8_0, q4_0-q5_1) or per-super-block (q4_K, q6_K) integer is exact whichever lanes sum it,
// and the float steps that follow are the vec_dot's own, lane-wise. Where pair sums of VPMADDUBSW are
// added as i16 before widening, the comment gives the bound that keeps them exact.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/blocks.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/lanes_prefetch.h"
#include "backend/cpu/simd_avx2.h"
#include "backend/cpu/weight_lanes.h"

namespace kvtier::cpu {
namespace {

using namespace avx2;

using lanes::prefetch_span;

// The 4 activation bytes of group g as one i32, broadcast.
inline __m256i group_of(const int8_t* qs, int g) {
  return _mm256_set1_epi32(static_cast<int>(load_u32(qs + 4 * g)));
}

// Half h (rows 8h .. 8h + 7) of a 64-byte lanes vector at p (q6_K's super-blocks of 3360 bytes
// leave every other one off 64-byte alignment).
inline __m256i half_of(const uint8_t* p, int h) {
  return load256(p + 32 * h);
}

// 8 rows' f16 values at p (16 bytes) as floats.
inline __m256 f16x8(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// 8 rows' u8 (or, kSigned, i8) values at p (8 bytes) as 8 x i32.
template <bool kSigned = false>
inline __m256i widen8(const uint8_t* p) {
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return kSigned ? _mm256_cvtepi8_epi32(v) : _mm256_cvtepu8_epi32(v);
}

// The same values in both i16 halves of each i32 lane, for VPMADDWD (|value| < 2^15).
inline __m256i pairs_of(__m256i v32) {
  return _mm256_or_si256(_mm256_and_si256(v32, _mm256_set1_epi32(0xFFFF)), _mm256_slli_epi32(v32, 16));
}

// The group's outputs of one token: halves lo (rows 0-7) and hi (rows 8-15), the first `rows` kept.
inline void store_rows(__m256 lo, __m256 hi, float* y, int rows) {
  if (rows == kLaneRows) {
    _mm256_storeu_ps(y, lo);
    _mm256_storeu_ps(y + 8, hi);
    return;
  }
  alignas(32) float out[kLaneRows];
  _mm256_store_ps(out, lo);
  _mm256_store_ps(out + 8, hi);
  std::memcpy(y, out, sizeof(float) * static_cast<size_t>(rows));
}

// q8_0: legacy_chain.h's chain per row, s = fma(f32(isum_b), d_b * da_b, s). The layout keeps
// u = q + 128, whose pair sums would overflow VPMADDUBSW's i16; the kernel takes q = u ^ 0x80 back
// and multiplies |q| by the activations carrying q's sign (VPSIGNB), as dot_s8s8 does. NT tokens
// share each weight vector's unpacking (prefill of the output matrix reads this layout too).
template <int NT>
void q8_0_tokens(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t nb, float* y, int64_t ldy,
                 int rows) {
  const ActQ8_32* a[NT];
  for (int t = 0; t < NT; ++t) a[t] = reinterpret_cast<const ActQ8_32*>(act + t * act_bytes);
  const __m256i x80 = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi16(1);
  __m256 s[NT][2];
  for (auto& st : s) st[0] = st[1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    // block b: half b % 2 of pair b / 2 (quants [2][8][16][4], scales [2][16] f16 at 1024), or an odd
    // last block (quants [8][16][4], scales at 512)
    if (b % 2 == 0) prefetch_span(w + b / 2 * kLanesPairBytes, 0, kLanesPairBytes);
    const uint8_t* q = w + q8_0_quants_at(b);
    const uint8_t* d = w + q8_0_scales_at(b, nb);
    for (int h = 0; h < 2; ++h) {
      // Without this barrier GCC hoists the 8 x NT activation broadcasts out of the halves' loop (they
      // serve both halves), keeps them and most of the products on the stack, and 4-token passes ran
      // at 0.8x (bench/ab_kernels.sh, matmul_lanes/q8_0/512x640->2048/avx2, AMD EPYC family 25).
      asm volatile("" ::: "memory");
      __m256i isum[NT];
      for (auto& v : isum) v = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) {
        const __m256i wq = _mm256_xor_si256(half_of(q + 64 * g, h), x80);
        const __m256i wabs = _mm256_sign_epi8(wq, wq);
        for (int t = 0; t < NT; ++t) {
          const __m256i p = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(group_of(a[t][b].qs, g), wq));
          isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(p, ones));
        }
      }
      const __m256 dw = f16x8(d + 16 * h);
      for (int t = 0; t < NT; ++t)
        s[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_mul_ps(dw, _mm256_set1_ps(a[t][b].d)),
                                  s[t][h]);
    }
  }
  for (int t = 0; t < NT; ++t) store_rows(s[t][0], s[t][1], y + t * ldy, rows);
}

void lanes_q8_0(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                float* y, int64_t ldy, int rows) {
  const int64_t nb = k / kQK;
  int64_t t = 0;
  for (; t + 4 <= n_tokens; t += 4)
    q8_0_tokens<4>(w, act + t * act_bytes, act_bytes, nb, y + t * ldy, ldy, rows);
  for (; t + 2 <= n_tokens; t += 2)
    q8_0_tokens<2>(w, act + t * act_bytes, act_bytes, nb, y + t * ldy, ldy, rows);
  if (t < n_tokens) q8_0_tokens<1>(w, act + t * act_bytes, act_bytes, nb, y + t * ldy, ldy, rows);
}

// q4_0, q4_1, q5_0, q5_1: legacy_chain.h's chain per row. Per block the exact integer
// isum = dot(u, a) - (offset << sum(a)), then s = fma(f32(isum), d * da, s), and q4_1 / q5_1's second
// chain m = fma(m_w, dsum(a), m) (blocks.h); the result s (+ m). VPMADDUBSW's pair sums are at most
// 2 * 15 * 128 (q4) or 2 * 31 * 128 (q5) in magnitude, so 8 of q4's (30720) or 4 of q5's (31744)
// add up in i16 exactly.
template <bool kHighBits, bool kMins, int kOffsetShift>
void lanes_legacy(GgmlType type, const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens,
                  int64_t k, float* y, int64_t ldy, int rows) {
  const int64_t nb = k / kQK;
  const LegacyRegions at = legacy_regions(type, nb);
  const int64_t group_bytes = lanes_group_bytes(type, k);
  const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const auto* a = reinterpret_cast<const ActQ8_32*>(act + t * act_bytes);
    __m256 s[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()},
           m[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < nb; ++b) {
      prefetch_span(w, b * group_bytes / nb, (b + 1) * group_bytes / nb);
      const uint8_t* nib = w + at.nibbles + b * 256;
      const __m256 da = _mm256_set1_ps(a[b].d);
      for (int h = 0; h < 2; ++h) {
        __m256i lo16 = _mm256_setzero_si256(), hi16 = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          const __m256i v = half_of(nib + 64 * j, h);
          __m256i lo = _mm256_and_si256(v, low4);
          __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
          if constexpr (kHighBits) {
            lo = _mm256_or_si256(lo, bits_to_0x10(w + at.high_bits + b * 64 + 8 * j + 4 * h));
            hi = _mm256_or_si256(hi, bits_to_0x10(w + at.high_bits + b * 64 + 8 * (j + 4) + 4 * h));
          }
          lo16 = _mm256_add_epi16(lo16, _mm256_maddubs_epi16(lo, group_of(a[b].qs, j)));
          hi16 = _mm256_add_epi16(hi16, _mm256_maddubs_epi16(hi, group_of(a[b].qs, j + 4)));
        }
        __m256i isum;
        if constexpr (kHighBits) {
          isum = _mm256_add_epi32(_mm256_madd_epi16(lo16, ones), _mm256_madd_epi16(hi16, ones));
        } else {
          isum = _mm256_madd_epi16(_mm256_add_epi16(lo16, hi16), ones);
        }
        if constexpr (kOffsetShift != 0)
          isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(a[b].sum << kOffsetShift));
        const __m256 sc = _mm256_mul_ps(f16x8(w + at.scales + b * 32 + 16 * h), da);
        s[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), sc, s[h]);
        if constexpr (kMins)
          m[h] = _mm256_fmadd_ps(f16x8(w + at.mins + b * 32 + 16 * h), _mm256_set1_ps(a[b].dsum), m[h]);
      }
    }
    if constexpr (kMins) {
      s[0] = _mm256_add_ps(s[0], m[0]);
      s[1] = _mm256_add_ps(s[1], m[1]);
    }
    store_rows(s[0], s[1], y + t * ldy, rows);
  }
}

template <GgmlType kType, bool kHighBits, bool kMins, int kOffsetShift>
void lanes_legacy_of(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                     float* y, int64_t ldy, int rows) {
  lanes_legacy<kHighBits, kMins, kOffsetShift>(kType, w, act, act_bytes, n_tokens, k, y, ldy, rows);
}

// q4_K: dot_q45_k per row. Per super-block the exact integers isum = sum_j sc_j * dot(q_j, a_j) and
// msum = sum_j mn_j * (32-element sum of a_j), then s += (d * da) * f32(isum) - (dmin * da) * f32(msum).
// A sub-block's 8 VPMADDUBSW pair sums (each at most 2 * 15 * 128) add up in i16 exactly (30720).
void lanes_q4_k(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                float* y, int64_t ldy, int rows) {
  const int64_t nb = k / kQKK;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const auto* a = reinterpret_cast<const ActQ8_K*>(act + t * act_bytes);
    __m256 s[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* sb = w + b * kQ4KLanesBytes;
      prefetch_span(sb, 0, kQ4KLanesBytes);
      const __m256 da = _mm256_set1_ps(a[b].d);
      for (int h = 0; h < 2; ++h) {
        __m256i isum = _mm256_setzero_si256(), msum = _mm256_setzero_si256();
        for (int c = 0; c < 4; ++c) {
          __m256i lo16 = _mm256_setzero_si256(), hi16 = _mm256_setzero_si256();
#pragma GCC unroll 8
          for (int g = 0; g < 8; ++g) {
            const __m256i v = half_of(sb + (8 * c + g) * 64, h);
            lo16 = _mm256_add_epi16(
                lo16, _mm256_maddubs_epi16(_mm256_and_si256(v, low4), group_of(a[b].qs + 64 * c, g)));
            hi16 =
                _mm256_add_epi16(hi16, _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4),
                                                            group_of(a[b].qs + 64 * c + 32, g)));
          }
          isum = _mm256_add_epi32(
              isum, _mm256_madd_epi16(lo16, pairs_of(widen8(sb + 2048 + 16 * (2 * c) + 8 * h))));
          isum = _mm256_add_epi32(
              isum, _mm256_madd_epi16(hi16, pairs_of(widen8(sb + 2048 + 16 * (2 * c + 1) + 8 * h))));
        }
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
          const int bsum = a[b].bsums[2 * j] + a[b].bsums[2 * j + 1];
          msum = _mm256_add_epi32(
              msum, _mm256_mullo_epi32(widen8(sb + 2176 + 16 * j + 8 * h), _mm256_set1_epi32(bsum)));
        }
        const __m256 dd = _mm256_mul_ps(f16x8(sb + 2304 + 16 * h), da);
        const __m256 dm = _mm256_mul_ps(f16x8(sb + 2336 + 16 * h), da);
        s[h] = _mm256_add_ps(s[h], _mm256_sub_ps(_mm256_mul_ps(dd, _mm256_cvtepi32_ps(isum)),
                                                 _mm256_mul_ps(dm, _mm256_cvtepi32_ps(msum))));
      }
    }
    store_rows(s[0], s[1], y + t * ldy, rows);
  }
}

// q6_K: dot_q6_k per row. Per super-block the exact integer
// total = sum_j sc_j * dot(q_j + 32, a_j) - 32 * sum_j sc_j * (16-element sum of a_j), then
// s += (d * da) * f32(total). Pair sums of q + 32 (0..63) are at most 2 * 63 * 128 = 16128: two of
// them add up in i16 exactly.
void lanes_q6_k(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                float* y, int64_t ldy, int rows) {
  const int64_t nb = k / kQKK;
  const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
  for (int64_t t = 0; t < n_tokens; ++t) {
    const auto* a = reinterpret_cast<const ActQ8_K*>(act + t * act_bytes);
    __m256 s[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* sb = w + b * kQ6KLanesBytes;
      prefetch_span(sb, 0, kQ6KLanesBytes);
      const __m256 da = _mm256_set1_ps(a[b].d);
      for (int h = 0; h < 2; ++h) {
        __m256i acc = _mm256_setzero_si256(), offset = _mm256_setzero_si256();
        // sub-block j: elements 16j .. 16j + 15, half hh = j / 8, bit pair p = (j % 8) / 2, its 4
        // groups the qh vectors gh = 4 (j % 2) .. + 3 and the ql vectors gh (+ 8 for odd p)
#pragma GCC unroll 16
        for (int j = 0; j < 16; ++j) {
          const int hh = j / 8, p = (j % 8) / 2;
          __m256i d16[2];
#pragma GCC unroll 4
          for (int i = 0; i < 4; ++i) {
            const int gh = 4 * (j % 2) + i;
            const __m256i ql = half_of(sb + (16 * hh + gh + 8 * (p % 2)) * 64, h);
            const __m256i qh = half_of(sb + 2048 + (8 * hh + gh) * 64, h);
            const __m256i lo =
                p < 2 ? _mm256_and_si256(ql, low4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), low4);
            // bits 2p, 2p + 1 of qh to bits 4, 5
            const __m256i hb = p == 0   ? _mm256_slli_epi16(qh, 4)
                               : p == 1 ? _mm256_slli_epi16(qh, 2)
                               : p == 2 ? qh
                                        : _mm256_srli_epi16(qh, 2);
            const __m256i q = _mm256_or_si256(lo, _mm256_and_si256(hb, bits45));
            const __m256i prod = _mm256_maddubs_epi16(q, group_of(a[b].qs + 16 * j, i));
            d16[i / 2] = i % 2 == 0 ? prod : _mm256_add_epi16(d16[i / 2], prod);
          }
          const __m256i sc = widen8<true>(sb + 3072 + 16 * j + 8 * h);
          const __m256i scp = pairs_of(sc);
          acc = _mm256_add_epi32(
              acc, _mm256_add_epi32(_mm256_madd_epi16(d16[0], scp), _mm256_madd_epi16(d16[1], scp)));
          offset = _mm256_add_epi32(offset, _mm256_mullo_epi32(sc, _mm256_set1_epi32(a[b].bsums[j])));
        }
        const __m256i total = _mm256_sub_epi32(acc, _mm256_slli_epi32(offset, 5));
        const __m256 dd = _mm256_mul_ps(f16x8(sb + 3328 + 16 * h), da);
        s[h] = _mm256_add_ps(s[h], _mm256_mul_ps(dd, _mm256_cvtepi32_ps(total)));
      }
    }
    store_rows(s[0], s[1], y + t * ldy, rows);
  }
}

}  // namespace

void fill_avx2_lanes(KernelTable& t) {
  t.lanes[static_cast<size_t>(GgmlType::kQ4_K)] = lanes_q4_k;
  t.lanes[static_cast<size_t>(GgmlType::kQ6_K)] = lanes_q6_k;
  t.lanes[static_cast<size_t>(GgmlType::kQ8_0)] = lanes_q8_0;
  t.lanes[static_cast<size_t>(GgmlType::kQ4_0)] = lanes_legacy_of<GgmlType::kQ4_0, false, false, 3>;
  t.lanes[static_cast<size_t>(GgmlType::kQ4_1)] = lanes_legacy_of<GgmlType::kQ4_1, false, true, 0>;
  t.lanes[static_cast<size_t>(GgmlType::kQ5_0)] = lanes_legacy_of<GgmlType::kQ5_0, true, false, 4>;
  t.lanes[static_cast<size_t>(GgmlType::kQ5_1)] = lanes_legacy_of<GgmlType::kQ5_1, true, true, 0>;
  // q8_0's kernel runs two tokens per pass over a group: it serves prefill products as well, so
  // a packed q8_0 matrix (the output matrices) is never read from its GGUF rows again.
  t.lanes_any_tokens[static_cast<size_t>(GgmlType::kQ8_0)] = true;
}

}  // namespace kvtier::cpu
