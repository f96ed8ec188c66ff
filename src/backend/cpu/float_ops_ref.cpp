// Scalar reference float ops (the maths is documented in float_ops.h). Sums run left to right in f32.
#include <algorithm>
#include <cmath>

#include "backend/cpu/ref_kernels.h"

namespace kvtier::cpu::ref {

void rms_norm(const float* x, const float* w, float eps, int64_t n, float* y) {
  float ss = 0.0f;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = w ? (x[i] * scale) * w[i] : x[i] * scale;
}

void layer_norm(const float* x, const float* w, const float* b, float eps, int64_t n, float* y) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += x[i];
  const float mean = sum / static_cast<float>(n);
  float var = 0.0f;
  for (int64_t i = 0; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  const float scale = 1.0f / std::sqrt(var / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) {
    float v = (x[i] - mean) * scale;
    if (w) v = v * w[i];
    if (b) v = v + b[i];
    y[i] = v;
  }
}

void silu(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] / (1.0f + std::exp(-x[i]));
}

void gelu_tanh(const float* x, int64_t n, float* y) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    y[i] = 0.5f * v * (1.0f + std::tanh(kSqrt2OverPi * (v + 0.044715f * v * v * v)));
  }
}

void relu(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void softmax(const float* x, int64_t n, float* y) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - m);
    s += y[i];
  }
  const float inv = 1.0f / s;
  for (int64_t i = 0; i < n; ++i) y[i] *= inv;
}

void add(const float* a, const float* b, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

void mul(const float* a, const float* b, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i];
}

void rope_rotate(float* x, const float* cos, const float* sin, int64_t n_pairs, bool neox) {
  for (int64_t p = 0; p < n_pairs; ++p) {
    float* a = neox ? x + p : x + 2 * p;
    float* b = neox ? x + p + n_pairs : x + 2 * p + 1;
    const float x0 = *a, x1 = *b;
    *a = x0 * cos[p] - x1 * sin[p];
    *b = x0 * sin[p] + x1 * cos[p];
  }
}

}  // namespace kvtier::cpu::ref
