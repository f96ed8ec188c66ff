// RoPE (ops.h): one thread per (token, head, pair). The angle is computed in double with single
// roundings and rounded to f32, as the CPU path's table (model/rope.cpp); the rotation uses single
// f32 roundings without FMA, as the CPU reference compiled with -ffp-contract=off.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_types.cuh"
#include "backend/cuda/ops.h"

namespace kvtier::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void rope_kernel(RopeParams p, float* x, int64_t token_stride, int64_t n_tokens, int64_t n_heads,
                            const int32_t* positions) {
  const int64_t n_pairs = p.n_rot / 2;
  const int64_t n = n_tokens * n_heads * n_pairs;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t pair = i % n_pairs;
    const int64_t h = (i / n_pairs) % n_heads;
    const int64_t t = i / (n_pairs * n_heads);
    double inv_freq = pow(static_cast<double>(p.base),
                          __ddiv_rn(-2.0 * static_cast<double>(pair), static_cast<double>(p.n_rot)));
    if (p.freq_factors != nullptr) inv_freq = __ddiv_rn(inv_freq, static_cast<double>(p.freq_factors[pair]));
    const double angle =
        __dmul_rn(__dmul_rn(static_cast<double>(positions[t]), static_cast<double>(p.freq_scale)), inv_freq);
    double sd, cd;
    sincos(angle, &sd, &cd);
    const float c = static_cast<float>(cd), s = static_cast<float>(sd);
    float* head = x + t * token_stride + h * p.head_dim;
    float* a = p.mode == RopeMode::kNeox ? head + pair : head + 2 * pair;
    float* b = p.mode == RopeMode::kNeox ? head + pair + n_pairs : head + 2 * pair + 1;
    const float x0 = *a, x1 = *b;
    *a = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    *b = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  }
}

}  // namespace

void rope(const RopeParams& p, float* x, int64_t token_stride, int64_t n_tokens, int64_t n_heads,
          const int32_t* positions, cudaStream_t stream) {
  KVTIER_ASSERT(p.n_rot > 0 && p.n_rot % 2 == 0 && p.n_rot <= p.head_dim, "n_rot {} head_dim {}", p.n_rot,
                p.head_dim);
  const int64_t n = n_tokens * n_heads * (p.n_rot / 2);
  if (n <= 0) return;
  rope_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(p, x, token_stride, n_tokens, n_heads,
                                                              positions);
  KVTIER_CUDA_CHECK_LAUNCH("rope_kernel");
}

}  // namespace kvtier::cuda
