// AVX-512 (+VNNI) matmul tiles (kernels.h TileFn) for q4_K and q6_K: 4 weight rows x 4 tokens per
// pass, 64 elements per 512-bit step. The AVX-512 table keeps the AVX2 vec_dot of these types, and
// the tiles are bit-identical to it: per super-block both compute the same exact integers (the
// scaled quant x activation sum, the min / offset sum) and combine them with the same float
// expression in the same order. Only how the integers are formed differs:
//   - VPMADDUBSW (u8 quants x s8 activations -> i16 pairs) then VPDPWSSD (i16 pairs x i16 sub-block
//     scales, accumulated in i32 lanes): 2 instructions per (row, token, 64 elements);
//   - the 16 accumulators are summed by a transpose-and-add tree into one vector whose lane 4 t + r
//     is output (row r, token t), so the per-super-block float expression runs 16 outputs at a time
//     (element-wise IEEE operations in the scalar order give the scalar's bits).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/block_unpack.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_avx512.h"

namespace kvtier::cpu {
namespace {

constexpr int R = 4;  // weight rows per tile
constexpr int T = 4;  // tokens per tile

// v[0..3]: lane sums per 128-bit block -> block L of the result = [sum of v[0]'s block L, v[1]'s,
// v[2]'s, v[3]'s]. Exact (integer adds).
[[gnu::always_inline]] inline __m512i transpose_add4(__m512i v0, __m512i v1, __m512i v2, __m512i v3) {
  const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(v0, v1), _mm512_unpackhi_epi32(v0, v1));
  const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(v2, v3), _mm512_unpackhi_epi32(v2, v3));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
}

// x[t]: block L holds 4 partial sums for rows 0..3 -> block t of the result = sum over L of x[t]'s
// blocks, i.e. lane 4 t + r is the full sum for (row r, token t).
[[gnu::always_inline]] inline __m512i sum_blocks4(__m512i x0, __m512i x1, __m512i x2, __m512i x3) {
  const __m512i w01 = _mm512_add_epi32(_mm512_shuffle_i32x4(x0, x1, _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i32x4(x0, x1, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512i w23 = _mm512_add_epi32(_mm512_shuffle_i32x4(x2, x3, _MM_SHUFFLE(2, 0, 2, 0)),
                                       _mm512_shuffle_i32x4(x2, x3, _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(w01, w23, _MM_SHUFFLE(2, 0, 2, 0)),
                          _mm512_shuffle_i32x4(w01, w23, _MM_SHUFFLE(3, 1, 3, 1)));
}

// acc[r][t] (16 lanes each) -> lane 4 t + r = sum of acc[r][t]'s lanes.
[[gnu::always_inline]] inline __m512i reduce_tile(const __m512i (&acc)[R][T]) {
  __m512i x[T];
  for (int t = 0; t < T; ++t) x[t] = transpose_add4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]);
  return sum_blocks4(x[0], x[1], x[2], x[3]);
}

// Four 128-bit values -> one 512-bit value, v0 in block 0.
__m512i join4(__m128i v0, __m128i v1, __m128i v2, __m128i v3) {
  __m512i v = _mm512_broadcast_i32x4(v0);
  v = _mm512_mask_broadcast_i32x4(v, 0x00F0, v1);
  v = _mm512_mask_broadcast_i32x4(v, 0x0F00, v2);
  return _mm512_mask_broadcast_i32x4(v, 0xF000, v3);
}

// Lane 4 t + r = f16 value h[r] (rows' scales).
__m512 row_scales(uint16_t h0, uint16_t h1, uint16_t h2, uint16_t h3) {
  const __m128i h = _mm_setr_epi16(static_cast<int16_t>(h0), static_cast<int16_t>(h1),
                                   static_cast<int16_t>(h2), static_cast<int16_t>(h3), 0, 0, 0, 0);
  return _mm512_broadcast_f32x4(_mm_cvtph_ps(h));
}

// Lane 4 t + r = d[t] (tokens' activation scales).
__m512 token_scales(float d0, float d1, float d2, float d3) {
  const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  return _mm512_permutexvar_ps(idx, _mm512_zextps128_ps512(_mm_setr_ps(d0, d1, d2, d3)));
}

// Writes lane 4 t + r of s to y[t * ldy + r].
void store_tile(__m512 s, float* y, int64_t ldy) {
  alignas(64) float v[R * T];
  _mm512_store_ps(v, s);
  for (int t = 0; t < T; ++t) std::memcpy(y + t * ldy, v + R * t, R * sizeof(float));
}

// q4_K, as vec_dot_avx2.cpp's dot_q45_k per (row, token):
//   s += (d * da) * float(sum_j sc_j * dot_j) - (dmin * da) * float(sum_j mn_j * (bsum_2j + bsum_2j+1))
void tile_q4_k(const uint8_t* w, int64_t row_bytes, const uint8_t* act, int64_t act_bytes, int64_t k,
               float* y, int64_t ldy) {
  const BlockQ4_K* x[R];
  const ActQ8_K* a[T];
  for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const BlockQ4_K*>(w + r * row_bytes);
  for (int t = 0; t < T; ++t) a[t] = reinterpret_cast<const ActQ8_K*>(act + t * act_bytes);
  __m512i scale_idx[4];  // chunk c: words 0..15 take scale 2c (low nibbles), 16..31 scale 2c + 1
  for (int c = 0; c < 4; ++c) scale_idx[c] = avx512::q4k_scale_idx(c);
  __m512 s = _mm512_setzero_ps();  // lane 4 t + r
  for (int64_t b = 0; b < k / kQKK; ++b) {
    __m512i sc16[R];  // [row] 8 sub-block scales as i16 (words 0..7)
    __m512i mn16[R];  // [row] 8 mins as i16, the same in each 128-bit block
    for (int r = 0; r < R; ++r) {
      uint8_t sc[8], mn[8];
      unpack_scales_mins_k4(x[r][b].scales, sc, mn);
      uint64_t sc64, mn64;
      std::memcpy(&sc64, sc, 8);
      std::memcpy(&mn64, mn, 8);
      sc16[r] = _mm512_zextsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(sc64))));
      mn16[r] = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(mn64))));
    }
    __m512i acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      __m512i q[R], scv[R];
      for (int r = 0; r < R; ++r) {
        q[r] = avx512::q4k_quants(x[r][b].qs + 32 * c);
        scv[r] = _mm512_permutexvar_epi16(scale_idx[c], sc16[r]);
      }
      for (int t = 0; t < T; ++t) {
        const __m512i av = _mm512_loadu_si512(a[t][b].qs + 64 * c);
        for (int r = 0; r < R; ++r)
          acc[r][t] = _mm512_dpwssd_epi32(acc[r][t], _mm512_maddubs_epi16(q[r], av), scv[r]);
      }
    }
    const __m512i isum = reduce_tile(acc);
    // Min term: block t of pairs = the 8 sums bsums[2j] + bsums[2j + 1] of token t.
    __m128i pr[T];
    for (int t = 0; t < T; ++t) {
      const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a[t][b].bsums));
      const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a[t][b].bsums + 8));
      pr[t] = _mm_hadd_epi16(lo, hi);
    }
    const __m512i pairs = join4(pr[0], pr[1], pr[2], pr[3]);
    const __m512i msum = transpose_add4(_mm512_madd_epi16(mn16[0], pairs), _mm512_madd_epi16(mn16[1], pairs),
                                        _mm512_madd_epi16(mn16[2], pairs), _mm512_madd_epi16(mn16[3], pairs));
    const __m512 dw = row_scales(x[0][b].d, x[1][b].d, x[2][b].d, x[3][b].d);
    const __m512 dmin = row_scales(x[0][b].dmin, x[1][b].dmin, x[2][b].dmin, x[3][b].dmin);
    const __m512 da = token_scales(a[0][b].d, a[1][b].d, a[2][b].d, a[3][b].d);
    const __m512 term = _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(isum)),
                                      _mm512_mul_ps(_mm512_mul_ps(dmin, da), _mm512_cvtepi32_ps(msum)));
    s = _mm512_add_ps(s, term);
  }
  store_tile(s, y, ldy);
}

// q6_K, as vec_dot_avx2.cpp's dot_q6_k per (row, token):
//   s += (d * da) * float(sum_j sc_j * sum_i (q_i + 32) a_i - 32 * sum_j sc_j * bsum_j)
void tile_q6_k(const uint8_t* w, int64_t row_bytes, const uint8_t* act, int64_t act_bytes, int64_t k,
               float* y, int64_t ldy) {
  const BlockQ6_K* x[R];
  const ActQ8_K* a[T];
  for (int r = 0; r < R; ++r) x[r] = reinterpret_cast<const BlockQ6_K*>(w + r * row_bytes);
  for (int t = 0; t < T; ++t) a[t] = reinterpret_cast<const ActQ8_K*>(act + t * act_bytes);
  __m512i scale_idx[4];  // step hg = 2h + g: sub-block 4 hg + i in 128-bit block i
  for (int hg = 0; hg < 4; ++hg) scale_idx[hg] = avx512::q6k_scale_idx(hg);
  __m512 s = _mm512_setzero_ps();  // lane 4 t + r
  for (int64_t b = 0; b < k / kQKK; ++b) {
    __m512i sc16[R];  // [row] the 16 scales as i16 (words 0..15), then again (words 16..31)
    for (int r = 0; r < R; ++r) {
      const __m256i v =
          _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[r][b].scales)));
      sc16[r] = _mm512_broadcast_i64x4(v);
    }
    __m512i acc[R][T];
    for (int r = 0; r < R; ++r)
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      for (int g = 0; g < 2; ++g) {
        __m512i q[R], scv[R];
        for (int r = 0; r < R; ++r) {
          q[r] = avx512::q6k_quants(x[r][b].ql, x[r][b].qh, h, g);  // q + 32, in [0, 63]
          scv[r] = _mm512_permutexvar_epi16(scale_idx[2 * h + g], sc16[r]);
        }
        for (int t = 0; t < T; ++t) {
          const __m512i av = _mm512_loadu_si512(a[t][b].qs + 128 * h + 64 * g);
          for (int r = 0; r < R; ++r)
            acc[r][t] = _mm512_dpwssd_epi32(acc[r][t], _mm512_maddubs_epi16(q[r], av), scv[r]);
        }
      }
    }
    const __m512i isum = reduce_tile(acc);
    // Offset term sum_j sc_j * bsum_j: tokens (0, 1) and (2, 3) share a register, 256 bits each.
    const __m512i b01 = avx512::join(avx2::load256(a[0][b].bsums), avx2::load256(a[1][b].bsums));
    const __m512i b23 = avx512::join(avx2::load256(a[2][b].bsums), avx2::load256(a[3][b].bsums));
    __m512i part[R];  // block t: 4 partial sums of row r, token t
    for (int r = 0; r < R; ++r) {
      const __m512i p01 = _mm512_madd_epi16(sc16[r], b01);  // blocks 0, 1: token 0; 2, 3: token 1
      const __m512i p23 = _mm512_madd_epi16(sc16[r], b23);
      part[r] = _mm512_add_epi32(_mm512_shuffle_i32x4(p01, p23, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_i32x4(p01, p23, _MM_SHUFFLE(3, 1, 3, 1)));
    }
    const __m512i corr = transpose_add4(part[0], part[1], part[2], part[3]);
    const __m512i total = _mm512_sub_epi32(isum, _mm512_slli_epi32(corr, 5));
    const __m512 dw = row_scales(x[0][b].d, x[1][b].d, x[2][b].d, x[3][b].d);
    const __m512 da = token_scales(a[0][b].d, a[1][b].d, a[2][b].d, a[3][b].d);
    s = _mm512_add_ps(s, _mm512_mul_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(total)));
  }
  store_tile(s, y, ldy);
}

}  // namespace

void fill_avx512_ktiles(KernelTable& t) {
  // These tiles replace the AVX2 panel tiles of the same types (matmul prefers panels where set).
  auto set = [&t](GgmlType type, TileKernel k) {
    t.tile[static_cast<size_t>(type)] = k;
    t.panel[static_cast<size_t>(type)] = PanelKernel{};
  };
  set(GgmlType::kQ4_K, TileKernel{tile_q4_k, R, T});
  set(GgmlType::kQ6_K, TileKernel{tile_q6_k, R, T});
}

}  // namespace kvtier::cpu
