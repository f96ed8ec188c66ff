// AVX2 matmul tiles (kernels.h TileFn) for the float types (q4_0, q4_1, q5_0, q5_1 and q8_0 are in
// matmul_avx2_panel.cpp, the K-quants in matmul_avx2_kquants.cpp): R weight rows x T tokens
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

}  // namespace

void fill_avx2_tiles(KernelTable& t) {
  // The K-quants (matmul_avx2_kquants.cpp) take 1 row x 8 tokens or panels: the 8 accumulators and
  // the unpacking constants fit AVX2's 16 registers, where 2 x 4 spilled the accumulators to the stack
  // (objdump), so every block's FMA waited on a store-to-load round trip.
  // q4_0, q4_1, q5_0, q5_1 and q8_0 have panel tiles (matmul_avx2_panel.cpp, with their vec_dot).
  auto set = [&t](GgmlType type, TileKernel k) {
    t.tile[static_cast<size_t>(type)] = k;
    t.tile_narrow[static_cast<size_t>(type)] = TileKernel{};
  };
  set(GgmlType::kF32, TileKernel{tile_float<Float::kF32, 2, 4>, 2, 4});
  set(GgmlType::kF16, TileKernel{tile_float<Float::kF16, 2, 4>, 2, 4});
  set(GgmlType::kBF16, TileKernel{tile_float<Float::kBF16, 2, 4>, 2, 4});
  fill_avx2_ktiles(t);
  fill_avx2_panel_kernels(t);  // replaces q4_0, q4_1, q5_0, q5_1 and q8_0 (vec_dot and tiles)
}

}  // namespace kvtier::cpu
