// AVX-512 (+VNNI) dot products for f32 and f16, and q4_K and q6_K (the same bits as their AVX2
// vec_dot). q4_0, q4_1, q5_0 and q5_1 take legacy_chain.h's kernels (set by matmul_avx512.cpp's
// fill_avx512_tiles), q8_0 keeps the AVX2 table's (the same chain); the other K-quants keep their
// AVX2 kernels (their per-sub-block scales need 16-bit multiplies; decode is memory-bound, so the
// wider path gains little).
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
  // q8_0 keeps the AVX2 table's chain (legacy_chain.h), whose single float chain per output the
  // several-token passes over the layers' copies can run per token (matmul_lanes_avx512_tokens.cpp);
  // this file's earlier 16-lane q8_0 dot kept 16 partial chains per output.
  set(GgmlType::kQ4_K, dot_q4_k);
  set(GgmlType::kQ6_K, dot_q6_k);
}

}  // namespace kvtier::cpu
