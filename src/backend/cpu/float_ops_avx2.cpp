// AVX2 float ops. exp is a polynomial: e^x = 2^n e^r with n = round(x log2 e), r = x - n ln 2
// (two-part ln 2, |r| <= ln2 / 2) and a degree-6 Taylor polynomial for e^r (truncation error
// < (ln2/2)^7 / 7! ~ 1.2e-7 relative, about one ulp), so results stay within a few ulp of std::exp.
#include <algorithm>
#include <cmath>

#include "backend/cpu/kernels.h"
#include "backend/cpu/ref_kernels.h"
#include "backend/cpu/simd_avx2.h"

namespace kvtier::cpu {
namespace {

using namespace avx2;

__m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.4426950408889634f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);  // ln2 high part (exact n * hi)
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);     // ln2 low part
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i pow2n =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(pow2n));
}

void rms_norm(const float* x, const float* w, float eps, int64_t n, float* y) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float ss = hsum_f32(acc);
  for (; i < n; ++i) ss += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  const __m256 vs = _mm256_set1_ps(scale);
  for (i = 0; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
    if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
    _mm256_storeu_ps(y + i, v);
  }
  for (; i < n; ++i) y[i] = w ? (x[i] * scale) * w[i] : x[i] * scale;
}

void layer_norm(const float* x, const float* w, const float* b, float eps, int64_t n, float* y) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + i));
  float sum = hsum_f32(acc);
  for (; i < n; ++i) sum += x[i];
  const float mean = sum / static_cast<float>(n);
  const __m256 vm = _mm256_set1_ps(mean);
  acc = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), vm);
    acc = _mm256_fmadd_ps(d, d, acc);
  }
  float var = hsum_f32(acc);
  for (; i < n; ++i) var += (x[i] - mean) * (x[i] - mean);
  const float scale = 1.0f / std::sqrt(var / static_cast<float>(n) + eps);
  const __m256 vs = _mm256_set1_ps(scale);
  for (i = 0; i + 8 <= n; i += 8) {
    __m256 v = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm), vs);
    if (w) v = _mm256_mul_ps(v, _mm256_loadu_ps(w + i));
    if (b) v = _mm256_add_ps(v, _mm256_loadu_ps(b + i));
    _mm256_storeu_ps(y + i, v);
  }
  for (; i < n; ++i) {
    float v = (x[i] - mean) * scale;
    if (w) v = v * w[i];
    if (b) v = v + b[i];
    y[i] = v;
  }
}

void silu(const float* x, int64_t n, float* y) {
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), v));
    _mm256_storeu_ps(y + i, _mm256_div_ps(v, _mm256_add_ps(one, e)));
  }
  ref::silu(x + i, n - i, y + i);
}

void gelu_tanh(const float* x, int64_t n, float* y) {
  // tanh(z) = 1 - 2 / (e^{2z} + 1): absolute error a few ulp of 1, fine for 0.5 x (1 + tanh).
  int64_t i = 0;
  const __m256 one = _mm256_set1_ps(1.0f), two = _mm256_set1_ps(2.0f), half = _mm256_set1_ps(0.5f);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 v3 = _mm256_mul_ps(_mm256_mul_ps(v, v), v);
    const __m256 z =
        _mm256_mul_ps(_mm256_set1_ps(0.7978845608028654f), _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), v3, v));
    const __m256 t = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(exp8(_mm256_mul_ps(two, z)), one)));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, t)));
  }
  ref::gelu_tanh(x + i, n - i, y + i);
}

void relu(const float* x, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_max_ps(_mm256_loadu_ps(x + i), _mm256_setzero_ps()));
  ref::relu(x + i, n - i, y + i);
}

void softmax(const float* x, int64_t n, float* y) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  const __m256 vm = _mm256_set1_ps(m);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(y + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float s = hsum_f32(acc);
  for (; i < n; ++i) {
    y[i] = std::exp(x[i] - m);
    s += y[i];
  }
  const __m256 inv = _mm256_set1_ps(1.0f / s);
  for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(y + i), inv));
  for (; i < n; ++i) y[i] *= 1.0f / s;
}

void add(const float* a, const float* b, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  ref::add(a + i, b + i, n - i, y + i);
}

void mul(const float* a, const float* b, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  ref::mul(a + i, b + i, n - i, y + i);
}

// NeoX pairs are two contiguous halves: 8 pairs per step. Normal (interleaved) pairs use the scalar
// code (the same operations, so identical results).
void rope_rotate(float* x, const float* cos, const float* sin, int64_t n_pairs, bool neox) {
  if (!neox) return ref::rope_rotate(x, cos, sin, n_pairs, false);
  int64_t p = 0;
  for (; p + 8 <= n_pairs; p += 8) {
    const __m256 x0 = _mm256_loadu_ps(x + p), x1 = _mm256_loadu_ps(x + p + n_pairs);
    const __m256 c = _mm256_loadu_ps(cos + p), s = _mm256_loadu_ps(sin + p);
    _mm256_storeu_ps(x + p, _mm256_sub_ps(_mm256_mul_ps(x0, c), _mm256_mul_ps(x1, s)));
    _mm256_storeu_ps(x + p + n_pairs, _mm256_add_ps(_mm256_mul_ps(x0, s), _mm256_mul_ps(x1, c)));
  }
  for (; p < n_pairs; ++p) {
    const float x0 = x[p], x1 = x[p + n_pairs];
    x[p] = x0 * cos[p] - x1 * sin[p];
    x[p + n_pairs] = x0 * sin[p] + x1 * cos[p];
  }
}

}  // namespace

void fill_avx2_float_kernels(FloatKernels& f) {
  f = FloatKernels{rms_norm, layer_norm, silu, gelu_tanh, relu, softmax, add, mul, rope_rotate};
}

}  // namespace kvtier::cpu
