// AVX2 matmul tiles (kernels.h TileFn) for q4_K, q5_K and q6_K: R weight rows x T tokens per pass;
// each 32-element chunk of weights is unpacked once per pass and each activation chunk loaded once.
// Per output the integer super-block sums and the float expression are exactly vec_dot_avx2.cpp's
// (integer sums are exact, so only the float expression's order matters, and it is the same), so
// every output is bit-identical to the single-token vec_dot.
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

}  // namespace

void fill_avx2_ktiles(KernelTable& t) {
  // No one-token tiles: measured slower than vec_dot for these types (bench_matmul_cputime, one
  // token against [16384, 2048]: q4_K 15.5 -> 13.1, q6_K 14.6 -> 12.1 GB per CPU second).
  auto set = [&t](GgmlType type, TileKernel k) { t.tile[static_cast<size_t>(type)] = k; };
  set(GgmlType::kQ4_K, TileKernel{tile_q45_k<false, BlockQ4_K, 1, 8>, 1, 8});
  set(GgmlType::kQ5_K, TileKernel{tile_q45_k<true, BlockQ5_K, 1, 8>, 1, 8});
  set(GgmlType::kQ6_K, TileKernel{tile_q6_k<1, 8>, 1, 8});
}

}  // namespace kvtier::cpu
