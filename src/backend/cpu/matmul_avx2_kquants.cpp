// AVX2 matmul tiles (kernels.h TileFn) for q4_K, q5_K and q6_K: R weight rows x T tokens per pass;
// each 32-element chunk of weights is unpacked once per pass and each activation chunk loaded once.
// Per output the integer super-block sums and the float expression are exactly vec_dot_avx2.cpp's
// (integer sums are exact, so only the float expression's order matters, and it is the same), so
// every output is bit-identical to the single-token vec_dot.
#include "backend/cpu/act_panel.h"
#include "backend/cpu/block_unpack.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_avx2.h"

namespace kvtier::cpu {
namespace {

using namespace avx2;

template <bool kFifthBit, typename Block, int R, int T>
void tile_q45_k(const uint8_t* w, int64_t row_bytes, const uint8_t* act, int64_t act_bytes, int64_t k,
                float* y, int64_t ldy) {
  const Block* x[R];
  const ActQ8_K* a[T];
  for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const Block*>(w + r * row_bytes);
  for (int t = 0; t < T; ++t) a[t] = reinterpret_cast<const ActQ8_K*>(act + t * act_bytes);
  float s[R][T] = {};
  const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  for (int64_t b = 0; b < k / kQKK; ++b) {
    uint8_t sc[R][8], mn[R][8];
    __m256i scv[R][8];  // [row][sub-block] scale as 16 x i16
    for (int r = 0; r < R; ++r) {
      unpack_scales_mins_k4(x[r][b].scales, sc[r], mn[r]);
      for (int j = 0; j < 8; ++j) scv[r][j] = _mm256_set1_epi16(sc[r][j]);
    }
    __m256i acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      __m256i lo[R], hi[R];
      for (int r = 0; r < R; ++r) {
        const __m256i q = load256(x[r][b].qs + 32 * c);
        lo[r] = _mm256_and_si256(q, m4);
        hi[r] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if constexpr (kFifthBit) {
          const __m256i qh = load256(x[r][b].qh);
          lo[r] = _mm256_or_si256(lo[r],
                                  _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
          hi[r] = _mm256_or_si256(
              hi[r], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
        }
      }
      for (int t = 0; t < T; ++t) {
        const __m256i alo = load256(a[t][b].qs + 64 * c);
        const __m256i ahi = load256(a[t][b].qs + 64 * c + 32);
        for (int r = 0; r < R; ++r) {
          const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo[r], alo), scv[r][2 * c]);
          const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi[r], ahi), scv[r][2 * c + 1]);
          acc[r][t] = _mm256_add_epi32(acc[r][t], _mm256_add_epi32(plo, phi));
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      const float d = f16(x[r][b].d), dmin = f16(x[r][b].dmin);
      for (int t = 0; t < T; ++t) {
        const int msum = min_sum_k4(mn[r], a[t][b].bsums);
        s[r][t] += (d * a[t][b].d) * static_cast<float>(hsum_i32(acc[r][t])) -
                   (dmin * a[t][b].d) * static_cast<float>(msum);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ldy + r] = s[r][t];
}

template <int R, int T>
void tile_q6_k(const uint8_t* w, int64_t row_bytes, const uint8_t* act, int64_t act_bytes, int64_t k,
               float* y, int64_t ldy) {
  const BlockQ6_K* x[R];
  const ActQ8_K* a[T];
  for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const BlockQ6_K*>(w + r * row_bytes);
  for (int t = 0; t < T; ++t) a[t] = reinterpret_cast<const ActQ8_K*>(act + t * act_bytes);
  float s[R][T] = {};
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
  for (int64_t b = 0; b < k / kQKK; ++b) {
    __m256i acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      for (int f = 0; f < 4; ++f) {
        const int j = 8 * h + 2 * f;  // first of the chunk's two 16-element sub-blocks
        __m256i qu[R], scv[R];
        for (int r = 0; r < R; ++r) {
          const BlockQ6_K& blk = x[r][b];
          const __m256i l = load256(blk.ql + 64 * h + 32 * (f & 1));
          const __m256i low = _mm256_and_si256(f < 2 ? l : _mm256_srli_epi16(l, 4), m4);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(load256(blk.qh + 32 * h), 2 * f), m2);
          qu[r] = _mm256_or_si256(low, _mm256_slli_epi16(hi, 4));  // q + 32, in [0, 63]
          scv[r] = _mm256_inserti128_si256(
              _mm256_castsi128_si256(_mm_set1_epi16(static_cast<int16_t>(blk.scales[j]))),
              _mm_set1_epi16(static_cast<int16_t>(blk.scales[j + 1])), 1);
        }
        for (int t = 0; t < T; ++t) {
          const __m256i av = load256(a[t][b].qs + 16 * j);
          for (int r = 0; r < R; ++r)
            acc[r][t] =
                _mm256_add_epi32(acc[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(qu[r], av), scv[r]));
        }
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256i sc16 = q6k_scales16(x[r][b].scales);
      const float d = f16(x[r][b].d);
      for (int t = 0; t < T; ++t) {
        const __m256i total = q6k_offset_out(acc[r][t], sc16, a[t][b].bsums);  // the +32 offset out
        s[r][t] += (d * a[t][b].d) * static_cast<float>(hsum_i32(total));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ldy + r] = s[r][t];
}

// q4_K / q5_K, R rows x G token groups of 8 over PanelQ8_Ks (lane t: token t): the same integers and the same
// float expression as tile_q45_k, per lane. Per row and 32-element sub-block j, the unpacked quants
// go to a buffer and each 4-byte group is broadcast against the panel's vector of that group; the
// int16 pair sums of 8 groups stay below 2^15 for 4-bit quants (8 x 2 x 15 x 127), of 4 groups for
// 5-bit ones, before the sub-block scale widens them. bench_matmul_cputime avx2 (as in
// matmul_avx2_panel.cpp): q4_K 1024 -> 640 78 -> 104 GFLOP per CPU second against tile_q45_k 1 x 8.
template <bool kFifthBit, typename Block, int R, int G>
void panel_q45_k(const uint8_t* w, int64_t row_bytes, const uint8_t* panel, int64_t group_bytes, int64_t k,
                 float* y, int64_t ldy) {
  const Block* x[R];
  for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const Block*>(w + r * row_bytes);
  const PanelQ8_K* p[G];
  for (int g = 0; g < G; ++g) p[g] = reinterpret_cast<const PanelQ8_K*>(panel + g * group_bytes);
  const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  __m256 s[R][G];  // [row][group] lane t: token t's sum
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) s[r][g] = _mm256_setzero_ps();
  alignas(32) uint8_t u[R][kQKK];  // [row] the super-block's quants, unpacked in element order
  for (int64_t b = 0; b < k / kQKK; ++b) {
    uint8_t sc[R][8], mn[R][8];
    for (int r = 0; r < R; ++r) {
      const Block& blk = x[r][b];
      unpack_scales_mins_k4(blk.scales, sc[r], mn[r]);
      for (int c = 0; c < 4; ++c) {
        const __m256i q = load256(blk.qs + 32 * c);
        __m256i lo = _mm256_and_si256(q, m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
        if constexpr (kFifthBit) {
          const __m256i qh = load256(blk.qh);
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
          hi = _mm256_or_si256(hi,
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
        }
        _mm256_store_si256(reinterpret_cast<__m256i*>(u[r] + 64 * c), lo);
        _mm256_store_si256(reinterpret_cast<__m256i*>(u[r] + 64 * c + 32), hi);
      }
    }
    __m256i isum[R][G], msum[R][G];  // [row][group] lane t: the exact integer sums of tile_q45_k
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) isum[r][g] = msum[r][g] = _mm256_setzero_si256();
    for (int j = 0; j < kQKK / 32; ++j) {
      constexpr int kRun = kFifthBit ? 4 : 8;  // element groups summed in int16
      for (int e0 = 0; e0 < 8; e0 += kRun) {
        for (int r = 0; r < R; ++r) {
          __m256i s16[G];
          for (int g = 0; g < G; ++g) s16[g] = _mm256_setzero_si256();
          for (int e = e0; e < e0 + kRun; ++e) {
            const __m256i wb = _mm256_set1_epi32(static_cast<int>(load_u32(u[r] + 32 * j + 4 * e)));
            for (int g = 0; g < G; ++g)
              s16[g] = _mm256_add_epi16(s16[g], _mm256_maddubs_epi16(wb, load256(p[g][b].qs[8 * j + e])));
          }
          const __m256i scj = _mm256_set1_epi16(sc[r][j]);
          for (int g = 0; g < G; ++g)
            isum[r][g] = _mm256_add_epi32(isum[r][g], _mm256_madd_epi16(s16[g], scj));
        }
      }
      for (int r = 0; r < R; ++r) {
        const __m256i mnj = _mm256_set1_epi16(mn[r][j]);
        for (int g = 0; g < G; ++g)
          msum[r][g] = _mm256_add_epi32(msum[r][g], _mm256_madd_epi16(load256(p[g][b].bsums[j]), mnj));
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 dw = _mm256_set1_ps(f16(x[r][b].d)), dmin = _mm256_set1_ps(f16(x[r][b].dmin));
      for (int g = 0; g < G; ++g) {
        const __m256 da = _mm256_loadu_ps(p[g][b].d);
        const __m256 dd = _mm256_mul_ps(dw, da);
        const __m256 dm = _mm256_mul_ps(dmin, da);
        s[r][g] = _mm256_add_ps(s[r][g], _mm256_sub_ps(_mm256_mul_ps(dd, _mm256_cvtepi32_ps(isum[r][g])),
                                                       _mm256_mul_ps(dm, _mm256_cvtepi32_ps(msum[r][g]))));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) store_token_lanes(s[r][g], y + g * kPanelTokens * ldy, ldy, r);
}

// q6_K, R rows x G token groups of 8 over PanelQ8_Ks: the same integer total as tile_q6_k (sum_j
// sc_j * dot_j minus the +32 offset's 32 * sum_j sc_j * bsum_j) and the same float expression, per
// lane. Quants are q + 32 in [0, 63], so two groups' int16 pair sums stay below 2^15 (2 x 2 x 63 x
// 127) before the 16-element sub-block's signed scale widens them. Each row's super-block is
// unpacked once, and each 4-byte group broadcast once, for all G token groups: the unpacking was a
// fifth of the time with one group (bench_matmul_cputime 3 avx2, 80 -> 96 GFLOP per CPU second with it
// left out). q6_K 2048 -> 640, 3 interleaved rounds on a 2-vCPU AMD EPYC (AVX2 only), GFLOP per CPU
// second: R = 2, G = 1 (the previous tile) 77; R = 1 and G = 2 / 3 / 4: 104 / 108 / 116; R = 2, G = 2 93.
template <int R, int G>
void panel_q6_k_groups(const uint8_t* w, int64_t row_bytes, const uint8_t* panel, int64_t group_bytes,
                       int64_t k, float* y, int64_t ldy) {
  const BlockQ6_K* x[R];
  for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const BlockQ6_K*>(w + r * row_bytes);
  const PanelQ8_K* p[G];
  for (int g = 0; g < G; ++g) p[g] = reinterpret_cast<const PanelQ8_K*>(panel + g * group_bytes);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
  __m256 s[R][G];  // [row][group] lane t: token t's sum
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) s[r][g] = _mm256_setzero_ps();
  alignas(32) uint8_t u[R][kQKK];  // [row] the super-block's quants + 32, in element order
  for (int64_t b = 0; b < k / kQKK; ++b) {
    for (int r = 0; r < R; ++r) {
      const BlockQ6_K& blk = x[r][b];
      for (int h = 0; h < 2; ++h) {
        const __m256i l0 = load256(blk.ql + 64 * h), l1 = load256(blk.ql + 64 * h + 32);
        const __m256i qh = load256(blk.qh + 32 * h);
        const __m256i lows[4] = {_mm256_and_si256(l0, m4), _mm256_and_si256(l1, m4),
                                 _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                 _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4)};
        for (int f = 0; f < 4; ++f) {
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * f), m2);
          _mm256_store_si256(reinterpret_cast<__m256i*>(u[r] + 128 * h + 32 * f),
                             _mm256_or_si256(lows[f], _mm256_slli_epi16(hi, 4)));
        }
      }
    }
    __m256i isum[R][G], corr[R][G];  // [row][group] lane t: sum_j sc_j * dot_j, sum_j sc_j * bsum_j
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) isum[r][g] = corr[r][g] = _mm256_setzero_si256();
    for (int j = 0; j < kQKK / 16; ++j) {  // 16-element sub-blocks: element groups 4j .. 4j + 3
      for (int e0 = 4 * j; e0 < 4 * j + 4; e0 += 2) {
        for (int r = 0; r < R; ++r) {
          const __m256i w0 = _mm256_set1_epi32(static_cast<int>(load_u32(u[r] + 4 * e0)));
          const __m256i w1 = _mm256_set1_epi32(static_cast<int>(load_u32(u[r] + 4 * e0 + 4)));
          const __m256i sc = _mm256_set1_epi16(x[r][b].scales[j]);
          for (int g = 0; g < G; ++g) {
            const __m256i s16 = _mm256_add_epi16(_mm256_maddubs_epi16(w0, load256(p[g][b].qs[e0])),
                                                 _mm256_maddubs_epi16(w1, load256(p[g][b].qs[e0 + 1])));
            isum[r][g] = _mm256_add_epi32(isum[r][g], _mm256_madd_epi16(s16, sc));
          }
        }
      }
    }
    for (int j = 0; j < kQKK / 32; ++j) {  // the offset: bsums of sub-blocks 2j, 2j + 1 per token
      for (int r = 0; r < R; ++r) {
        const int pair = static_cast<uint16_t>(x[r][b].scales[2 * j]) |
                         (static_cast<int>(static_cast<uint16_t>(x[r][b].scales[2 * j + 1])) << 16);
        const __m256i sc2 = _mm256_set1_epi32(pair);
        for (int g = 0; g < G; ++g)
          corr[r][g] = _mm256_add_epi32(corr[r][g], _mm256_madd_epi16(load256(p[g][b].bsums[j]), sc2));
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 dw = _mm256_set1_ps(f16(x[r][b].d));
      for (int g = 0; g < G; ++g) {
        const __m256i total = _mm256_sub_epi32(isum[r][g], _mm256_slli_epi32(corr[r][g], 5));
        const __m256 dd = _mm256_mul_ps(dw, _mm256_loadu_ps(p[g][b].d));
        s[r][g] = _mm256_add_ps(s[r][g], _mm256_mul_ps(dd, _mm256_cvtepi32_ps(total)));
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) store_token_lanes(s[r][g], y + g * kPanelTokens * ldy, ldy, r);
}

}  // namespace

static_assert(kPanelTokens == 8, "the panel tiles keep one token per lane of a 256-bit vector");

void fill_avx2_ktiles(KernelTable& t) {
  // No one-token tiles: measured slower than vec_dot for these types (bench_matmul_cputime, one
  // token against [16384, 2048]: q4_K 15.5 -> 13.1, q6_K 14.6 -> 12.1 GB per CPU second).
  auto set = [&t](GgmlType type, TileKernel k) { t.tile[static_cast<size_t>(type)] = k; };
  set(GgmlType::kQ4_K, TileKernel{tile_q45_k<false, BlockQ4_K, 1, 8>, 1, 8});
  set(GgmlType::kQ5_K, TileKernel{tile_q45_k<true, BlockQ5_K, 1, 8>, 1, 8});
  set(GgmlType::kQ6_K, TileKernel{tile_q6_k<1, 8>, 1, 8});
  // q4_K / q5_K: 1 row x 2 token groups (bench_matmul_cputime 3 avx2, q4_K 1024 -> 640, 4-7 interleaved
  // rounds on a busy 2-vCPU AMD EPYC, AVX2 only, medians in GFLOP per CPU second: 2 rows x 1 group
  // 71 as before, 89 in this loop order; 1 x 2 100; 1 x 4 92).
  constexpr int KR = 1, KG = 2;  // rows, token groups
  t.panel[static_cast<size_t>(GgmlType::kQ4_K)] = PanelKernel{
      panel_in_groups<panel_q45_k<false, BlockQ4_K, KR, KG>, panel_q45_k<false, BlockQ4_K, KR, 1>, KG>, KR,
      PanelLayout::kGroups, KG};
  t.panel[static_cast<size_t>(GgmlType::kQ5_K)] = PanelKernel{
      panel_in_groups<panel_q45_k<true, BlockQ5_K, KR, KG>, panel_q45_k<true, BlockQ5_K, KR, 1>, KG>, KR,
      PanelLayout::kGroups, KG};
  t.panel[static_cast<size_t>(GgmlType::kQ6_K)] = PanelKernel{
      panel_in_groups<panel_q6_k_groups<1, 4>, panel_q6_k_groups<1, 1>, 4>, 1, PanelLayout::kGroups, 4};
}

}  // namespace kvtier::cpu
