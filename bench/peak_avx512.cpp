// FMA throughput loop (16 f32 lanes).
#include <immintrin.h>

#include <cstdint>

namespace kvtier::bench {

float fma_loop_avx512(int64_t iters) {
  __m512 acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm512_set1_ps(static_cast<float>(j));
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    for (int j = 0; j < 12; ++j) acc[j] = _mm512_fmadd_ps(acc[j], a, b);
  }
  __m512 s = acc[0];
  for (int j = 1; j < 12; ++j) s = _mm512_add_ps(s, acc[j]);
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0];
}

}  // namespace kvtier::bench

namespace kvtier::bench {

// int8 dot throughput of the AVX-512 path (AVX512-VNNI): one vpdpbusd per 64 u8 x s8 products into 12
// independent i32 accumulators, each feeding its own next u8 operand.
int int8_loop_avx512(int64_t iters) {
  __m512i acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm512_set1_epi32(j + 1);
  const __m512i s = _mm512_set1_epi8(3);
  for (int64_t i = 0; i < iters; ++i) {
    for (int j = 0; j < 12; ++j) acc[j] = _mm512_dpbusd_epi32(acc[j], acc[j], s);
  }
  __m512i t = acc[0];
  for (int j = 1; j < 12; ++j) t = _mm512_add_epi32(t, acc[j]);
  int out[16];
  _mm512_storeu_si512(out, t);
  return out[0];
}

}  // namespace kvtier::bench

namespace kvtier::bench {

// Read-only sweep of `bytes` by 64-byte loads (one cache line each) into 2 independent accumulators,
// one front-to-back stream: what the AVX-512 one-token kernels' loads can reach. On an Intel Xeon
// guest it read 1.4x faster than the 32-byte sweep (bytes a multiple of 128).
uint64_t read_loop_avx512(const uint8_t* p, int64_t bytes) {
  __m512i a0 = _mm512_setzero_si512(), a1 = _mm512_setzero_si512();
  for (int64_t i = 0; i < bytes; i += 128) {
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + i + 64));
  }
  uint64_t out[8];
  _mm512_storeu_si512(out, _mm512_add_epi64(a0, a1));
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

}  // namespace kvtier::bench
