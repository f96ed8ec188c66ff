// Prefill over the rows-in-lanes layout on AVX-512: T tokens per pass over one group of kLaneRows
// rows (lanes_tokens_avx512.h). The one-token kernels (matmul_lanes_avx512.cpp) load and unpack
// every weight vector once per token; here each weight vector is loaded and unpacked once and feeds
// T VPDPBUSDs, one per token, whose signed operand is that token's 4 activation bytes broadcast.
// Per token the arithmetic is the one-token kernel's: the same exact integers per block (integer
// sums taken in another order are the same integers) and the same float operations in the same
// order, so every output keeps the bits of the table's vec_dot.
#include <immintrin.h>

#include <algorithm>

#include "backend/cpu/blocks.h"
#include "backend/cpu/lanes_simd_avx512.h"
#include "backend/cpu/lanes_tokens_avx512.h"
#include "backend/cpu/simd_avx2.h"
#include "backend/cpu/weight_lanes.h"
#include "core/ggml_type.h"

namespace kvtier::cpu::lanes_avx512 {
namespace {

using lanes::rows_mask;
using lanes::widen16;

// Tokens per pass (at most kLanesPassTokens): as many as the 32 vector registers hold with each
// token's accumulators (2 per token for q4_0 / q5_0 / q8_0, 3 with q4_1 / q5_1's mins and the
// K-quants' sub-block dots) beside the weight vectors and constants; more spill to the stack.
// q4_1 / q5_1 at 8 (24 accumulators) do not spill and measured 1.05-1.08x their 6-token passes
// (docs/benchmarks.md, stop 49); q4_K at 8 measured no faster than at 6.
constexpr int kPassLegacy = 8, kPassMins = 8, kPassQ8_0 = 8, kPassQ4K = 6, kPassQ6K = 8;

// 16 rows' i16 pairs (lo, hi) as 16 x i32 lanes, from two vectors of 16 x i32 values in i16 range.
inline __m512i i16_pairs(__m512i lo, __m512i hi) {
  return _mm512_or_si512(_mm512_and_si512(lo, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(hi, 16));
}

// acc + VPDPBUSD(u, the 4 signed bytes at p broadcast), the broadcast taken by the instruction's own
// memory operand ({1to16}), which GCC does not fold _mm512_set1_epi32 of a loaded value into.
inline __m512i dpbusd_bcast(__m512i acc, __m512i u, const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

// acc + VPDPWSSD(x, the i16 pair at p broadcast), likewise.
inline __m512i dpwssd_bcast(__m512i acc, __m512i x, const int16_t* p) {
  asm("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(x), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

// -(a.sum << kShift) in every lane: the block's start value for an offset of 1 << kShift on the
// unsigned weights. Taken in the vector registers from a broadcast load: written as
// _mm512_set1_epi32 of the scalar, GCC computes it in general registers and, short of them with 8
// tokens' pointers live, passes most tokens' values through the stack to a broadcast load, a store
// forwarded to a vector load per token and block. q8_0's pass ran 1.11-1.18x faster this way (about
// 50 -> 60 % of the int8 peak); q4_0 / q5_0's chunk pass measured the same either way and keeps the
// scalar form (docs/benchmarks.md, stop 50).
template <int kShift>
inline __m512i neg_shifted_sum(const ActQ8_32& a) {
  __m512i sum;
  asm("vpbroadcastd %1, %0" : "=v"(sum) : "m"(a.sum));
  return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, kShift));
}

// q4_0, q4_1, q5_0, q5_1 (lanes_legacy): per token and block the exact integer
// isum = dot(u, a) - (offset << sum(a)), then s = fma(f32(isum), d * da, s), and for q4_1 / q5_1
// m = fma(m_w, dsum(a), m) (blocks.h); the result s (+ m). For q4_0 / q5_0 a chunk of kLegacyChunk
// blocks is unpacked once (nibbles split, fifth bits added, scales widened) into LegacyChunk for
// every pass of a tile of 16 passes, whose float chains wait in memory between chunks (each row's
// and token's chains still run over the blocks in order).
constexpr int kLegacyChunk = 24;

struct LegacyChunk {
  alignas(64) uint8_t q[kLegacyChunk][8][64];  // [block][g][row * 4 + e] u: group g's 4 elements, g < 4 the
                                               // low nibbles' (elements 4g + e), else the high (16 + ...)
  alignas(64) float sc[kLegacyChunk][16];      // [block][row] f32(d)
};

// One legacy block's float step for a token: s = fma(f32(isum), d * da, s), and where kMins
// m = fma(m_w, dsum(a), m). ws, wm: the 16 rows' f32(d), f32(m).
template <bool kMins>
inline void legacy_float_step(__m512i isum, __m512 ws, __m512 wm, const ActQ8_32& a, __m512& s, __m512& m) {
  const __m512 da = _mm512_set1_ps(a.d);
  s = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(ws, da), s);
  if constexpr (kMins) m = _mm512_fmadd_ps(wm, _mm512_set1_ps(a.dsum), m);
}

template <bool kHighBits>
void legacy_unpack(const uint8_t* w, const LegacyRegions& at, int64_t b0, int n, LegacyChunk& c) {
  for (int cb = 0; cb < n; ++cb) {
    const int64_t b = b0 + cb;
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      __m512i lo, hi;
      lanes::legacy_unpack_vector<kHighBits>(w, at, b, j, lo, hi);
      _mm512_store_si512(c.q[cb][j], lo);
      _mm512_store_si512(c.q[cb][4 + j], hi);
    }
    _mm512_store_ps(c.sc[cb], _mm512_cvtph_ps(avx2::load256(w + at.scales + b * 32)));
  }
}

// T tokens' chains s_acc ([T][16] f32) continued over the chunk's n blocks, whose activations are
// blocks b0 .. b0 + n - 1 of each token's row (q4_0 / q5_0: no mins chain).
template <int T, int kOffsetShift>
void legacy_chunk_pass(const LegacyChunk& c, int n, int64_t b0, const uint8_t* act, int64_t act_bytes,
                       float* s_acc) {
  const ActQ8_32* a[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) a[t] = reinterpret_cast<const ActQ8_32*>(act + t * act_bytes) + b0;
  __m512 s[T], no_mins = _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) s[t] = _mm512_load_ps(s_acc + 16 * t);
  for (int cb = 0; cb < n; ++cb) {
    __m512i acc[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t)
      acc[t] =
          kOffsetShift != 0 ? _mm512_set1_epi32(-(a[t][cb].sum << kOffsetShift)) : _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      const __m512i q = _mm512_load_si512(c.q[cb][g]);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) acc[t] = dpbusd_bcast(acc[t], q, a[t][cb].qs + 4 * g);
    }
    const __m512 ws = _mm512_load_ps(c.sc[cb]);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) legacy_float_step<false>(acc[t], ws, ws, a[t][cb], s[t], no_mins);
  }
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) _mm512_store_ps(s_acc + 16 * t, s[t]);
}

// q4_1 / q5_1: T tokens over the whole row in registers, each block unpacked once per pass. Their
// second (mins) chain leaves fewer registers and more float work per block, and here the unpacked
// chunk's extra loads and the chains' trips through memory cost more than the unpacking they save
// (docs/benchmarks.md, stop 48).
template <int T, bool kHighBits, bool kMins, int kOffsetShift>
void legacy_pass(const uint8_t* w, const LegacyRegions& at, int64_t nb, const uint8_t* act, int64_t act_bytes,
                 float* y, int64_t ldy, __mmask16 keep) {
  const ActQ8_32* a[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) a[t] = reinterpret_cast<const ActQ8_32*>(act + t * act_bytes);
  __m512 s[T], m[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) s[t] = m[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512i c[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t)
      c[t] = kOffsetShift != 0 ? _mm512_set1_epi32(-(a[t][b].sum << kOffsetShift)) : _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      __m512i lo, hi;
      lanes::legacy_unpack_vector<kHighBits>(w, at, b, j, lo, hi);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) c[t] = dpbusd_bcast(c[t], lo, a[t][b].qs + 4 * j);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) c[t] = dpbusd_bcast(c[t], hi, a[t][b].qs + 4 * (j + 4));
    }
    const __m512 ws = _mm512_cvtph_ps(avx2::load256(w + at.scales + b * 32));
    const __m512 wm = kMins ? _mm512_cvtph_ps(avx2::load256(w + at.mins + b * 32)) : _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) legacy_float_step<kMins>(c[t], ws, wm, a[t][b], s[t], m[t]);
  }
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) {
    if constexpr (kMins) s[t] = _mm512_add_ps(s[t], m[t]);
    _mm512_mask_storeu_ps(y + t * ldy, keep, s[t]);
  }
}

template <GgmlType kType, bool kHighBits, bool kMins, int kOffsetShift>
int64_t legacy_tokens(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                      float* y, int64_t ldy, int rows) {
  constexpr int T = kMins ? kPassMins : kPassLegacy;
  constexpr int64_t kTile = 16 * T;  // tokens per tile: whole passes
  const int64_t nb = k / kQK, n_done = n_tokens / T * T;
  const LegacyRegions at = legacy_regions(kType, nb);
  const __mmask16 keep = rows_mask(rows);
  if constexpr (kMins) {
    for (int64_t t = 0; t < n_done; t += T)
      legacy_pass<T, kHighBits, kMins, kOffsetShift>(w, at, nb, act + t * act_bytes, act_bytes, y + t * ldy,
                                                     ldy, keep);
    return n_done;
  }
  LegacyChunk chunk;
  alignas(64) float s_acc[kTile][16];  // [token of the tile][row] the float chains
  for (int64_t t0 = 0; t0 < n_done; t0 += kTile) {
    const int64_t nt = std::min<int64_t>(kTile, n_done - t0);
    for (int64_t t = 0; t < nt; ++t) _mm512_store_ps(s_acc[t], _mm512_setzero_ps());
    for (int64_t b0 = 0; b0 < nb; b0 += kLegacyChunk) {
      const int n = static_cast<int>(std::min<int64_t>(kLegacyChunk, nb - b0));
      legacy_unpack<kHighBits>(w, at, b0, n, chunk);
      for (int64_t t = 0; t < nt; t += T)
        legacy_chunk_pass<T, kOffsetShift>(chunk, n, b0, act + (t0 + t) * act_bytes, act_bytes, s_acc[t]);
    }
    for (int64_t t = 0; t < nt; ++t)
      _mm512_mask_storeu_ps(y + (t0 + t) * ldy, keep, _mm512_load_ps(s_acc[t]));
  }
  return n_done;
}

// q8_0 (lanes_q8_0): per token and block the exact integer isum = dot(q + 128, a) - 128 * sum(a),
// then s = fma(f32(isum), d * da, s). The layout holds the quants as VPDPBUSD takes them, so a pass
// runs over the whole group with its chains in registers, each weight vector loaded once for T tokens.
template <int T>
void q8_0_pass(const uint8_t* w, int64_t nb, const uint8_t* act, int64_t act_bytes, float* y, int64_t ldy,
               __mmask16 keep) {
  const ActQ8_32* a[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) a[t] = reinterpret_cast<const ActQ8_32*>(act + t * act_bytes);
  __m512 s[T], no_mins = _mm512_setzero_ps();
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) s[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* q = w + q8_0_quants_at(b);  // [8][16][4] u8
    __m512i c[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) c[t] = neg_shifted_sum<7>(a[t][b]);
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      const __m512i v = _mm512_load_si512(q + 64 * g);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) c[t] = dpbusd_bcast(c[t], v, a[t][b].qs + 4 * g);
    }
    const __m512 ws = _mm512_cvtph_ps(avx2::load256(w + q8_0_scales_at(b, nb)));
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) legacy_float_step<false>(c[t], ws, ws, a[t][b], s[t], no_mins);
  }
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * ldy, keep, s[t]);
}

// q4_K (lanes_q4_k): per token and super-block the exact integers isum = sum_j sc_j * dot(q_j, a_j)
// and msum = sum_j mn_j * (bsums[2j] + bsums[2j + 1]) (here by VPDPWSSD of (mn_j, mn_j) against the
// bsums pair), then s += (d * da) * f32(isum) - (dmin * da) * f32(msum).
template <int T>
void q4_k_pass(const uint8_t* w, int64_t nb, const uint8_t* act, int64_t act_bytes, float* y, int64_t ldy,
               __mmask16 keep) {
  const ActQ8_K* a[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) a[t] = reinterpret_cast<const ActQ8_K*>(act + t * act_bytes);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 s[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) s[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* sb = w + b * kQ4KLanesBytes;
    __m512i isum[T], dot[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) isum[t] = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {  // sub-block 2c + half: the low nibbles, then the high
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) dot[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) {
          const __m512i v = _mm512_load_si512(sb + (8 * c + g) * 64);
          const __m512i q =
              half == 0 ? _mm512_and_si512(v, low4) : _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
#pragma GCC unroll 8
          for (int t = 0; t < T; ++t)
            dot[t] = dpbusd_bcast(dot[t], q, a[t][b].qs + 64 * c + 32 * half + 4 * g);
        }
        const __m512i sc = widen16(sb + 2048 + 16 * (2 * c + half));
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(dot[t], sc));
      }
    }
    __m512i* msum = dot;
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) msum[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const __m512i mn = widen16(sb + 2176 + 16 * j);
      const __m512i pair = i16_pairs(mn, mn);
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) msum[t] = dpwssd_bcast(msum[t], pair, a[t][b].bsums + 2 * j);
    }
    const __m512 wd = _mm512_cvtph_ps(avx2::load256(sb + 2304));
    const __m512 wdm = _mm512_cvtph_ps(avx2::load256(sb + 2336));
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512 da = _mm512_set1_ps(a[t][b].d);
      const __m512 dd = _mm512_mul_ps(wd, da), dm = _mm512_mul_ps(wdm, da);
      s[t] = _mm512_add_ps(s[t], _mm512_sub_ps(_mm512_mul_ps(dd, _mm512_cvtepi32_ps(isum[t])),
                                               _mm512_mul_ps(dm, _mm512_cvtepi32_ps(msum[t]))));
    }
  }
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) _mm512_mask_storeu_ps(y + t * ldy, keep, s[t]);
}

// q6_K (lanes_q6_k): per token and super-block the exact integer
// total = sum_j sc_j * (dot(q_j + 32, a_j) - 32 * bsums[j]), each sub-block's dot started at
// -32 * bsums[j] as in the one-token kernel, then s += (d * da) * f32(total), super-block by
// super-block. Unpacking a q6_K vector (two planes, a shift per bit pair) costs about as much as
// the T products it feeds, so a chunk of kQ6KChunk super-blocks is unpacked once into Q6KChunk for
// every pass of a tile of up to kQ6KTile tokens, whose accumulators wait in memory between chunks
// (each row's and token's float chain still runs over the super-blocks in order); the tile's
// starting values -32 * bsums[j] are widened once per chunk into Q6KStarts, so each sub-block's dot
// starts from a broadcast load.
constexpr int kQ6KChunk = 2;
constexpr int kQ6KTile = 128;

struct Q6KChunk {
  alignas(64) uint8_t q[kQ6KChunk][16][4][64];  // [super-block][sub-block j][group i][row * 4 + e] q + 32
  alignas(64) int32_t sc[kQ6KChunk][16][16];    // [super-block][j][row] the sub-block scale
  alignas(64) float d[kQ6KChunk][16];           // [super-block][row] f32(d)
};

struct Q6KStarts {
  alignas(64) int32_t v[kQ6KTile][kQ6KChunk][16];  // [token of the tile][super-block][j] -32 * bsums[j]
};

// Super-blocks [b0, b0 + n) of the group w into c.
void q6k_unpack(const uint8_t* w, int64_t b0, int n, Q6KChunk& c) {
  for (int cb = 0; cb < n; ++cb) {
    const uint8_t* sb = w + (b0 + cb) * kQ6KLanesBytes;
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) _mm512_store_si512(c.q[cb][j][i], lanes::q6k_lanes_vector(sb, j, i));
      _mm512_store_si512(c.sc[cb][j], widen16<true>(sb + 3072 + 16 * j));
    }
    _mm512_store_ps(c.d[cb], _mm512_cvtph_ps(avx2::load256(sb + 3328)));
  }
}

// The starting values of nt tokens (act, act_bytes apart) for super-blocks [b0, b0 + n).
void q6k_starts(const uint8_t* act, int64_t act_bytes, int64_t nt, int64_t b0, int n, Q6KStarts& st) {
  for (int64_t t = 0; t < nt; ++t) {
    const ActQ8_K* a = reinterpret_cast<const ActQ8_K*>(act + t * act_bytes) + b0;
    for (int cb = 0; cb < n; ++cb) {
      const __m512i bs =
          _mm512_cvtepi16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[cb].bsums)));
      _mm512_store_si512(st.v[t][cb], _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(bs, 5)));
    }
  }
}

// T tokens' accumulators acc[0..T) ([T][16] f32) continued over the chunk's n super-blocks, whose
// activations are super-blocks b0 .. b0 + n - 1 of each token's row; starts: the T tokens' rows of
// Q6KStarts.
template <int T>
void q6k_chunk_pass(const Q6KChunk& c, int n, int64_t b0, const uint8_t* act, int64_t act_bytes,
                    const int32_t (*starts)[kQ6KChunk][16], float* acc) {
  const ActQ8_K* a[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) a[t] = reinterpret_cast<const ActQ8_K*>(act + t * act_bytes) + b0;
  __m512 s[T];
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) s[t] = _mm512_load_ps(acc + 16 * t);
  for (int cb = 0; cb < n; ++cb) {
    // The sub-blocks below go two per step: unrolled further, the tokens' chains spill to the stack.
    __m512i total[T], dot[T];
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) total[t] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int j = 0; j < 16; ++j) {
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) dot[t] = _mm512_set1_epi32(starts[t][cb][j]);
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        const __m512i q = _mm512_load_si512(c.q[cb][j][i]);
#pragma GCC unroll 16
        for (int t = 0; t < T; ++t) dot[t] = dpbusd_bcast(dot[t], q, a[t][cb].qs + 16 * j + 4 * i);
      }
      const __m512i sc = _mm512_load_si512(c.sc[cb][j]);
#pragma GCC unroll 16
      for (int t = 0; t < T; ++t) total[t] = _mm512_add_epi32(total[t], _mm512_mullo_epi32(dot[t], sc));
    }
    const __m512 wd = _mm512_load_ps(c.d[cb]);
#pragma GCC unroll 16
    for (int t = 0; t < T; ++t) {
      const __m512 dd = _mm512_mul_ps(wd, _mm512_set1_ps(a[t][cb].d));
      s[t] = _mm512_add_ps(s[t], _mm512_mul_ps(dd, _mm512_cvtepi32_ps(total[t])));
    }
  }
#pragma GCC unroll 16
  for (int t = 0; t < T; ++t) _mm512_store_ps(acc + 16 * t, s[t]);
}

// Whole passes of T tokens by kPass over a group of blocks of kBlock elements each.
template <int T, int64_t kBlock,
          void (*kPass)(const uint8_t*, int64_t, const uint8_t*, int64_t, float*, int64_t, __mmask16)>
int64_t whole_passes(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                     float* y, int64_t ldy, int rows) {
  const int64_t nb = k / kBlock;
  const __mmask16 keep = rows_mask(rows);
  int64_t t = 0;
  for (; t + T <= n_tokens; t += T) kPass(w, nb, act + t * act_bytes, act_bytes, y + t * ldy, ldy, keep);
  return t;
}

}  // namespace

int64_t q4_0_tokens(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                    float* y, int64_t ldy, int rows) {
  return legacy_tokens<GgmlType::kQ4_0, false, false, 3>(w, act, act_bytes, n_tokens, k, y, ldy, rows);
}
int64_t q4_1_tokens(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                    float* y, int64_t ldy, int rows) {
  return legacy_tokens<GgmlType::kQ4_1, false, true, 0>(w, act, act_bytes, n_tokens, k, y, ldy, rows);
}
int64_t q5_0_tokens(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                    float* y, int64_t ldy, int rows) {
  return legacy_tokens<GgmlType::kQ5_0, true, false, 4>(w, act, act_bytes, n_tokens, k, y, ldy, rows);
}
int64_t q5_1_tokens(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                    float* y, int64_t ldy, int rows) {
  return legacy_tokens<GgmlType::kQ5_1, true, true, 0>(w, act, act_bytes, n_tokens, k, y, ldy, rows);
}
int64_t q8_0_tokens(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                    float* y, int64_t ldy, int rows) {
  return whole_passes<kPassQ8_0, kQK, q8_0_pass<kPassQ8_0>>(w, act, act_bytes, n_tokens, k, y, ldy, rows);
}
int64_t q4_k_tokens(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                    float* y, int64_t ldy, int rows) {
  return whole_passes<kPassQ4K, kQKK, q4_k_pass<kPassQ4K>>(w, act, act_bytes, n_tokens, k, y, ldy, rows);
}
int64_t q6_k_tokens(const uint8_t* w, const uint8_t* act, int64_t act_bytes, int64_t n_tokens, int64_t k,
                    float* y, int64_t ldy, int rows) {
  constexpr int T = kPassQ6K;
  static_assert(kQ6KTile % T == 0, "a tile is whole passes");
  const int64_t nb = k / kQKK, n_done = n_tokens / T * T;
  const __mmask16 keep = rows_mask(rows);
  Q6KChunk chunk;
  Q6KStarts starts;
  alignas(64) float acc[kQ6KTile][16];  // [token of the tile][row] the float chains
  for (int64_t t0 = 0; t0 < n_done; t0 += kQ6KTile) {
    const int64_t nt = std::min<int64_t>(kQ6KTile, n_done - t0);
    for (int64_t t = 0; t < nt; ++t) _mm512_store_ps(acc[t], _mm512_setzero_ps());
    for (int64_t b0 = 0; b0 < nb; b0 += kQ6KChunk) {
      const int n = static_cast<int>(std::min<int64_t>(kQ6KChunk, nb - b0));
      q6k_unpack(w, b0, n, chunk);
      q6k_starts(act + t0 * act_bytes, act_bytes, nt, b0, n, starts);
      for (int64_t t = 0; t < nt; t += T)
        q6k_chunk_pass<T>(chunk, n, b0, act + (t0 + t) * act_bytes, act_bytes, starts.v + t, acc[t]);
    }
    for (int64_t t = 0; t < nt; ++t) _mm512_mask_storeu_ps(y + (t0 + t) * ldy, keep, _mm512_load_ps(acc[t]));
  }
  return n_done;
}

}  // namespace kvtier::cpu::lanes_avx512
