// AVX2 matmul tiles (kernels.h TileFn) for the float types and the legacy quants: R weight rows x
// T tokens per pass, each weight block unpacked once per pass and each activation block loaded once
// per pass. Per output the arithmetic is exactly vec_dot_avx2.cpp's (same integer lanes, same scale
// products, same FMA chains in the same order, same reductions), so every output is bit-identical to
// the single-token vec_dot.
#include <algorithm>

#include "backend/cpu/block_unpack.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_avx2.h"

namespace kvtier::cpu {
namespace {

using namespace avx2;

constexpr int64_t kChunk = 1024;  // elements of k per pass of the float tiles

enum class Float { kF32, kF16, kBF16 };

template <Float kKind>
__m256 load_w8(const uint8_t* w, int64_t i) {
  if constexpr (kKind == Float::kF32) return _mm256_loadu_ps(reinterpret_cast<const float*>(w) + i);
  const __m128i h =
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(w) + i));
  if constexpr (kKind == Float::kBF16)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  return _mm256_cvtph_ps(h);
}

template <Float kKind>
float w_scalar(const uint8_t* w, int64_t i) {
  if constexpr (kKind == Float::kF32) return reinterpret_cast<const float*>(w)[i];
  const uint16_t h = reinterpret_cast<const uint16_t*>(w)[i];
  return kKind == Float::kBF16 ? unpack_bf16(h) : unpack_f16(h);
}

// vec_dot_avx2's float dot keeps 4 lane chains: chain c takes elements [i + 8c, i + 8c + 8) of every
// 32-element step, chain 0 also the 8-element tail steps; then hsum((c0 + c1) + (c2 + c3)) plus a
// scalar tail. The chains are independent, so the tile runs them one after the other (R x T
// accumulators live in registers per chain) and combines them the same way.
template <Float kKind, int R, int T>
void tile_float(const uint8_t* w, int64_t row_bytes, const uint8_t* act, int64_t act_bytes, int64_t k,
                float* y, int64_t ldy) {
  const int64_t main_end = k / 32 * 32;
  const int64_t vec_end = k / 8 * 8;
  __m256 part[4][R][T];  // [chain][row][token] lane sums, carried across k chunks
  for (int c = 0; c < 4; ++c)
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) part[c][r][t] = _mm256_setzero_ps();
  auto run_chain = [&](int c, int64_t begin, int64_t end, int64_t stride) {
    __m256 acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = part[c][r][t];
    for (int64_t i = begin; i < end; i += stride) {
      __m256 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = load_w8<kKind>(w + r * row_bytes, i);
      for (int t = 0; t < T; ++t) {
        const __m256 av = _mm256_loadu_ps(reinterpret_cast<const float*>(act + t * act_bytes) + i);
        for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], av, acc[r][t]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) part[c][r][t] = acc[r][t];
  };
  // k in chunks whose weights and activations stay in L1 while the 4 chains pass over them; each
  // chain still adds its steps in increasing i, as vec_dot does.
  for (int64_t k0 = 0; k0 < main_end; k0 += kChunk) {
    const int64_t k1 = std::min(main_end, k0 + kChunk);
    for (int c = 0; c < 4; ++c) run_chain(c, k0 + 8 * c, k1, 32);
  }
  run_chain(0, main_end, vec_end, 8);
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      const float* a = reinterpret_cast<const float*>(act + t * act_bytes);
      float s = hsum_f32(_mm256_add_ps(_mm256_add_ps(part[0][r][t], part[1][r][t]),
                                       _mm256_add_ps(part[2][r][t], part[3][r][t])));
      for (int64_t i = vec_end; i < k; ++i) s += w_scalar<kKind>(w + r * row_bytes, i) * a[i];
      y[t * ldy + r] = s;
    }
  }
}

enum class Legacy { kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ8_0 };

// As vec_dot_avx2's dot_legacy, per (row, token): 8-lane FMA chain over blocks, isum * (dw * da),
// plus for q4_1/q5_1 a min chain of (mw * da) * asum (lane 1 of a vector there; here lane t of one
// vector per row, the T tokens side by side: the same products added in the same order).
template <Legacy kType, typename Block, int R, int T>
void tile_legacy(const uint8_t* w, int64_t row_bytes, const uint8_t* act, int64_t act_bytes, int64_t k,
                 float* y, int64_t ldy) {
  constexpr bool kMin = kType == Legacy::kQ4_1 || kType == Legacy::kQ5_1;
  static_assert(!kMin || T <= 4, "the min chains hold one token per lane of a 4-lane vector");
  constexpr bool kSigned = !kMin;
  const Block* x[R];
  const ActQ8_32* a[T];
  for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const Block*>(w + r * row_bytes);
  for (int t = 0; t < T; ++t) a[t] = reinterpret_cast<const ActQ8_32*>(act + t * act_bytes);
  __m256 acc[R][T];
  __m128 acc_min[R];  // [row] lane t: token t's min chain
  for (int r = 0; r < R; ++r) {
    acc_min[r] = _mm_setzero_ps();
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < k / kQK; ++b) {
    if constexpr (T == 1) prefetch_ahead(w, b, R * static_cast<int64_t>(sizeof(Block)));
    __m128 da4 = _mm_setzero_ps(), asum4 = _mm_setzero_ps();  // q4_1 / q5_1: [token] da, asum
    if constexpr (kMin) {
      __m128i ds[4];  // [token] raw (da, asum) words
      for (int t = 0; t < 4; ++t)
        ds[t] = t < T ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(&a[t][b])) : _mm_setzero_si128();
      const __m128i lo = _mm_unpacklo_epi32(ds[0], ds[1]);  // da0 da1 asum0 asum1
      const __m128i hi = _mm_unpacklo_epi32(ds[2], ds[3]);  // da2 da3 asum2 asum3
      da4 = _mm_castsi128_ps(_mm_unpacklo_epi64(lo, hi));
      asum4 = _mm_cvtepi32_ps(_mm_unpackhi_epi64(lo, hi));
    }
    for (int r = 0; r < R; ++r) {
      const Block& blk = x[r][b];
      __m256i q;  // signed quants for q4_0/q5_0/q8_0, unsigned otherwise
      if constexpr (kType == Legacy::kQ8_0) {
        q = load256(blk.qs);
      } else {
        q = nibbles_32(blk.qs);
        if constexpr (kType == Legacy::kQ5_0 || kType == Legacy::kQ5_1)
          q = _mm256_or_si256(q, bits_to_0x10(blk.qh));
        if constexpr (kType == Legacy::kQ4_0) q = _mm256_sub_epi8(q, _mm256_set1_epi8(8));
        if constexpr (kType == Legacy::kQ5_0) q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
      }
      const __m256i uq = kSigned ? _mm256_sign_epi8(q, q) : q;
      __m256 dw;  // the weight scale in 8 lanes
      if constexpr (kMin) {
        const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(load_u32(&blk.d))));  // [dw, mw]
        dw = _mm256_broadcastss_ps(dm);
        const __m128 mw_da = _mm_mul_ps(_mm_permute_ps(dm, 0x55), da4);  // [token] mw * da
        acc_min[r] = _mm_add_ps(acc_min[r], _mm_mul_ps(mw_da, asum4));
      } else {
        dw = _mm256_set1_ps(f16(blk.d));
      }
      for (int t = 0; t < T; ++t) {
        const __m256i av = load256(a[t][b].qs);
        const __m256i isum = dot_u8s8(uq, kSigned ? _mm256_sign_epi8(av, q) : av);
        const __m256 scale = _mm256_mul_ps(dw, _mm256_broadcast_ss(&a[t][b].d));  // dw * da
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    float mins[4];
    _mm_storeu_ps(mins, acc_min[r]);
    for (int t = 0; t < T; ++t) y[t * ldy + r] = kMin ? hsum_f32(acc[r][t]) + mins[t] : hsum_f32(acc[r][t]);
  }
}

}  // namespace

void fill_avx2_tiles(KernelTable& t) {
  // Signed legacy quants and the K-quants (matmul_avx2_kquants.cpp) take 1 row x 8 tokens: the 8
  // accumulators and the unpacking constants fit AVX2's 16 registers, where 2 x 4 spilled the
  // accumulators to the stack (objdump), so every block's FMA waited on a store-to-load round trip.
  // bench_matmul_cputime avx2, medians of 3-5 interleaved rounds on a 2-vCPU AMD EPYC (Zen 4):
  // q5_0 59.1 -> 65.1, q8_0 67.3 -> 73.4, q4_K 74.7 -> 77.8, q6_K 82.5 -> 88.5 GFLOP per CPU second.
  // q4_0, q4_1, q5_0 and q5_1 have panel tiles instead (matmul_avx2_panel.cpp, with their vec_dot).
  auto set = [&t](GgmlType type, TileKernel k, TileKernel narrow = {}) {
    t.tile[static_cast<size_t>(type)] = k;
    t.tile_narrow[static_cast<size_t>(type)] = narrow;
  };
  set(GgmlType::kF32, TileKernel{tile_float<Float::kF32, 2, 4>, 2, 4});
  set(GgmlType::kF16, TileKernel{tile_float<Float::kF16, 2, 4>, 2, 4});
  set(GgmlType::kBF16, TileKernel{tile_float<Float::kBF16, 2, 4>, 2, 4});
  set(GgmlType::kQ8_0, TileKernel{tile_legacy<Legacy::kQ8_0, BlockQ8_0, 1, 8>, 1, 8},
      TileKernel{tile_legacy<Legacy::kQ8_0, BlockQ8_0, 4, 1>, 4, 1});
  fill_avx2_ktiles(t);
  fill_avx2_panel_kernels(t);  // replaces q4_0, q4_1, q5_0, q5_1 (vec_dot and tiles)
}

}  // namespace kvtier::cpu
