// FMA throughput loop (8 f32 lanes): 12 independent accumulators hide the FMA latency.
#include <immintrin.h>

#include <cstdint>

namespace kvtier::bench {

float fma_loop_avx2(int64_t iters) {
  __m256 acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm256_set1_ps(static_cast<float>(j));
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
    for (int j = 0; j < 12; ++j) acc[j] = _mm256_fmadd_ps(acc[j], a, b);
  }
  __m256 s = acc[0];
  for (int j = 1; j < 12; ++j) s = _mm256_add_ps(s, acc[j]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}

}  // namespace kvtier::bench

namespace kvtier::bench {

// int8 dot throughput (the exact building block of the AVX2 quantised kernels): per 32 u8 x s8
// products, vpmaddubsw + vpmaddwd + vpaddd into 12 independent i32 accumulators; each accumulator
// feeds its own next u8 operand, so nothing is loop-invariant. Returns a value to keep the loop.
int int8_loop_avx2(int64_t iters) {
  __m256i acc[12];
  for (int j = 0; j < 12; ++j) acc[j] = _mm256_set1_epi32(j + 1);
  const __m256i s = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < iters; ++i) {
    for (int j = 0; j < 12; ++j)
      acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(_mm256_maddubs_epi16(acc[j], s), ones));
  }
  __m256i t = acc[0];
  for (int j = 1; j < 12; ++j) t = _mm256_add_epi32(t, acc[j]);
  return _mm256_extract_epi32(t, 0);
}

}  // namespace kvtier::bench

namespace kvtier::bench {

// Read-only sweep of `bytes` by 32-byte loads into 4 independent accumulators: the load stream a
// matvec's weights make, without its arithmetic. `streams` equal parts of the range are read in turn,
// 128 bytes from each (bytes a multiple of 128 x streams): 1 is one front-to-back stream. Returns a
// value to keep the loop.
uint64_t read_loop_avx2(const uint8_t* p, int64_t bytes, int streams) {
  __m256i acc[4];
  for (__m256i& a : acc) a = _mm256_setzero_si256();
  const int64_t part = bytes / streams;
  for (int64_t i = 0; i < part; i += 128) {
    for (int s = 0; s < streams; ++s) {
      const uint8_t* q = p + s * part + i;
      for (int j = 0; j < 4; ++j)
        acc[j] = _mm256_add_epi64(acc[j], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * j)));
    }
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]), _mm256_add_epi64(acc[2], acc[3]));
  return static_cast<uint64_t>(_mm256_extract_epi64(s, 0));
}

}  // namespace kvtier::bench
