// spec_scores on AVX-512: 16 rows per vector, their keys' column c gathered (rows are K floats apart),
// each lane in the scalar order (mul, then add; max as std::max(best, v)).
#include <immintrin.h>

#include <limits>

#include "backend/cpu/spec_scores.h"

namespace kvtier::cpu {

void spec_scores_avx512(const float* q, int64_t G, int64_t K, const float* pk, int64_t T, float scale,
                        float* out) {
  constexpr int64_t kLanes = 16;
  constexpr int64_t kHeads = 4;  // query heads per sweep over the columns (accumulators in registers)
  const auto k32 = static_cast<int32_t>(K);
  const __m512i rows = _mm512_mullo_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(k32));
  const __m512 vscale = _mm512_set1_ps(scale);
  int64_t t = 0;
  for (; t + kLanes <= T && K * kLanes <= std::numeric_limits<int32_t>::max(); t += kLanes) {
    const float* base = pk + t * K;
    __m512 best = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t j0 = 0; j0 < G; j0 += kHeads) {
      const int64_t nj = G - j0 < kHeads ? G - j0 : kHeads;
      __m512 acc[kHeads] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                            _mm512_setzero_ps()};
      for (int64_t c = 0; c < K; ++c) {
        const __m512 kc = _mm512_i32gather_ps(rows, base + c, 4);
        for (int64_t j = 0; j < nj; ++j)
          acc[j] = _mm512_add_ps(acc[j], _mm512_mul_ps(_mm512_set1_ps(q[(j0 + j) * K + c]), kc));
      }
      for (int64_t j = 0; j < nj; ++j) best = _mm512_max_ps(_mm512_mul_ps(vscale, acc[j]), best);
    }
    _mm512_storeu_ps(out + t, best);
  }
  spec_scores_ref(q, G, K, pk + t * K, T - t, scale, out + t);
}

}  // namespace kvtier::cpu
