// AMX-INT8 tiles for q4_K and q6_K (the AVX-512 table's, where the CPU has AMX-INT8; see
// matmul_amx.cpp for the legacy quants and cpu_features.h for when AMX is used). 16 weight rows x up
// to kGroups token groups per call, over the quantised activation rows in place (PanelLayout::kRows).
//
// Per super-block (256 elements) both types' vec_dot (vec_dot_avx2.cpp, which the AVX-512 table
// keeps) combines exact integers with one float expression:
//   q4_K: isum = sum_j sc_j * dot_j (8 sub-blocks of 32, scales 0..63, quants 0..15),
//         msum = sum_j mn_j * (bsum_2j + bsum_2j+1);
//         s = s + ((d * da) * float(isum) - (dmin * da) * float(msum))
//   q6_K: isum = sum_j sc_j * dot_j (16 sub-blocks of 16, signed scales, quants q in -32..31; the
//         vector kernels form it as the +32 offset form minus 32 * sum_j sc_j * bsum_j, the same
//         integer); s = s + (d * da) * float(isum)
// Here the sub-block scale is folded into the weights: w = sc_j * q (|w| <= 945 for q4_K, 4096 for
// q6_K) is split as w = 128 * hi + lo with lo in 0..127 and hi = floor(w / 128) (in -32..32), both
// signed bytes. Two TDPBSSD chains over the super-block's four 64-element steps give C_lo = sum lo * a
// and C_hi = sum hi * a, and isum = C_lo + 128 * C_hi exactly (|isum| < 2^31). msum comes from
// VPDPWSSD over the rows' min pairs (16 rows in lanes). The float expression then runs with the
// same operands in the same order, one token's 16 rows per vector, so every output has vec_dot's
// bits.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/amx_tiles.h"
#include "backend/cpu/block_unpack.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_avx2.h"
#include "backend/cpu/simd_avx512.h"

namespace kvtier::cpu {
namespace {

enum class KType { kQ4_K, kQ6_K };

constexpr int kRows = kAmxRows;
constexpr int kGroups = 16;  // token groups per call at most (128 tokens)
constexpr int kMaxTokens = kGroups * kPanelTokens;
constexpr int kSteps = kQKK / 64;  // 64-element steps per super-block (one A tile each)
constexpr int64_t kChunk = 2;      // super-blocks per chunk: [2][2][4][16][64] B bytes = 16 KiB

// Tiles: A 0 and 3 (alternate steps: [tokens][64] s8), B 1 (lo) and 4 (hi) ([16 element groups]
// [16 rows x 4] s8), C: super-block set 0 = 2 (lo), 5 (hi); set 1 = 6, 7 ([tokens][16 rows] i32).
constexpr TileConfig tile_config(int tokens) {
  return make_tile_config({{0, tokens, 64},
                           {3, tokens, 64},
                           {1, 16, kRows * 4},
                           {4, 16, kRows * 4},
                           {2, tokens, kRows * 4},
                           {5, tokens, kRows * 4},
                           {6, tokens, kRows * 4},
                           {7, tokens, kRows * 4}});
}

constexpr TileConfig kConfig16 = tile_config(kAmxTileTokens);
constexpr TileConfig kConfig8 = tile_config(kAmxHalfTokens);

// A chunk of super-blocks of the call's 16 rows, built once and read by every token tile.
struct ChunkWeights {
  alignas(64) int8_t wq[kChunk][2][kSteps][16][kRows * 4];  // [sb][lo, hi][step][element group][row x 4]
  alignas(64) float dw[kChunk][kRows];                      // [sb][row] d
  alignas(64) float dmin[kChunk][kRows];                    // [sb][row] dmin (q4_K)
  alignas(64) int32_t mins[kChunk][4][kRows];               // [sb][p][row] mins (2p, 2p + 1) as i16 pairs
};

// w = sc * q for 32 elements (i16 lanes) -> lo (w & 127) and hi (w >> 7, arithmetic) as 32 bytes each.
void split_scaled(__m512i w, int8_t* lo, int8_t* hi) {
  _mm256_store_si256(reinterpret_cast<__m256i*>(lo),
                     _mm512_cvtepi16_epi8(_mm512_and_si512(w, _mm512_set1_epi16(0x7f))));
  _mm256_store_si256(reinterpret_cast<__m256i*>(hi), _mm512_cvtepi16_epi8(_mm512_srai_epi16(w, 7)));
}

// Scale words: lanes 0..15 take a, 16..31 take b.
__m512i two_scales(int a, int b) {
  return _mm512_mask_blend_epi16(0xFFFF0000u, _mm512_set1_epi16(static_cast<int16_t>(a)),
                                 _mm512_set1_epi16(static_cast<int16_t>(b)));
}

// Super-block sb of the 16 rows -> split[lo, hi][step][row][64] scaled quants, and the scales.
template <KType kType>
void scale_rows(const uint8_t* w, int64_t row_bytes, int64_t sb, int i, ChunkWeights& cw,
                int8_t (&split)[2][kSteps][kRows][64]) {
  for (int r = 0; r < kRows; ++r) {
    if constexpr (kType == KType::kQ4_K) {
      const BlockQ4_K& x = reinterpret_cast<const BlockQ4_K*>(w + r * row_bytes)[sb];
      uint8_t sc[8], mn[8];
      unpack_scales_mins_k4(x.scales, sc, mn);
      for (int c = 0; c < kSteps; ++c) {  // elements 64 c ..: sub-blocks 2 c (low nibbles), 2 c + 1
        const __m512i q = avx512::q4k_quants(x.qs + 32 * c);
        const __m512i w0 =
            _mm512_mullo_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(q)), _mm512_set1_epi16(sc[2 * c]));
        const __m512i w1 = _mm512_mullo_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(q, 1)),
                                              _mm512_set1_epi16(sc[2 * c + 1]));
        split_scaled(w0, split[0][c][r], split[1][c][r]);
        split_scaled(w1, split[0][c][r] + 32, split[1][c][r] + 32);
      }
      cw.dw[i][r] = avx2::f16(x.d);
      cw.dmin[i][r] = avx2::f16(x.dmin);
      for (int p = 0; p < 4; ++p) cw.mins[i][p][r] = mn[2 * p] | (mn[2 * p + 1] << 16);
    } else {
      const BlockQ6_K& x = reinterpret_cast<const BlockQ6_K*>(w + r * row_bytes)[sb];
      for (int h = 0; h < 2; ++h) {
        for (int g = 0; g < 2; ++g) {  // elements 128 h + 64 g ..: sub-blocks j0 .. j0 + 3 of 16
          const int c = 2 * h + g, j0 = 8 * h + 4 * g;
          const __m512i q = avx512::q6k_quants(x.ql, x.qh, h, g);  // q + 32
          const __m512i off = _mm512_set1_epi16(32);
          const __m512i q0 = _mm512_sub_epi16(_mm512_cvtepu8_epi16(_mm512_castsi512_si256(q)), off);
          const __m512i q1 = _mm512_sub_epi16(_mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(q, 1)), off);
          const __m512i w0 = _mm512_mullo_epi16(q0, two_scales(x.scales[j0], x.scales[j0 + 1]));
          const __m512i w1 = _mm512_mullo_epi16(q1, two_scales(x.scales[j0 + 2], x.scales[j0 + 3]));
          split_scaled(w0, split[0][c][r], split[1][c][r]);
          split_scaled(w1, split[0][c][r] + 32, split[1][c][r] + 32);
        }
      }
      cw.dw[i][r] = avx2::f16(x.d);
    }
  }
}

template <KType kType>
void build_chunk(const uint8_t* w, int64_t row_bytes, int64_t sb0, int64_t n, ChunkWeights& cw) {
  alignas(64) int8_t split[2][kSteps][kRows][64];  // [lo, hi][step][row] scaled quants
  for (int i = 0; i < n; ++i) {
    scale_rows<kType>(w, row_bytes, sb0 + i, i, cw, split);
    for (int part = 0; part < 2; ++part) {
      for (int c = 0; c < kSteps; ++c) {
        for (int half = 0; half < 2; ++half) {  // elements 32 half .. + 31: B rows 8 half .. + 7
          __m512i v[8];
          for (int r = 0; r < 8; ++r)
            v[r] = avx512::join(avx2::load256(split[part][c][r] + 32 * half),
                                avx2::load256(split[part][c][r + 8] + 32 * half));
          transpose_groups(v, cw.wq[i][part][c] + 8 * half);
        }
      }
    }
  }
}

// One super-block's dots of a token tile: qs = the first token's ActQ8_K quants (the others act_bytes
// apart) -> c_lo, c_hi ([tokens][16 rows] i32). The C tiles kLo and kHi (2 and 5, or 6 and 7: the
// intrinsics take tile numbers as literals, hence the macro) accumulate the four 64-element steps;
// A alternates between tiles 0 and 3.
#define KVTIER_AMX_SUPERBLOCK_DOTS(kLo, kHi)        \
  do {                                              \
    _tile_zero(kLo);                                \
    _tile_zero(kHi);                                \
    for (int c = 0; c < kSteps; c += 2) {           \
      _tile_loadd(0, qs + 64 * c, act_bytes);       \
      _tile_loadd(1, wq[0][c], kRows * 4);          \
      _tile_dpbssd(kLo, 0, 1);                      \
      _tile_loadd(4, wq[1][c], kRows * 4);          \
      _tile_dpbssd(kHi, 0, 4);                      \
      _tile_loadd(3, qs + 64 * (c + 1), act_bytes); \
      _tile_loadd(1, wq[0][c + 1], kRows * 4);      \
      _tile_dpbssd(kLo, 3, 1);                      \
      _tile_loadd(4, wq[1][c + 1], kRows * 4);      \
      _tile_dpbssd(kHi, 3, 4);                      \
    }                                               \
    _tile_stored(kLo, c_lo, kRows * 4);             \
    _tile_stored(kHi, c_hi, kRows * 4);             \
  } while (false)

template <int kSet>
[[gnu::always_inline]] inline void superblock_dots(const int8_t* qs, int64_t act_bytes,
                                                   const int8_t (&wq)[2][kSteps][16][kRows * 4],
                                                   int32_t* c_lo, int32_t* c_hi) {
  if constexpr (kSet == 0)
    KVTIER_AMX_SUPERBLOCK_DOTS(2, 5);
  else
    KVTIER_AMX_SUPERBLOCK_DOTS(6, 7);
}
#undef KVTIER_AMX_SUPERBLOCK_DOTS

// Token tile [t0, t0 + NT) over the chunk's n super-blocks from sb0; acc ([NT][16 rows]) carries the
// outputs across chunks. The tile configuration for NT tokens is loaded.
template <KType kType, int NT>
void tile_chunk(const uint8_t* act, int64_t act_bytes, int64_t t0, int64_t sb0, int64_t n,
                const ChunkWeights& cw, float (*acc)[kRows]) {
  const uint8_t* a0 = act + t0 * act_bytes + sb0 * static_cast<int64_t>(sizeof(ActQ8_K));
  auto block = [&](int t, int64_t i) { return reinterpret_cast<const ActQ8_K*>(a0 + t * act_bytes) + i; };
  alignas(64) int32_t c[2][2][NT][kRows];  // [sb % 2][lo, hi][token][row]
  auto dots = [&](int64_t i) {
    if (i % 2 == 0)
      superblock_dots<0>(block(0, i)->qs, act_bytes, cw.wq[i], &c[0][0][0][0], &c[0][1][0][0]);
    else
      superblock_dots<1>(block(0, i)->qs, act_bytes, cw.wq[i], &c[1][0][0][0], &c[1][1][0][0]);
  };
  __m512 s[NT];
  for (int t = 0; t < NT; ++t) s[t] = _mm512_load_ps(acc[t]);
  dots(0);
  for (int64_t i = 0; i < n; ++i) {
    if (i + 1 < n) dots(i + 1);
    const __m512 dwv = _mm512_load_ps(cw.dw[i]);
    for (int t = 0; t < NT; ++t) {
      const ActQ8_K* a = block(t, i);
      const __m512i isum = _mm512_add_epi32(_mm512_load_si512(c[i % 2][0][t]),
                                            _mm512_slli_epi32(_mm512_load_si512(c[i % 2][1][t]), 7));
      const __m512 da = _mm512_set1_ps(a->d);
      if constexpr (kType == KType::kQ4_K) {
        const __m128i pairs = _mm_hadd_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a->bsums)),
                                             _mm_loadu_si128(reinterpret_cast<const __m128i*>(a->bsums + 8)));
        __m512i msum = _mm512_setzero_si512();
        msum = _mm512_dpwssd_epi32(msum, _mm512_load_si512(cw.mins[i][0]), _mm512_broadcastd_epi32(pairs));
        msum = _mm512_dpwssd_epi32(msum, _mm512_load_si512(cw.mins[i][1]),
                                   _mm512_broadcastd_epi32(_mm_shuffle_epi32(pairs, 1)));
        msum = _mm512_dpwssd_epi32(msum, _mm512_load_si512(cw.mins[i][2]),
                                   _mm512_broadcastd_epi32(_mm_shuffle_epi32(pairs, 2)));
        msum = _mm512_dpwssd_epi32(msum, _mm512_load_si512(cw.mins[i][3]),
                                   _mm512_broadcastd_epi32(_mm_shuffle_epi32(pairs, 3)));
        const __m512 term = _mm512_sub_ps(
            _mm512_mul_ps(_mm512_mul_ps(dwv, da), _mm512_cvtepi32_ps(isum)),
            _mm512_mul_ps(_mm512_mul_ps(_mm512_load_ps(cw.dmin[i]), da), _mm512_cvtepi32_ps(msum)));
        s[t] = _mm512_add_ps(s[t], term);
      } else {
        s[t] = _mm512_add_ps(s[t], _mm512_mul_ps(_mm512_mul_ps(dwv, da), _mm512_cvtepi32_ps(isum)));
      }
    }
  }
  for (int t = 0; t < NT; ++t) _mm512_store_ps(acc[t], s[t]);
}

template <KType kType>
void rows_amx_k(const uint8_t* w, int64_t row_bytes, const uint8_t* act, int64_t group_bytes, int groups,
                int64_t k, float* y, int64_t ldy) {
  const int64_t act_bytes = group_bytes / kPanelTokens;
  const int64_t nsb = k / kQKK;
  const int n_tokens = groups * kPanelTokens;
  alignas(64) float acc[kMaxTokens][kRows];  // [token] lane r: row r's output
  std::memset(acc, 0, sizeof(acc));
  ChunkWeights cw;
  for (int64_t sb0 = 0; sb0 < nsb; sb0 += kChunk) {
    const int64_t n = std::min(kChunk, nsb - sb0);
    build_chunk<kType>(w, row_bytes, sb0, n, cw);
    for_token_tiles(n_tokens, kConfig16, kConfig8, [&](int t0, auto nt) {
      tile_chunk<kType, decltype(nt)::value>(act, act_bytes, t0, sb0, n, cw, acc + t0);
    });
  }
  _tile_release();
  for (int t = 0; t < n_tokens; ++t) _mm512_storeu_ps(y + t * ldy, _mm512_load_ps(acc[t]));
}

}  // namespace

void fill_amx_ktiles(KernelTable& t) {
  t.panel[static_cast<size_t>(GgmlType::kQ4_K)] =
      PanelKernel{rows_amx_k<KType::kQ4_K>, kRows, PanelLayout::kRows, kGroups};
  t.panel[static_cast<size_t>(GgmlType::kQ6_K)] =
      PanelKernel{rows_amx_k<KType::kQ6_K>, kRows, PanelLayout::kRows, kGroups};
}

}  // namespace kvtier::cpu
