// AMX-INT8 tiles for q4_0, q4_1, q5_0 and q5_1 on CPUs with Intel AMX (Sapphire Rapids and later),
// part of the AVX-512 table where the CPU has AMX-INT8 and Linux lets the process use it
// (cpu_features.h). 16 weight rows x up to kGroups token groups per call, over the quantised
// activation rows in place (PanelLayout::kRows: nothing is packed).
//
// The integer block dots come from TDPBSSD, 16 tokens x 16 weight rows per tile:
//   A = [16 tokens][32] s8: block b of 16 activation rows, loaded straight from the rows;
//   B = [8 element groups][16 rows x 4] s8: the rows' quants of block b with the signed types'
//       offset taken out (q4_0: u - 8, q5_0: u - 16; q4_1 and q5_1 keep u, 0..31 fits s8), built
//       once per call and block and used by every token tile;
//   C = [16 tokens][16 rows] i32, stored to memory for the float work.
// Integer sums are exact whichever unit forms them, so C holds the same isum_b as the vector tiles.
// The float chain per output is legacy_chain.h's, in the same order: s = fma(float(isum_b), dw_b *
// da_b, s), for q4_1 / q5_1 the min chain m = fma(mw_b, dsum_b, m) (blocks.h), then s + m. Here a
// vector holds one token's 16 rows. So every output has the table's vec_dot bits.
//
// Blocks go a chunk at a time: the chunk's B tiles and scales are built once, then every token tile
// runs over the chunk, its accumulators carried in a small buffer across chunks (each output still
// adds its blocks in order). Two tile sets alternate by block, so one block's tile work is issued
// before the previous block's float work.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/amx_tiles.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/legacy_chain.h"
#include "backend/cpu/simd_avx512.h"

namespace kvtier::cpu {
namespace {

constexpr int kRows = kAmxRows;                     // weight rows per call
constexpr int kGroups = 16;                         // token groups per call at most (128 tokens)
constexpr int kMaxTokens = kGroups * kPanelTokens;  // tokens per call at most
constexpr int64_t kChunk = 16;                      // blocks per chunk

// Tile registers: set 0 = A 0, B 1, C 2; set 1 = A 3, B 4, C 5. `tokens` (16, or 8 for a call's
// last odd group) is A's and C's row count.
constexpr TileConfig tile_config(int tokens) {
  return make_tile_config({{0, tokens, kQK},
                           {1, kQK / 4, kRows * 4},
                           {2, tokens, kRows * 4},
                           {3, tokens, kQK},
                           {4, kQK / 4, kRows * 4},
                           {5, tokens, kRows * 4}});
}

constexpr TileConfig kConfig16 = tile_config(kAmxTileTokens);
constexpr TileConfig kConfig8 = tile_config(kAmxHalfTokens);

// The block's quants as TDPBSSD's signed bytes: [32] s8 (the signed types' offset taken out).
template <Chain kType, typename Block>
__m256i signed_quants(const Block& x) {
  const __m256i q = unpack_unsigned<kType>(x);
  if constexpr (kOffsetShift<kType> != 0)
    return _mm256_sub_epi8(q, _mm256_set1_epi8(1 << kOffsetShift<kType>));
  return q;
}

// A chunk of blocks of the call's 16 rows, built once and read by every token tile.
struct ChunkWeights {
  alignas(64) int8_t wq[kChunk][kQK / 4][kRows * 4];  // [block][element group][row x 4] B tiles
  alignas(64) float dw[kChunk][kRows];                // [block][row] weight scales
  alignas(64) float mw[kChunk][kRows];                // [block][row] weight mins (q4_1, q5_1)
};

template <Chain kType, typename Block>
void build_chunk(const uint8_t* w, int64_t row_bytes, int64_t b0, int64_t n, ChunkWeights& cw) {
  for (int64_t i = 0; i < n; ++i) {
    __m512i v[kRows / 2];  // [r] lanes 0..7: row r's 8 element groups, lanes 8..15: row r + 8's
    for (int r = 0; r < kRows / 2; ++r) {
      const Block& lo = reinterpret_cast<const Block*>(w + r * row_bytes)[b0 + i];
      const Block& hi = reinterpret_cast<const Block*>(w + (r + 8) * row_bytes)[b0 + i];
      v[r] = avx512::join(signed_quants<kType>(lo), signed_quants<kType>(hi));
      cw.dw[i][r] = scale_of(lo);
      cw.dw[i][r + 8] = scale_of(hi);
      if constexpr (kHasMin<kType>) {
        cw.mw[i][r] = min_of(lo);
        cw.mw[i][r + 8] = min_of(hi);
      }
    }
    transpose_groups(v, cw.wq[i]);
  }
}

// Token tile [t0, t0 + NT) over the chunk's n blocks from b0: acc_s / acc_m ([NT][16 rows]) carry the
// chains across chunks. NT is a constant so that the NT accumulators stay in registers. The tile
// configuration for NT tokens is loaded.
template <Chain kType, int NT>
void tile_chunk(const uint8_t* act, int64_t act_bytes, int64_t t0, int64_t b0, int64_t n,
                const ChunkWeights& cw, float (*acc_s)[kRows], float (*acc_m)[kRows]) {
  const uint8_t* a0 = act + t0 * act_bytes + b0 * static_cast<int64_t>(sizeof(ActQ8_32));
  auto block = [&](int t, int64_t i) {  // token t0 + t's activation block b0 + i
    return reinterpret_cast<const ActQ8_32*>(a0 + t * act_bytes) + i;
  };
  alignas(64) int32_t c[2][NT][kRows];  // [block % 2][token][row] the dots
  auto dots = [&](int64_t i) {
    if (i % 2 == 0) {
      _tile_zero(2);
      _tile_loadd(0, block(0, i)->qs, act_bytes);
      _tile_loadd(1, cw.wq[i], kRows * 4);
      _tile_dpbssd(2, 0, 1);
      _tile_stored(2, c[0], kRows * 4);
    } else {
      _tile_zero(5);
      _tile_loadd(3, block(0, i)->qs, act_bytes);
      _tile_loadd(4, cw.wq[i], kRows * 4);
      _tile_dpbssd(5, 3, 4);
      _tile_stored(5, c[1], kRows * 4);
    }
  };
  __m512 s[NT];
  for (int t = 0; t < NT; ++t) s[t] = _mm512_load_ps(acc_s[t]);
  dots(0);
  for (int64_t i = 0; i < n; ++i) {
    if (i + 1 < n) dots(i + 1);
    const __m512 dwv = _mm512_load_ps(cw.dw[i]);
    for (int t = 0; t < NT; ++t) {
      const __m512 scale = _mm512_mul_ps(dwv, _mm512_set1_ps(block(t, i)->d));
      s[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c[i % 2][t])), scale, s[t]);
    }
  }
  for (int t = 0; t < NT; ++t) _mm512_store_ps(acc_s[t], s[t]);
  if constexpr (kHasMin<kType>) {
    __m512 m[NT];
    for (int t = 0; t < NT; ++t) m[t] = _mm512_load_ps(acc_m[t]);
    for (int64_t i = 0; i < n; ++i) {
      const __m512 mwv = _mm512_load_ps(cw.mw[i]);
      for (int t = 0; t < NT; ++t) {
        m[t] = _mm512_fmadd_ps(mwv, _mm512_set1_ps(block(t, i)->dsum), m[t]);
      }
    }
    for (int t = 0; t < NT; ++t) _mm512_store_ps(acc_m[t], m[t]);
  }
}

template <Chain kType, typename Block>
void rows_amx(const uint8_t* w, int64_t row_bytes, const uint8_t* act, int64_t group_bytes, int groups,
              int64_t k, float* y, int64_t ldy) {
  static_assert(kRows == 16, "one 512-bit vector per token's 16 rows");
  const int64_t act_bytes = group_bytes / kPanelTokens;
  const int64_t nb = k / kQK;
  const int n_tokens = groups * kPanelTokens;
  alignas(64) float acc_s[kMaxTokens][kRows];  // [token] lane r: row r's chain
  alignas(64) float acc_m[kMaxTokens][kRows];  // the min chains (q4_1, q5_1)
  std::memset(acc_s, 0, sizeof(acc_s));
  if constexpr (kHasMin<kType>) std::memset(acc_m, 0, sizeof(acc_m));
  ChunkWeights cw;
  for (int64_t b0 = 0; b0 < nb; b0 += kChunk) {
    const int64_t n = std::min(kChunk, nb - b0);
    build_chunk<kType, Block>(w, row_bytes, b0, n, cw);
    for_token_tiles(n_tokens, kConfig16, kConfig8, [&](int t0, auto nt) {
      tile_chunk<kType, decltype(nt)::value>(act, act_bytes, t0, b0, n, cw, acc_s + t0, acc_m + t0);
    });
  }
  _tile_release();
  for (int t = 0; t < n_tokens; ++t) {
    __m512 v = _mm512_load_ps(acc_s[t]);
    if constexpr (kHasMin<kType>) v = _mm512_add_ps(v, _mm512_load_ps(acc_m[t]));
    _mm512_storeu_ps(y + t * ldy, v);
  }
}

template <Chain kType, typename Block>
void set_amx(KernelTable& t, GgmlType type) {
  t.panel[static_cast<size_t>(type)] =
      PanelKernel{rows_amx<kType, Block>, kRows, PanelLayout::kRows, kGroups};
}

}  // namespace

void fill_amx_tiles(KernelTable& t) {
  set_amx<Chain::kQ4_0, BlockQ4_0>(t, GgmlType::kQ4_0);
  set_amx<Chain::kQ4_1, BlockQ4_1>(t, GgmlType::kQ4_1);
  set_amx<Chain::kQ5_0, BlockQ5_0>(t, GgmlType::kQ5_0);
  set_amx<Chain::kQ5_1, BlockQ5_1>(t, GgmlType::kQ5_1);
}

}  // namespace kvtier::cpu
