// Float ops of the forward pass on contiguous f32 rows, each with a scalar reference and SIMD paths
// chosen by `isa` (kernel_table). All are row-local: results never depend on threads or batching.
//   rms_norm:   y = x / sqrt(mean(x^2) + eps) * w          (w may be null: no weight)
//   layer_norm: y = (x - mean) / sqrt(var + eps) * w + b    (w, b may be null)
//   silu:       y = x / (1 + exp(-x))
//   gelu_tanh:  y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
//   relu:       y = max(x, 0)
//   softmax:    y = exp(x - max x) / sum exp(x - max x)
//   add, mul:   y = a + b, y = a * b (elementwise; y may alias a or b)
//   rope:       rotates dimension pairs of each head by pos * freq_scale * base^(-2p / n_rot)
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_features.h"

namespace kvtier::cpu {

void rms_norm(Isa isa, const float* x, const float* w, float eps, int64_t n, float* y);
void layer_norm(Isa isa, const float* x, const float* w, const float* b, float eps, int64_t n, float* y);
void silu(Isa isa, const float* x, int64_t n, float* y);
void gelu_tanh(Isa isa, const float* x, int64_t n, float* y);
void relu(Isa isa, const float* x, int64_t n, float* y);
void softmax(Isa isa, const float* x, int64_t n, float* y);
void add(Isa isa, const float* a, const float* b, int64_t n, float* y);
void mul(Isa isa, const float* a, const float* b, int64_t n, float* y);

enum class RopeMode {
  kNormal,  // pairs (2p, 2p + 1): Llama as stored in GGUF
  kNeox,    // pairs (p, p + n_rot / 2): NeoX, Gemma, Qwen
};

// Angles of one position: cos/sin [n_rot / 2] f32, computed in double then rounded (shared by all
// ISAs so that every path rotates by the same values).
void rope_angles(int64_t pos, int64_t n_rot, float base, float freq_scale, float* cos, float* sin);

// x: [n_heads, head_dim] f32, rotated in place on the first n_rot dims of each head.
void rope(Isa isa, float* x, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float* cos,
          const float* sin, RopeMode mode);

}  // namespace kvtier::cpu
