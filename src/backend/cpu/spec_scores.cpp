#include "backend/cpu/spec_scores.h"

#include <algorithm>
#include <limits>

#include "core/half.h"

namespace kvtier::cpu {

void spec_scores_ref(const float* q, int64_t G, int64_t K, const uint16_t* pk, int64_t T, float scale,
                     float* out) {
  for (int64_t t = 0; t < T; ++t) {
    const uint16_t* k = pk + t * K;
    float best = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < G; ++j) {
      const float* qj = q + j * K;
      float dot = 0.0f;
      for (int64_t c = 0; c < K; ++c) dot += qj[c] * f16_to_f32(k[c]);
      best = std::max(best, scale * dot);
    }
    out[t] = best;
  }
}

void spec_head_scores_ref(const float* q, int64_t G, int64_t K, const uint16_t* pk, int64_t T, float scale,
                          float* out, int64_t ld) {
  for (int64_t t = 0; t < T; ++t) {
    const uint16_t* k = pk + t * K;
    for (int64_t j = 0; j < G; ++j) {
      const float* qj = q + j * K;
      float dot = 0.0f;
      for (int64_t c = 0; c < K; ++c) dot += qj[c] * f16_to_f32(k[c]);
      out[j * ld + t] = scale * dot;
    }
  }
}

SpecHeadScoresFn spec_head_scores_kernel(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return spec_head_scores_ref;
    case Isa::kAvx2:
      return spec_head_scores_avx2;
    case Isa::kAvx512:
      return spec_head_scores_avx512;
  }
  return spec_head_scores_ref;
}

SpecScoresFn spec_scores_kernel(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return spec_scores_ref;
    case Isa::kAvx2:
      return spec_scores_avx2;
    case Isa::kAvx512:
      return spec_scores_avx512;
  }
  return spec_scores_ref;
}

}  // namespace kvtier::cpu
