// SIMD kernels of the legacy quants (q4_0, q4_1, q5_0, q5_1; on AVX2 also q8_0's vec_dot and one-token
// tile; its panel tile is in matmul_avx2_panel.cpp) built on one scalar chain per output: for each block b,
//     s = fma(float(isum_b), dw_b * da_b, s)          (isum_b: the block's exact integer dot)
// and, for q4_1 / q5_1, a second chain m = fma(mw_b, dsum_b, m), the result s + m (dsum_b = da_b *
// float(asum_b), rounded once when the activations are quantised: ActFormat::kQ8_32Min, blocks.h).
// The integer isum_b is exact whichever lanes compute it, so the matmul tile may place tokens in
// lanes (8 tokens of an activation panel, act_panel.h) and the one-token tile rows in lanes: every
// output still runs the same float chain, bit for bit, as vec_dot below.
//
// Weights are unpacked to unsigned bytes (q4: 0..15, q5: 0..31) so that one VPMADDUBSW multiplies
// them with signed activations directly; the signed types take their offset out afterwards
// (isum = dot(u, a) - offset * sum(a), with the block sums quantisation already keeps).
// q8_0's quants are signed bytes, whose offset form (q + 128) would overflow VPMADDUBSW's int16 pair
// sums: its block dot multiplies |q| by the activations carrying q's sign (VPSIGNB).
// Against the 8-lane per-token chains of the other legacy kernels, a panel tile converts, scales
// and accumulates once per 8 tokens and needs no VPSIGNB. bench_matmul_cputime avx2 (2-vCPU AMD
// EPYC Zen 4, 3 interleaved rounds with the previous 1 x 8 tiles, a busy machine, so per CPU second):
// prefill q5_0 640 -> 2048 67 -> 100, q4_1 576 -> 1536 69 -> 104 GFLOP; decode (one token, 16384 x
// 2048) q5_0 12.5 -> 15.0, q4_1 17.7 -> 18.8 GB of weights per CPU second.
//
// Included only by SIMD translation units (matmul_avx2_panel.cpp, matmul_avx512.cpp); everything is
// in an unnamed namespace, so each ISA's copy stays in its own translation unit.
#pragma once

#include "backend/cpu/act_panel.h"
#include "backend/cpu/block_unpack.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_avx2.h"

namespace kvtier::cpu {
namespace {

using namespace avx2;

enum class Chain { kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0 };

// q8_0: signed quants (no offset, no min).
template <Chain kType>
constexpr bool kSigned = kType == Chain::kQ8_0;

template <Chain kType>
constexpr bool kHasMin = kType == Chain::kQ4_1 || kType == Chain::kQ5_1;

// The signed types' offset as a shift: q4_0 quants are u - 8, q5_0 quants u - 16.
template <Chain kType>
constexpr int kOffsetShift = kType == Chain::kQ4_0   ? 3
                             : kType == Chain::kQ5_0 ? 4
                                                     : 0;

// The block's 32 quants as unsigned bytes: [32] u8 in 0..15 (q4) or 0..31 (q5).
template <Chain kType, typename Block>
__m256i unpack_unsigned(const Block& blk) {
  __m256i q = nibbles_32(blk.qs);
  if constexpr (kType == Chain::kQ5_0 || kType == Chain::kQ5_1) q = _mm256_or_si256(q, bits_to_0x10(blk.qh));
  return q;
}

// The block's f16 scale (and min) as floats.
template <typename Block>
float scale_of(const Block& blk) {
  return f16(blk.d);
}
template <typename Block>
float min_of(const Block& blk) {
  return f16(blk.m);
}

// Exact integer dot of one block: sum of (quant) * (activation) over its 32 elements.
template <Chain kType, typename Block>
int block_isum(const Block& blk, const ActQ8_32& a) {
  if constexpr (kSigned<kType>) {
    return hsum_i32(dot_s8s8(load256(blk.qs), load256(a.qs)));
  } else {
    const int u = hsum_i32(dot_u8s8(unpack_unsigned<kType>(blk), load256(a.qs)));
    if constexpr (kOffsetShift<kType> != 0) return u - (a.sum << kOffsetShift<kType>);
    return u;
  }
}

template <Chain kType, typename Block>
float dot_chain(const uint8_t* w8, const uint8_t* a8, int64_t k) {
  const auto* x = reinterpret_cast<const Block*>(w8);
  const auto* a = reinterpret_cast<const ActQ8_32*>(a8);
  __m128 s = _mm_setzero_ps(), m = _mm_setzero_ps();  // lane 0: the two chains
  for (int64_t b = 0; b < k / kQK; ++b) {
    const float isum = static_cast<float>(block_isum<kType>(x[b], a[b]));
    s = _mm_fmadd_ss(_mm_set_ss(isum), _mm_set_ss(scale_of(x[b]) * a[b].d), s);
    if constexpr (kHasMin<kType>) m = _mm_fmadd_ss(_mm_set_ss(min_of(x[b])), _mm_set_ss(a[b].dsum), m);
  }
  if constexpr (kHasMin<kType>) return _mm_cvtss_f32(_mm_add_ss(s, m));
  return _mm_cvtss_f32(s);
}

// One token, 4 rows (lane r: row r): each row's block dot in 8 lanes, the 4 rows reduced together
// by horizontal adds, then one 4-lane convert / scale / FMA per block.
template <bool kVnni, Chain kType, typename Block>
void narrow_chain(const uint8_t* w, int64_t row_bytes, const uint8_t* act, int64_t /*act_bytes*/, int64_t k,
                  float* y, int64_t /*ldy*/) {
  constexpr int R = 4;
  const Block* x[R];
  for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const Block*>(w + r * row_bytes);
  const auto* a = reinterpret_cast<const ActQ8_32*>(act);
  __m128 s = _mm_setzero_ps(), m = _mm_setzero_ps();  // [row]
  for (int64_t b = 0; b < k / kQK; ++b) {
    prefetch_ahead(w, b, R * static_cast<int64_t>(sizeof(Block)));
    const __m256i av = load256(a[b].qs);
    __m256i p[R];  // [row] 8 x i32 partial dots
    for (int r = 0; r < R; ++r) {
      if constexpr (kSigned<kType>) {
        static_assert(!kVnni, "q8_0's chain has no VNNI instance");
        p[r] = dot_s8s8(load256(x[r][b].qs), av);
      } else if constexpr (kVnni) {
        p[r] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), unpack_unsigned<kType>(x[r][b]), av);
      } else {
        p[r] = dot_u8s8(unpack_unsigned<kType>(x[r][b]), av);
      }
    }
    const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    __m128i isum = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));  // [row]
    if constexpr (kOffsetShift<kType> != 0)
      isum = _mm_sub_epi32(isum, _mm_set1_epi32(a[b].sum << kOffsetShift<kType>));
    const __m128 da = _mm_set1_ps(a[b].d);
    if constexpr (kHasMin<kType>) {
      // The 4 rows' adjacent (d, m) f16 pairs converted together: [d0 m0 d1 m1 d2 m2 d3 m3] -> d's, m's.
      __m128i dm = _mm_cvtsi32_si128(static_cast<int>(load_u32(&x[0][b].d)));
      dm = _mm_insert_epi32(dm, static_cast<int>(load_u32(&x[1][b].d)), 1);
      dm = _mm_insert_epi32(dm, static_cast<int>(load_u32(&x[2][b].d)), 2);
      dm = _mm_insert_epi32(dm, static_cast<int>(load_u32(&x[3][b].d)), 3);
      const __m256 split =
          _mm256_permutevar8x32_ps(_mm256_cvtph_ps(dm), _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
      const __m128 dw = _mm256_castps256_ps128(split), mw = _mm256_extractf128_ps(split, 1);
      s = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(dw, da), s);
      m = _mm_fmadd_ps(mw, _mm_set1_ps(a[b].dsum), m);
    } else {
      __m128i d = _mm_cvtsi32_si128(x[0][b].d);
      d = _mm_insert_epi16(d, x[1][b].d, 1);
      d = _mm_insert_epi16(d, x[2][b].d, 2);
      d = _mm_insert_epi16(d, x[3][b].d, 3);
      s = _mm_fmadd_ps(_mm_cvtepi32_ps(isum), _mm_mul_ps(_mm_cvtph_ps(d), da), s);
    }
  }
  if constexpr (kHasMin<kType>) s = _mm_add_ps(s, m);
  _mm_storeu_ps(y, s);
}

// R rows x G token groups of 8 over panels (lane t: token t). Per block and row: the unpacked weights
// go to a small buffer, and each 4-byte group is broadcast against the panels' vectors of that
// group; the int16 pair sums of 4 groups stay below 2^15 (4 x 2 x 31 x 127), so they are added
// before widening. Each block is unpacked, and each weight group broadcast, once for all G groups.
template <bool kVnni, Chain kType, typename Block, int R, int G>
void panel_chain(const uint8_t* w, int64_t row_bytes, const uint8_t* panel, int64_t group_bytes, int64_t k,
                 float* y, int64_t ldy) {
  const Block* x[R];
  for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const Block*>(w + r * row_bytes);
  const PanelQ8_32* p[G];
  for (int g = 0; g < G; ++g) p[g] = reinterpret_cast<const PanelQ8_32*>(panel + g * group_bytes);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 s[R][G], m[R][G];  // [row][group] lane t: token t's chains
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) s[r][g] = m[r][g] = _mm256_setzero_ps();
  alignas(32) uint8_t u[R][kQK];  // [row] the block's unsigned quants
  for (int64_t b = 0; b < k / kQK; ++b) {
    for (int r = 0; r < R; ++r)
      _mm256_store_si256(reinterpret_cast<__m256i*>(u[r]), unpack_unsigned<kType>(x[r][b]));
    // [row][group] AVX2: int16 pair sums of element groups 0..3 and 4..7; VNNI: lo the i32 dots
    __m256i lo[R][G], hi[R][G];
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) lo[r][g] = hi[r][g] = _mm256_setzero_si256();
    for (int j = 0; j < kQK / 4; ++j) {
      for (int r = 0; r < R; ++r) {
        const __m256i wb = _mm256_set1_epi32(static_cast<int>(load_u32(u[r] + 4 * j)));
        for (int g = 0; g < G; ++g) {
          const __m256i av = load256(p[g][b].qs[j]);
          if constexpr (kVnni) {
            lo[r][g] = _mm256_dpbusd_epi32(lo[r][g], wb, av);
          } else {
            const __m256i d = _mm256_maddubs_epi16(wb, av);
            if (j < 4)
              lo[r][g] = _mm256_add_epi16(lo[r][g], d);
            else
              hi[r][g] = _mm256_add_epi16(hi[r][g], d);
          }
        }
      }
    }
    for (int g = 0; g < G; ++g) {
      const __m256 da = _mm256_loadu_ps(p[g][b].d);
      const __m256i asum = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[g][b].sum));
      for (int r = 0; r < R; ++r) {
        __m256i isum = lo[r][g];
        if constexpr (!kVnni)
          isum = _mm256_add_epi32(_mm256_madd_epi16(lo[r][g], ones), _mm256_madd_epi16(hi[r][g], ones));
        if constexpr (kOffsetShift<kType> != 0)
          isum = _mm256_sub_epi32(isum, _mm256_slli_epi32(asum, kOffsetShift<kType>));
        const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(scale_of(x[r][b])), da);
        s[r][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, s[r][g]);
        if constexpr (kHasMin<kType>)
          m[r][g] = _mm256_fmadd_ps(_mm256_set1_ps(min_of(x[r][b])), _mm256_loadu_ps(p[g][b].dsum), m[r][g]);
      }
    }
  }
  static_assert(kPanelTokens == 8, "one lane per token");
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g)
      store_token_lanes(kHasMin<kType> ? _mm256_add_ps(s[r][g], m[r][g]) : s[r][g],
                        y + g * kPanelTokens * ldy, ldy, r);
}

template <bool kVnni, Chain kType, typename Block>
void set_chain(KernelTable& t, GgmlType type) {
  const auto i = static_cast<size_t>(type);
  t.vec_dot[i] = dot_chain<kType, Block>;
  t.tile[i] = TileKernel{};
  t.tile_wide[i] = TileKernel{};
  t.tile_narrow[i] = TileKernel{narrow_chain<kVnni, kType, Block>, 4, 1};
  // AVX2: 1 row x 2 token groups (bench_matmul_cputime 3 avx2, 3 interleaved rounds on a 2-vCPU AMD
  // EPYC, AVX2 only, GFLOP per CPU second: q5_0 640 -> 2048 85.5 -> 96, q4_1 576 -> 1536 83 -> 97.5
  // against 2 rows x 1 group; 1 x 3, 1 x 4 and 2 x 2 were slower than 1 x 2). VNNI (not measured with
  // several groups): 2 rows x 1 group, which the AVX-512 table keeps for the groups left over at a
  // matmul's end (its full calls take matmul_avx512.cpp's 512-bit panel_chain512, 16 tokens per vector).
  constexpr int R = kVnni ? 2 : 1, G = kVnni ? 1 : 2;
  t.panel[i] = PanelKernel{
      panel_in_groups<panel_chain<kVnni, kType, Block, R, G>, panel_chain<kVnni, kType, Block, R, 1>, G>, R,
      PanelLayout::kGroups, G};
}

// Sets vec_dot, the one-token tile and the panel tile of q4_0, q4_1, q5_0 and q5_1 (and clears their
// other tiles). kVnni: the integer dots by VPDPBUSD (AVX-512 VNNI on 256 bits) instead of
// VPMADDUBSW + VPMADDWD; the integers, hence the outputs, are the same.
template <bool kVnni>
void fill_legacy_chain(KernelTable& t) {
  set_chain<kVnni, Chain::kQ4_0, BlockQ4_0>(t, GgmlType::kQ4_0);
  set_chain<kVnni, Chain::kQ4_1, BlockQ4_1>(t, GgmlType::kQ4_1);
  set_chain<kVnni, Chain::kQ5_0, BlockQ5_0>(t, GgmlType::kQ5_0);
  set_chain<kVnni, Chain::kQ5_1, BlockQ5_1>(t, GgmlType::kQ5_1);
}

}  // namespace
}  // namespace kvtier::cpu
