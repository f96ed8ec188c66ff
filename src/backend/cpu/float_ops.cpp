#include "backend/cpu/float_ops.h"

#include <cmath>

#include "backend/cpu/kernels.h"
#include "core/error.h"

namespace kvtier::cpu {

void rms_norm(Isa isa, const float* x, const float* w, float eps, int64_t n, float* y) {
  KVTIER_ASSERT(n > 0);
  kernel_table(isa).fops.rms_norm(x, w, eps, n, y);
}
void layer_norm(Isa isa, const float* x, const float* w, const float* b, float eps, int64_t n, float* y) {
  KVTIER_ASSERT(n > 0);
  kernel_table(isa).fops.layer_norm(x, w, b, eps, n, y);
}
void silu(Isa isa, const float* x, int64_t n, float* y) {
  kernel_table(isa).fops.silu(x, n, y);
}
void gelu_tanh(Isa isa, const float* x, int64_t n, float* y) {
  kernel_table(isa).fops.gelu_tanh(x, n, y);
}
void relu(Isa isa, const float* x, int64_t n, float* y) {
  kernel_table(isa).fops.relu(x, n, y);
}
void softmax(Isa isa, const float* x, int64_t n, float* y) {
  KVTIER_ASSERT(n > 0);
  kernel_table(isa).fops.softmax(x, n, y);
}
void add(Isa isa, const float* a, const float* b, int64_t n, float* y) {
  kernel_table(isa).fops.add(a, b, n, y);
}
void mul(Isa isa, const float* a, const float* b, int64_t n, float* y) {
  kernel_table(isa).fops.mul(a, b, n, y);
}

void rope_angles(int64_t pos, int64_t n_rot, float base, float freq_scale, float* cos, float* sin) {
  KVTIER_ASSERT(n_rot > 0 && n_rot % 2 == 0, "n_rot {}", n_rot);
  for (int64_t p = 0; p < n_rot / 2; ++p) {
    const double inv_freq =
        std::pow(static_cast<double>(base), -2.0 * static_cast<double>(p) / static_cast<double>(n_rot));
    const double angle = static_cast<double>(pos) * static_cast<double>(freq_scale) * inv_freq;
    cos[p] = static_cast<float>(std::cos(angle));
    sin[p] = static_cast<float>(std::sin(angle));
  }
}

void rope(Isa isa, float* x, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float* cos,
          const float* sin, RopeMode mode) {
  KVTIER_ASSERT(n_rot > 0 && n_rot % 2 == 0 && n_rot <= head_dim, "n_rot {} head_dim {}", n_rot, head_dim);
  const auto fn = kernel_table(isa).fops.rope_rotate;
  for (int64_t h = 0; h < n_heads; ++h) fn(x + h * head_dim, cos, sin, n_rot / 2, mode == RopeMode::kNeox);
}

}  // namespace kvtier::cpu
