// Scalar reference tile kernels of the blocked attention (plain loops, no FMA contraction).
#include <cmath>

#include "backend/cpu/attention.h"
#include "core/half.h"

namespace kvtier::cpu {
namespace {

void scores(const float* q, int64_t q_stride, int64_t rows, const float* k, int64_t n, int64_t d, float* s) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t i = 0; i < d; ++i) acc += q[r * q_stride + i] * k[j * d + i];
      s[r * n + j] = acc;
    }
  }
}

void accumulate(const float* p, int64_t rows, const float* v, int64_t n, int64_t dv, float* acc) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < dv; ++i) acc[r * dv + i] += p[r * n + j] * v[j * dv + i];
    }
  }
}

void scores_f16(const float* q, int64_t q_stride, int64_t rows, const uint16_t* k, int64_t n, int64_t d,
                float* s) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int64_t i = 0; i < d; ++i) acc += q[r * q_stride + i] * f16_to_f32(k[j * d + i]);
      s[r * n + j] = acc;
    }
  }
}

void accumulate_f16(const float* p, int64_t rows, const uint16_t* v, int64_t n, int64_t dv, float* acc) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < dv; ++i) acc[r * dv + i] += p[r * n + j] * f16_to_f32(v[j * dv + i]);
    }
  }
}

void f16_to_f32_row(const uint16_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

void scale(float* x, int64_t n, float c) {
  for (int64_t i = 0; i < n; ++i) x[i] *= c;
}

float exp_sum(const float* s, int64_t n, float m, float* p) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    p[j] = std::exp(s[j] - m);
    sum += p[j];
  }
  return sum;
}

constexpr AttnTileOps kOps{scores,         accumulate, scores_f16, accumulate_f16,
                           f16_to_f32_row, scale,      exp_sum,    kivi_dequant_ref};

}  // namespace

const AttnTileOps& attn_tile_ops_ref() {
  return kOps;
}

}  // namespace kvtier::cpu
