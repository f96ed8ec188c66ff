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
