// Embedding lookup from a bf16 table and f32 <-> bf16 conversions (ops.h).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_types.cuh"
#include "backend/cuda/ops.h"

namespace kvtier::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void embedding_kernel(const uint16_t* table, const int32_t* ids, int64_t n_tokens, int64_t dim,
                                 float scale, float* out) {
  const int64_t n = n_tokens * dim;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t t = i / dim, c = i % dim;
    const float v = bf16_bits_to_f32(table[static_cast<int64_t>(ids[t]) * dim + c]);
    out[i] = scale == 1.0f ? v : __fmul_rn(v, scale);
  }
}

__global__ void f32_to_bf16_kernel(const float* x, int64_t n, uint16_t* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
  }
}

__global__ void bf16_to_f32_kernel(const uint16_t* x, int64_t n, float* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = bf16_bits_to_f32(x[i]);
  }
}

}  // namespace

void embedding_bf16(const uint16_t* table, const int32_t* ids, int64_t n_tokens, int64_t dim, float scale,
                    float* out, cudaStream_t stream) {
  const int64_t n = n_tokens * dim;
  if (n <= 0) return;
  embedding_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(table, ids, n_tokens, dim, scale, out);
  KVTIER_CUDA_CHECK_LAUNCH("embedding_kernel");
}

void cast_f32_to_bf16(const float* x, int64_t n, uint16_t* y, cudaStream_t stream) {
  if (n <= 0) return;
  f32_to_bf16_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, n, y);
  KVTIER_CUDA_CHECK_LAUNCH("f32_to_bf16_kernel");
}

void cast_bf16_to_f32(const uint16_t* x, int64_t n, float* y, cudaStream_t stream) {
  if (n <= 0) return;
  bf16_to_f32_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, n, y);
  KVTIER_CUDA_CHECK_LAUNCH("bf16_to_f32_kernel");
}

}  // namespace kvtier::cuda
