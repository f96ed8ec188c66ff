// AVX2 matmul tiles (kernels.h TileFn) for the float types and q8_0, and q8_0's panel tile (q4_0, q4_1, q5_0
// and q5_1 are in matmul_avx2_panel.cpp, the K-quants in matmul_avx2_kquants.cpp): R weight rows x T tokens
// per pass, each weight block unpacked once per pass and each activation block loaded once per pass. Per
// output the arithmetic is exactly vec_dot_avx2.cpp's (same integer lanes, same scale products, same FMA
// chains in the same order, same reductions), so every output is bit-identical to the single-token vec_dot.
#include <algorithm>

#include "backend/cpu/act_panel.h"
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

// As vec_dot_avx2's dot_q8_0, per (row, token): 8-lane FMA chain over blocks, isum * (dw * da).
template <int R, int T>
void tile_q8_0(const uint8_t* w, int64_t row_bytes, const uint8_t* act, int64_t act_bytes, int64_t k,
               float* y, int64_t ldy) {
  const BlockQ8_0* x[R];
  const ActQ8_32* a[T];
  for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const BlockQ8_0*>(w + r * row_bytes);
  for (int t = 0; t < T; ++t) a[t] = reinterpret_cast<const ActQ8_32*>(act + t * act_bytes);
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < k / kQK; ++b) {
    if constexpr (T == 1) prefetch_ahead(w, b, R * static_cast<int64_t>(sizeof(BlockQ8_0)));
    for (int r = 0; r < R; ++r) {
      const BlockQ8_0& blk = x[r][b];
      const __m256i q = load256(blk.qs);  // signed quants
      const __m256i uq = _mm256_sign_epi8(q, q);
      const __m256 dw = _mm256_set1_ps(f16(blk.d));  // the weight scale in 8 lanes
      for (int t = 0; t < T; ++t) {
        const __m256i av = load256(a[t][b].qs);
        const __m256i isum = dot_u8s8(uq, _mm256_sign_epi8(av, q));
        const __m256 scale = _mm256_mul_ps(dw, _mm256_broadcast_ss(&a[t][b].d));  // dw * da
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int t = 0; t < T; ++t) y[t * ldy + r] = hsum_f32(acc[r][t]);
}

// q8_0, 1 row x 8 tokens over a PanelQ8_32Rows: tile_q8_0's arithmetic per token (the same 8-lane
// integer dots, dw * da, FMA chain over blocks and hsum), but the 8 scale products of a block come
// from one vector multiply with the panel's 8 scales instead of 8 broadcast-and-multiplies. They are
// written for a run of blocks ahead of the dots, so each token's product is broadcast from memory
// (the compiler would otherwise extract it from a register by shuffles).
void panel_q8_0(const uint8_t* w, int64_t /*row_bytes*/, const uint8_t* panel, int64_t /*group_bytes*/,
                int /*groups: 1*/, int64_t k, float* y, int64_t ldy) {
  const auto* x = reinterpret_cast<const BlockQ8_0*>(w);
  const auto* p = reinterpret_cast<const PanelQ8_32Rows*>(panel);
  constexpr int64_t kRun = 16;                  // blocks per run
  alignas(32) float scale[kRun][kPanelTokens];  // [block of the run][token] dw * da
  // [token] vec_dot's 8 lane chains (named, not an array: GCC kept an array in memory here)
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  const int64_t nb = k / kQK;
  for (int64_t b0 = 0; b0 < nb; b0 += kRun) {
    const int64_t n = std::min(kRun, nb - b0);
    for (int64_t i = 0; i < n; ++i) {
      const __m256 dw = _mm256_set1_ps(f16(x[b0 + i].d));
      _mm256_store_ps(scale[i], _mm256_mul_ps(dw, _mm256_loadu_ps(p[b0 + i].d)));
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = b0 + i;
      const __m256i q = load256(x[b].qs);  // signed quants
      const __m256i uq = _mm256_sign_epi8(q, q);
      auto step = [&](__m256 acc, int t) {
        const __m256i isum = dot_u8s8(uq, _mm256_sign_epi8(load256(p[b].qs[t]), q));
        return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_broadcast_ss(&scale[i][t]), acc);
      };
      a0 = step(a0, 0);
      a1 = step(a1, 1);
      a2 = step(a2, 2);
      a3 = step(a3, 3);
      a4 = step(a4, 4);
      a5 = step(a5, 5);
      a6 = step(a6, 6);
      a7 = step(a7, 7);
    }
  }
  const __m256 acc[kPanelTokens] = {a0, a1, a2, a3, a4, a5, a6, a7};
  for (int t = 0; t < kPanelTokens; ++t) y[t * ldy] = hsum_f32(acc[t]);
}

}  // namespace

void fill_avx2_tiles(KernelTable& t) {
  // q8_0 and the K-quants (matmul_avx2_kquants.cpp) take 1 row x 8 tokens: the 8
  // accumulators and the unpacking constants fit AVX2's 16 registers, where 2 x 4 spilled the
  // accumulators to the stack (objdump), so every block's FMA waited on a store-to-load round trip.
  // bench_matmul_cputime avx2, medians of 3-5 interleaved rounds on a 2-vCPU AMD EPYC (Zen 4):
  // q5_0 59.1 -> 65.1, q8_0 67.3 -> 73.4, q4_K 74.7 -> 77.8, q6_K 82.5 -> 88.5 GFLOP per CPU second
  // (q5_0 measured when it still took this file's legacy tile).
  // q4_0, q4_1, q5_0 and q5_1 have panel tiles instead (matmul_avx2_panel.cpp, with their vec_dot).
  // q8_0 keeps its tiles for fewer than 8 tokens and takes panel_q8_0 for groups of 8 tokens:
  // bench_matmul_cputime 3 avx2, 640 -> 2048, 3 interleaved rounds on a 2-vCPU AMD EPYC (AVX2 only):
  // 63.3 -> 75.5 GFLOP per CPU second against tile_q8_0 1 x 8.
  auto set = [&t](GgmlType type, TileKernel k, TileKernel narrow = {}) {
    t.tile[static_cast<size_t>(type)] = k;
    t.tile_narrow[static_cast<size_t>(type)] = narrow;
  };
  set(GgmlType::kF32, TileKernel{tile_float<Float::kF32, 2, 4>, 2, 4});
  set(GgmlType::kF16, TileKernel{tile_float<Float::kF16, 2, 4>, 2, 4});
  set(GgmlType::kBF16, TileKernel{tile_float<Float::kBF16, 2, 4>, 2, 4});
  set(GgmlType::kQ8_0, TileKernel{tile_q8_0<1, 8>, 1, 8}, TileKernel{tile_q8_0<4, 1>, 4, 1});
  t.panel[static_cast<size_t>(GgmlType::kQ8_0)] = PanelKernel{panel_q8_0, 1, PanelLayout::kRows};
  fill_avx2_ktiles(t);
  fill_avx2_panel_kernels(t);  // replaces q4_0, q4_1, q5_0, q5_1 (vec_dot and tiles)
}

}  // namespace kvtier::cpu
