// The AVX2 instance of legacy_chain.h: q4_0, q4_1, q5_0 and q5_1 with VPMADDUBSW integer dots, and
// q8_0: its vec_dot and one-token tile from the chain, its panel tile here, over int16 pair panels.
#include "backend/cpu/legacy_chain.h"

namespace kvtier::cpu {
namespace {

// q8_0, R rows x G token groups of 8 over PanelQ8_32Pairs (lane t: token t). Per block and row the 32
// quants are widened to int16 into a small buffer; for each pair of elements the row's two weights are
// broadcast (one 32-bit load) and one VPMADDWD against a group's panel vector adds 2 products of each
// of its 8 tokens to an int32 lane, exactly (|q| <= 128, |a| <= 127). The block's integer dots are then
// the chain's isum: one convert, one scale product and one FMA per 8 tokens, as dot_chain per token.
// Against the VPSIGNB + VPMADDUBSW + VPMADDWD of the 8-bit form, a pair of products costs one
// multiply-add and no sign fix-up, the int8 peak loop's count of multiplier operations.
template <int R, int G>
void panel_q8_0_pairs(const uint8_t* w, int64_t row_bytes, const uint8_t* panel, int64_t group_bytes,
                      int64_t k, float* y, int64_t ldy) {
  const BlockQ8_0* x[R];
  for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const BlockQ8_0*>(w + r * row_bytes);
  const PanelQ8_32Pairs* p[G];
  for (int g = 0; g < G; ++g) p[g] = reinterpret_cast<const PanelQ8_32Pairs*>(panel + g * group_bytes);
  __m256 s[R][G];  // [row][group] lane t: token t's chain
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) s[r][g] = _mm256_setzero_ps();
  alignas(32) int16_t w16[R][kQK];  // [row] the block's quants as int16
  for (int64_t b = 0; b < k / kQK; ++b) {
    for (int r = 0; r < R; ++r) {
      const __m256i q = load256(x[r][b].qs);
      _mm256_store_si256(reinterpret_cast<__m256i*>(w16[r]), _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(w16[r] + 16),
                         _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1)));
    }
    // The pairs are broadcast from these stores by the load ports; without the barrier GCC forwards
    // them from registers by two shuffles per pair on the vector ALU.
    asm volatile("" ::: "memory");
    __m256i acc[R][G];  // [row][group] lane t: token t's block dot so far
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) acc[r][g] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int j = 0; j < kQK / 2; ++j) {  // unrolled whole, GCC issued all products first and spilled them
      __m256i av[G];
      for (int g = 0; g < G; ++g) av[g] = load256(p[g][b].qs[j]);
      for (int r = 0; r < R; ++r) {
        const __m256i wb = _mm256_set1_epi32(static_cast<int>(load_u32(w16[r] + 2 * j)));
        for (int g = 0; g < G; ++g) acc[r][g] = _mm256_add_epi32(acc[r][g], _mm256_madd_epi16(wb, av[g]));
      }
    }
    for (int g = 0; g < G; ++g) {
      const __m256 da = _mm256_loadu_ps(p[g][b].d);
      for (int r = 0; r < R; ++r) {
        const __m256 scale = _mm256_mul_ps(_mm256_set1_ps(f16(x[r][b].d)), da);
        s[r][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][g]), scale, s[r][g]);
      }
    }
  }
  static_assert(kPanelTokens == 8, "one lane per token");
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) store_token_lanes(s[r][g], y + g * kPanelTokens * ldy, ldy, r);
}

}  // namespace

void fill_avx2_panel_kernels(KernelTable& t) {
  fill_legacy_chain<false>(t);
  // q8_0: the chain's vec_dot and one-token tile; 4 rows x 2 token groups per panel tile call
  // (bench_matmul_cputime 5 avx2, 640 -> 2048, 4 interleaved rounds on a 2-vCPU AMD EPYC, AVX2 only,
  // GFLOP per CPU second, medians: 1 x 8 tile before 62.1; 2 x 2 66.4, 2 x 4 72.1, 4 x 1 62.9, 4 x 2 75.2).
  constexpr int R = 4, G = 2;
  const auto i = static_cast<size_t>(GgmlType::kQ8_0);
  t.vec_dot[i] = dot_chain<Chain::kQ8_0, BlockQ8_0>;
  t.tile[i] = TileKernel{};
  t.tile_wide[i] = TileKernel{};
  t.tile_narrow[i] = TileKernel{narrow_chain<false, Chain::kQ8_0, BlockQ8_0>, 4, 1};
  t.panel[i] = PanelKernel{panel_in_groups<panel_q8_0_pairs<R, G>, panel_q8_0_pairs<R, 1>, G>, R,
                           PanelLayout::kPairs16, G};
}

}  // namespace kvtier::cpu
