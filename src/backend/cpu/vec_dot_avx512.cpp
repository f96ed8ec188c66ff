// AVX-512 (+VNNI) dot products for f32, f16 and q8_0 (two 32-element blocks per 512-bit register,
// integer sums by VPDPBUSD), and q4_K and q6_K (the same bits as their AVX2 vec_dot). q4_0, q4_1,
// q5_0 and q5_1 take legacy_chain.h's kernels (set by matmul_avx512.cpp's fill_avx512_tiles); the
// other K-quants keep their AVX2 kernels (their per-sub-block scales need 16-bit multiplies; decode
// is memory-bound, so the wider path gains little).
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/block_unpack.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_avx512.h"

namespace kvtier::cpu {
namespace {

using namespace avx2;
using namespace avx512;

template <typename T>
const T* as(const uint8_t* p) {
  return reinterpret_cast<const T*>(p);
}

// Float weights: one 16-lane FMA chain over k (then the reduction and a scalar tail), so a matmul
// tile reads its weight and activation rows front to back, each cache line used whole, with R x T
// chains in flight (4 interleaved chains per output made the tiles stream every 4th line).
template <bool kHalf>
float dot_float(const uint8_t* w8, const uint8_t* a8, int64_t k) {
  const float* a = as<float>(a8);
  __m512 acc = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) acc = _mm512_fmadd_ps(load_w16<kHalf>(w8, i), _mm512_loadu_ps(a + i), acc);
  float s = reduce_add(acc);
  for (; i < k; ++i) s += w_scalar<kHalf>(w8, i) * a[i];
  return s;
}

// q8_0 for R weight rows (row_bytes apart) and one activation row: per row, two blocks per 16-lane
// FMA step, an odd last block on 256 bits. R = 1 is the vec_dot; R = 4 the one-token tile (each
// row's arithmetic is the same, so the bits are; the rows' chains overlap and share the activation
// loads).
template <int R>
void dot_q8_0_rows(const uint8_t* w8, int64_t row_bytes, const uint8_t* a8, int64_t k, float* y,
                   int64_t ldy) {
  const BlockQ8_0* x[R];
  for (int r = 0; r < R; ++r) x[r] = as<BlockQ8_0>(w8 + r * row_bytes);
  const ActQ8_32* a = as<ActQ8_32>(a8);
  const int64_t nb = k / kQK;
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  // Scale products as vectors, the same IEEE products as the scalar expression f16(d) * da: lanes
  // [0, 1] = [d0 * da0, d1 * da1]; the FMA scale spreads lane 0 and lane 1 over 8 lanes each.
  const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    if constexpr (R > 1) avx2::prefetch_ahead(w8, b / 2, 2 * R * static_cast<int64_t>(sizeof(BlockQ8_0)));
    const __m512i av = join(load256(a[b].qs), load256(a[b + 1].qs));
    // [da0, asum0, da1, asum1] (raw bits of the two blocks' leading float and int32)
    const __m128i dsum = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(&a[b])),
                                            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(&a[b + 1])));
    const __m128 da = _mm_permute_ps(_mm_castsi128_ps(dsum), 0x08);  // [da0, da1, ., .]
    for (int r = 0; r < R; ++r) {
      // [16] i32: each lane the exact sum of its 4 products quant * activation
      const __m512i isum = dot_s8s8_512(q8_0_pair(x[r][b], x[r][b + 1]), av);
      // the f16 scales of the two blocks
      const __m128i wh = _mm_cvtsi32_si128(static_cast<int>(x[r][b].d | (uint32_t{x[r][b + 1].d} << 16)));
      const __m128 p = _mm_mul_ps(_mm_cvtph_ps(wh), da);
      const __m512 scale = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(p));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float s = reduce_add(acc[r]);
    if (b < nb) {  // odd block count: the last block on 256 bits
      const __m256i isum = dot_s8s8_256(load256(x[r][b].qs), load256(a[b].qs));
      s += hsum_f32(_mm256_mul_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(f16(x[r][b].d) * a[b].d)));
    }
    y[r * ldy] = s;
  }
}

float dot_q8_0(const uint8_t* w8, const uint8_t* a8, int64_t k) {
  float y;
  dot_q8_0_rows<1>(w8, 0, a8, k, &y, 0);
  return y;
}

// The one-token tile (kernels.h TileFn with tokens = 1): y[r] for r < 4.
void narrow_q8_0(const uint8_t* w, int64_t row_bytes, const uint8_t* act, int64_t /*act_bytes*/, int64_t k,
                 float* y, int64_t /*ldy*/) {
  dot_q8_0_rows<4>(w, row_bytes, act, k, y, 1);
}

// q4_K and q6_K, 64 elements per step (simd_avx512.h), per super-block the same exact integers and
// the same float expression as vec_dot_avx2.cpp's dot_q45_k / dot_q6_k, hence the same bits (and
// the AVX-512 K-quant tiles, built on the same integers, stay bit-identical to these).
float dot_q4_k(const uint8_t* w8, const uint8_t* a8, int64_t k) {
  const BlockQ4_K* x = as<BlockQ4_K>(w8);
  const ActQ8_K* a = as<ActQ8_K>(a8);
  float s = 0.0f;
  for (int64_t b = 0; b < k / kQKK; ++b) {
    uint8_t sc[8], mn[8];
    unpack_scales_mins_k4(x[b].scales, sc, mn);
    uint64_t sc64;
    std::memcpy(&sc64, sc, 8);
    const __m512i sc16 =
        _mm512_zextsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(sc64))));
    __m512i acc = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      const __m512i p =
          _mm512_maddubs_epi16(q4k_quants(x[b].qs + 32 * c), _mm512_loadu_si512(a[b].qs + 64 * c));
      acc = _mm512_dpwssd_epi32(acc, p, _mm512_permutexvar_epi16(q4k_scale_idx(c), sc16));
    }
    const int msum = min_sum_k4(mn, a[b].bsums);
    s += (f16(x[b].d) * a[b].d) * static_cast<float>(_mm512_reduce_add_epi32(acc)) -
         (f16(x[b].dmin) * a[b].d) * static_cast<float>(msum);
  }
  return s;
}

float dot_q6_k(const uint8_t* w8, const uint8_t* a8, int64_t k) {
  const BlockQ6_K* x = as<BlockQ6_K>(w8);
  const ActQ8_K* a = as<ActQ8_K>(a8);
  float s = 0.0f;
  for (int64_t b = 0; b < k / kQKK; ++b) {
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[b].scales)));
    const __m512i sc16 = _mm512_broadcast_i64x4(sc);
    __m512i acc = _mm512_setzero_si512();
    for (int hg = 0; hg < 4; ++hg) {
      const __m512i q = q6k_quants(x[b].ql, x[b].qh, hg / 2, hg % 2);
      const __m512i p = _mm512_maddubs_epi16(q, _mm512_loadu_si512(a[b].qs + 64 * hg));
      acc = _mm512_dpwssd_epi32(acc, p, _mm512_permutexvar_epi16(q6k_scale_idx(hg), sc16));
    }
    // The +32 offset: sum_j sc_j * bsum_j (exact in i32).
    const __m256i corr = _mm256_madd_epi16(sc, avx2::load256(a[b].bsums));
    const int total = _mm512_reduce_add_epi32(acc) - 32 * avx2::hsum_i32(corr);
    s += (f16(x[b].d) * a[b].d) * static_cast<float>(total);
  }
  return s;
}

}  // namespace

void fill_avx512_kernels(KernelTable& t) {
  // A new vec_dot invalidates the AVX2 tile of that type (different arithmetic): fill_avx512_tiles
  // sets the matching AVX-512 tiles.
  auto set = [&t](GgmlType type, VecDotFn fn) {
    t.vec_dot[static_cast<size_t>(type)] = fn;
    t.tile[static_cast<size_t>(type)] = TileKernel{};
    t.tile_wide[static_cast<size_t>(type)] = TileKernel{};
    t.tile_narrow[static_cast<size_t>(type)] = TileKernel{};
    t.panel[static_cast<size_t>(type)] = PanelKernel{};
    t.lanes[static_cast<size_t>(type)] = nullptr;
  };
  set(GgmlType::kF32, dot_float<false>);
  set(GgmlType::kF16, dot_float<true>);
  // q4_0, q4_1, q5_0 (and q5_1): legacy_chain.h's kernels, set by fill_avx512_tiles.
  set(GgmlType::kQ8_0, dot_q8_0);
  auto narrow = [&t](GgmlType type, TileFn fn) {
    t.tile_narrow[static_cast<size_t>(type)] = TileKernel{fn, 4, 1};
  };
  narrow(GgmlType::kQ8_0, narrow_q8_0);
  set(GgmlType::kQ4_K, dot_q4_k);
  set(GgmlType::kQ6_K, dot_q6_k);
}

}  // namespace kvtier::cpu
