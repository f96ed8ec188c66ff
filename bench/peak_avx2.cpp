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
