// AVX-512 (+VNNI) matmul tiles (kernels.h TileFn) for the types vec_dot_avx512.cpp overrides: f32,
// f16 and the legacy quants q4_0, q4_1, q5_0, q8_0. R weight rows x T tokens per pass; per output the
// arithmetic is exactly vec_dot_avx512.cpp's (same 16-lane integer sums by VPDPBUSD, same per-lane
// scale products, same FMA chains and reductions), so every output is bit-identical to vec_dot.
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

// Row-side data of one block pair, prepared once per chunk of pairs and reused by every token group.
struct PairRow {
  __m512i q;      // the two blocks' quants (pair_quants)
  __m512i start;  // VPDPBUSD start value: -128 * each lane's 4 weights (signed types), else 0
  __m512 dw;      // weight scales, 8 lanes per block
};

// As vec_dot_avx512's dot_legacy per (row, token): two blocks per 16-lane FMA step, an odd last block
// on 256 bits, a min chain (q4_1; here the 4 tokens of a group side by side in one 4-lane vector per
// row: the same products added in the same order). R rows x 4 NG tokens: the rows' block pairs are unpacked
// once per chunk of kPairs pairs into `prep`, then each group of 4 tokens runs over the chunk with
// its R x 4 accumulators in registers (carried across chunks in `acc`), so each output still adds
// its block pairs in order.
template <Legacy kType, typename Block, int R, int NG>
void tile_legacy(const uint8_t* w, int64_t row_bytes, const uint8_t* act, int64_t act_bytes, int64_t k,
                 float* y, int64_t ldy) {
  constexpr int T = 4 * NG;
  constexpr int64_t kPairs = 8;
  constexpr bool kSigned = kType != Legacy::kQ4_1;
  constexpr bool kMin = kType == Legacy::kQ4_1;
  const Block* x[R];
  const ActQ8_32* a[T];
  for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const Block*>(w + r * row_bytes);
  for (int t = 0; t < T; ++t) a[t] = reinterpret_cast<const ActQ8_32*>(act + t * act_bytes);
  const int64_t nb = k / kQK;
  static_assert(R <= 4, "the min chains hold R rows x 4 tokens in the 16 lanes of one vector");
  __m512 acc[NG][R][4];  // [group][row][token in group]
  __m512 acc_min[NG];    // [group] lane 4 r + t: q4_1's min chain of row r, token t of the group
  for (int g = 0; g < NG; ++g) {
    acc_min[g] = _mm512_setzero_ps();
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < 4; ++t) acc[g][r][t] = _mm512_setzero_ps();
  }
  PairRow prep[kPairs][R];
  __m512 mins16[kPairs][2];  // q4_1: [pair][block of the pair] lane 4 r + t: row r's min (each row 4 times)
  const __m512i row_of_lane = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  for (int64_t b0 = 0; b0 + 2 <= nb; b0 += 2 * kPairs) {
    const int64_t n_pairs = std::min(kPairs, (nb - b0) / 2);
    for (int64_t p = 0; p < n_pairs; ++p) {
      const int64_t b = b0 + 2 * p;
      for (int r = 0; r < R; ++r) {
        PairRow& pr = prep[p][r];
        pr.q = pair_quants<kType>(x[r][b], x[r][b + 1]);
        pr.start = _mm512_setzero_si512();  // [16] i32
        if constexpr (kSigned) {
          // Signed weights: the activations biased to unsigned (a + 128 in [1, 255]) and the bias
          // taken out through the start value. VPDPBUSD does not saturate, so each lane is exactly
          // vec_dot's sum of the same 4 products.
          pr.start = _mm512_sub_epi32(pr.start, _mm512_dpbusd_epi32(pr.start, _mm512_set1_epi8(-128), pr.q));
        }
        pr.dw = join_ps(f16(x[r][b].d), f16(x[r][b + 1].d));
      }
      if constexpr (kMin) {
        for (int h = 0; h < 2; ++h) {
          alignas(16) float m[4] = {0, 0, 0, 0};  // [row] the block's min
          for (int r = 0; r < R; ++r) m[r] = f16(x[r][b + h].m);
          mins16[p][h] = _mm512_permutexvar_ps(row_of_lane, _mm512_castps128_ps512(_mm_load_ps(m)));
        }
      }
    }
    for (int g = 0; g < NG; ++g) {
      const ActQ8_32* const* ag = a + 4 * g;
      __m512 ac[R][4];
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < 4; ++t) ac[r][t] = acc[g][r][t];
      __m512 am = acc_min[g];
      for (int64_t p = 0; p < n_pairs; ++p) {
        const int64_t b = b0 + 2 * p;
        __m512i av[4];
        __m512 da[4];
        for (int t = 0; t < 4; ++t) {
          av[t] = join(load256(ag[t][b].qs), load256(ag[t][b + 1].qs));
          if constexpr (kSigned) av[t] = _mm512_xor_si512(av[t], _mm512_set1_epi8(-128));
          da[t] = join_ps(ag[t][b].d, ag[t][b + 1].d);
        }
        // q4_1: the min chains of all R x 4 outputs of the group in one vector, block b then block
        // b + 1: lane 4 r + t adds (m_r * da_t) * asum_t, the products of vec_dot in its order.
        if constexpr (kMin) {
          for (int h = 0; h < 2; ++h) {
            __m128i ds[4];  // [token] raw (da, asum) words of block b + h
            for (int t = 0; t < 4; ++t)
              ds[t] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(&ag[t][b + h]));
            const __m128i lo = _mm_unpacklo_epi32(ds[0], ds[1]);  // da0 da1 asum0 asum1
            const __m128i hi = _mm_unpacklo_epi32(ds[2], ds[3]);
            const __m512 da16 = _mm512_broadcast_f32x4(_mm_castsi128_ps(_mm_unpacklo_epi64(lo, hi)));
            const __m512 asum16 = _mm512_broadcast_f32x4(_mm_cvtepi32_ps(_mm_unpackhi_epi64(lo, hi)));
            am = _mm512_add_ps(am, _mm512_mul_ps(_mm512_mul_ps(mins16[p][h], da16), asum16));
          }
        }
        for (int r = 0; r < R; ++r) {
          const PairRow& pr = prep[p][r];
          for (int t = 0; t < 4; ++t) {
            const __m512i isum = kSigned ? _mm512_dpbusd_epi32(pr.start, av[t], pr.q)
                                         : _mm512_dpbusd_epi32(pr.start, pr.q, av[t]);
            ac[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(pr.dw, da[t]), ac[r][t]);
          }
        }
      }
      for (int r = 0; r < R; ++r)
        for (int t = 0; t < 4; ++t) acc[g][r][t] = ac[r][t];
      acc_min[g] = am;
    }
  }
  const int64_t b = nb & ~int64_t{1};  // odd block count: the last block on 256 bits
  for (int g = 0; g < NG; ++g) {
    alignas(64) float mins16_out[16];  // lane 4 r + t
    _mm512_store_ps(mins16_out, acc_min[g]);
    for (int r = 0; r < R; ++r) {
      const float* mins = mins16_out + 4 * r;
      for (int t = 0; t < 4; ++t) {
        const ActQ8_32* at = a[4 * g + t];
        float s = reduce_add(acc[g][r][t]);
        float am = mins[t];
        if (b < nb) {
          const __m256i q = block_quants<kType>(x[r][b]);
          const __m256i av = load256(at[b].qs);
          const __m256i isum =
              kSigned ? dot_s8s8_256(q, av) : _mm256_dpbusd_epi32(_mm256_setzero_si256(), q, av);
          s += hsum_f32(_mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(f16(x[r][b].d) * at[b].d)));
          if constexpr (kMin) am += (f16(x[r][b].m) * at[b].d) * static_cast<float>(at[b].sum);
        }
        y[(4 * g + t) * ldy + r] = s + am;
      }
    }
  }
}

}  // namespace

void fill_avx512_tiles(KernelTable& t) {
  auto set = [&t](GgmlType type, TileKernel k, TileKernel wide = {}) {
    t.tile[static_cast<size_t>(type)] = k;
    t.tile_wide[static_cast<size_t>(type)] = wide;
  };
  set(GgmlType::kF32, TileKernel{tile_float<false, 4, 4>, 4, 4});
  set(GgmlType::kF16, TileKernel{tile_float<true, 4, 4>, 4, 4});
  // q8_0: 4 rows x 4 tokens, and 4 rows x 16 tokens (row unpacking shared by 16 tokens). The 4- and
  // 5-bit legacy quants take legacy_chain.h's panel tiles with VPDPBUSD (vec_dot and one-token tiles
  // with them, replacing vec_dot_avx512.cpp's for those types).
  set(GgmlType::kQ8_0, TileKernel{tile_legacy<Legacy::kQ8_0, BlockQ8_0, 4, 1>, 4, 4},
      TileKernel{tile_legacy<Legacy::kQ8_0, BlockQ8_0, 4, 4>, 4, 16});
  fill_legacy_chain<true>(t);
  fill_avx512_ktiles(t);
}

}  // namespace kvtier::cpu
