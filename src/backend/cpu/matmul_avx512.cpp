// AVX-512 (+VNNI) matmul tiles (kernels.h TileFn) for f32 and f16 (fill_avx512_tiles also sets
// legacy_chain.h's kernels for q4_0, q4_1, q5_0 and q5_1 with this file's 512-bit panel tile of
// theirs, and the K-quant tiles of matmul_avx512_kquants.cpp; q8_0 keeps the AVX2 table's chain
// kernels). R weight rows x T tokens per pass; per output the arithmetic is exactly vec_dot's (same
// integer sums, same scale products, same FMA chains and reductions), so every output is
// bit-identical to vec_dot.
#include <algorithm>

#include "backend/cpu/block_unpack.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/legacy_chain.h"
#include "backend/cpu/simd_avx512.h"

namespace kvtier::cpu {
namespace {

using namespace avx2;

using namespace avx512;

// Float weights, as vec_dot_avx512's dot_float per (row, token): one 16-lane FMA chain over k,
// reduce_add, a scalar tail. R x T chains; every weight and activation row is read front to back.
template <bool kHalf, int R, int T>
void tile_float(const uint8_t* w, int64_t row_bytes, const uint8_t* act, int64_t act_bytes, int64_t k,
                float* y, int64_t ldy) {
  const int64_t vec_end = k / 16 * 16;
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  for (int64_t i = 0; i < vec_end; i += 16) {
    __m512 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = load_w16<kHalf>(w + r * row_bytes, i);
    for (int t = 0; t < T; ++t) {
      const __m512 av = _mm512_loadu_ps(reinterpret_cast<const float*>(act + t * act_bytes) + i);
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], av, acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      const float* a = reinterpret_cast<const float*>(act + t * act_bytes);
      float s = reduce_add(acc[r][t]);
      for (int64_t i = vec_end; i < k; ++i) s += w_scalar<kHalf>(w + r * row_bytes, i) * a[i];
      y[t * ldy + r] = s;
    }
  }
}

// legacy_chain.h's panel tile on 512 bits: R rows x 2 GP token groups, two groups (16 tokens) per
// vector. Lanes 0..7 are group 2 gp's tokens, lanes 8..15 group 2 gp + 1's, so one VPDPBUSD of a
// broadcast 4-byte weight group takes 64 products (16 tokens x 4 elements) and the per-block float
// work (convert, scale product, FMA) runs 16 tokens at a time. Per token lane the integers are
// exact and the float chain is panel_chain's, so every output has vec_dot's bits.
template <Chain kType, typename Block, int R, int GP>
void panel_chain512(const uint8_t* w, int64_t row_bytes, const uint8_t* panel, int64_t group_bytes, int64_t k,
                    float* y, int64_t ldy) {
  const Block* x[R];
  for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const Block*>(w + r * row_bytes);
  const PanelQ8_32* p[2 * GP];
  for (int g = 0; g < 2 * GP; ++g) p[g] = reinterpret_cast<const PanelQ8_32*>(panel + g * group_bytes);
  __m512 s[R][GP], m[R][GP];  // [row][group pair] lane 8 h + t: token t of group 2 gp + h
  for (int r = 0; r < R; ++r)
    for (int gp = 0; gp < GP; ++gp) s[r][gp] = m[r][gp] = _mm512_setzero_ps();
  alignas(32) uint8_t u[R][kQK];  // [row] the block's unsigned quants
  for (int64_t b = 0; b < k / kQK; ++b) {
    for (int r = 0; r < R; ++r)
      _mm256_store_si256(reinterpret_cast<__m256i*>(u[r]), unpack_unsigned<kType>(x[r][b]));
    __m512i isum[R][GP];  // [row][group pair] the i32 block dots
    for (int r = 0; r < R; ++r)
      for (int gp = 0; gp < GP; ++gp) isum[r][gp] = _mm512_setzero_si512();
    for (int j = 0; j < kQK / 4; ++j) {
      __m512i av[GP];
      for (int gp = 0; gp < GP; ++gp)
        av[gp] = join(load256(p[2 * gp][b].qs[j]), load256(p[2 * gp + 1][b].qs[j]));
      for (int r = 0; r < R; ++r) {
        const __m512i wb = _mm512_set1_epi32(static_cast<int>(load_u32(u[r] + 4 * j)));
        for (int gp = 0; gp < GP; ++gp) isum[r][gp] = _mm512_dpbusd_epi32(isum[r][gp], wb, av[gp]);
      }
    }
    for (int gp = 0; gp < GP; ++gp) {
      const __m512 da = _mm512_castsi512_ps(join(_mm256_castps_si256(_mm256_loadu_ps(p[2 * gp][b].d)),
                                                 _mm256_castps_si256(_mm256_loadu_ps(p[2 * gp + 1][b].d))));
      const __m512i asum = join(load256(p[2 * gp][b].sum), load256(p[2 * gp + 1][b].sum));
      const __m512 dsum =
          _mm512_castsi512_ps(join(_mm256_castps_si256(_mm256_loadu_ps(p[2 * gp][b].dsum)),
                                   _mm256_castps_si256(_mm256_loadu_ps(p[2 * gp + 1][b].dsum))));
      for (int r = 0; r < R; ++r) {
        __m512i is = isum[r][gp];
        if constexpr (kOffsetShift<kType> != 0)
          is = _mm512_sub_epi32(is, _mm512_slli_epi32(asum, kOffsetShift<kType>));
        const __m512 scale = _mm512_mul_ps(_mm512_set1_ps(scale_of(x[r][b])), da);
        s[r][gp] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), scale, s[r][gp]);
        if constexpr (kHasMin<kType>)
          m[r][gp] = _mm512_fmadd_ps(_mm512_set1_ps(min_of(x[r][b])), dsum, m[r][gp]);
      }
    }
  }
  static_assert(kPanelTokens == 8, "one lane per token, two groups per vector");
  for (int r = 0; r < R; ++r) {
    for (int gp = 0; gp < GP; ++gp) {
      const __m512 v = kHasMin<kType> ? _mm512_add_ps(s[r][gp], m[r][gp]) : s[r][gp];
      store_token_lanes(_mm512_castps512_ps256(v), y + 2 * gp * kPanelTokens * ldy, ldy, r);
      store_token_lanes(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)),
                        y + (2 * gp + 1) * kPanelTokens * ldy, ldy, r);
    }
  }
}

// Panel tiles of the 4- and 5-bit legacy types on 512 bits: R rows x 2 GP groups per call; a call
// with fewer groups (a matmul's last ones) runs them one at a time through legacy_chain.h's 256-bit
// VNNI tile.
template <Chain kType, typename Block, int R, int GP>
void set_chain512(KernelTable& t, GgmlType type) {
  t.panel[static_cast<size_t>(type)] = PanelKernel{
      panel_in_groups<panel_chain512<kType, Block, R, GP>, panel_chain<true, kType, Block, R, 1>, 2 * GP>, R,
      PanelLayout::kGroups, 2 * GP};
}

}  // namespace

void fill_avx512_tiles(KernelTable& t) {
  auto set = [&t](GgmlType type, TileKernel k, TileKernel wide = {}) {
    t.tile[static_cast<size_t>(type)] = k;
    t.tile_wide[static_cast<size_t>(type)] = wide;
  };
  set(GgmlType::kF32, TileKernel{tile_float<false, 4, 4>, 4, 4});
  set(GgmlType::kF16, TileKernel{tile_float<true, 4, 4>, 4, 4});
  // q8_0 keeps the AVX2 table's kernels: legacy_chain.h's chain (vec_dot, one-token tile) and
  // matmul_avx2_panel.cpp's panel tile, so its outputs are the AVX2 path's bit for bit; prefill and
  // decode over the layers' copies run the same chain (matmul_lanes_avx512*.cpp). The 4- and 5-bit
  // legacy quants take legacy_chain.h's panel tiles with VPDPBUSD (vec_dot and one-token tiles with
  // them, replacing vec_dot_avx512.cpp's for those types).
  fill_legacy_chain<true>(t);
  // 2 rows x 2 group pairs (4 token groups, two 16-token vectors) per call: bench_matmul_cputime 3
  // avx512 on a 2-vCPU Intel Xeon (family 6 model 207, AVX-512 VNNI), 3 rounds beside builds, GFLOP
  // per CPU second: the 256-bit tile (2 rows x 1 group) q5_0 82-87, q4_1 70-86; 2 x 2 group pairs
  // 118-135 and 98-138. Rows x pairs of 1 x 2, 4 x 2, 1 x 3, 2 x 3 and 2 x 4 were no faster; 1 x 4
  // was slower.
  constexpr int R = 2, GP = 2;
  set_chain512<Chain::kQ4_0, BlockQ4_0, R, GP>(t, GgmlType::kQ4_0);
  set_chain512<Chain::kQ4_1, BlockQ4_1, R, GP>(t, GgmlType::kQ4_1);
  set_chain512<Chain::kQ5_0, BlockQ5_0, R, GP>(t, GgmlType::kQ5_0);
  set_chain512<Chain::kQ5_1, BlockQ5_1, R, GP>(t, GgmlType::kQ5_1);
  fill_avx512_ktiles(t);
}

}  // namespace kvtier::cpu
