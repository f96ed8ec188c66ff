// RMSNorm and LayerNorm (ops.h): one block per row. Each thread sums a strided slice left to right,
// then a fixed shared-memory tree combines the partial sums, so the order of additions depends on n
// and the block size only (both fixed per row length): bit-identical from run to run.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_types.cuh"
#include "backend/cuda/ops.h"

namespace kvtier::cuda {
namespace {

constexpr int kThreads = 256;

// Sum of v over the block by a fixed tree; every thread gets the result. `red`: [kThreads] f32.
__device__ float block_sum(float v, float* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s)
      red[threadIdx.x] = __fadd_rn(red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
  const float r = red[0];
  __syncthreads();
  return r;
}

__global__ void rms_norm_kernel(const float* x, const float* w, float eps, int64_t n, float* y) {
  __shared__ float red[kThreads];
  const float* xr = x + blockIdx.x * n;
  float* yr = y + blockIdx.x * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) ss = __fadd_rn(ss, __fmul_rn(xr[i], xr[i]));
  ss = block_sum(ss, red);
  const float s = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(n)), eps)));
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float v = __fmul_rn(xr[i], s);
    yr[i] = w != nullptr ? __fmul_rn(v, w[i]) : v;
  }
}

__global__ void layer_norm_kernel(const float* x, const float* w, const float* b, float eps, int64_t n,
                                  float* y) {
  __shared__ float red[kThreads];
  const float* xr = x + blockIdx.x * n;
  float* yr = y + blockIdx.x * n;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) sum = __fadd_rn(sum, xr[i]);
  const float mean = __fdiv_rn(block_sum(sum, red), static_cast<float>(n));
  float var = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const float d = __fsub_rn(xr[i], mean);
    var = __fadd_rn(var, __fmul_rn(d, d));
  }
  var = block_sum(var, red);
  const float s = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(var, static_cast<float>(n)), eps)));
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    float v = __fmul_rn(__fsub_rn(xr[i], mean), s);
    if (w != nullptr) v = __fmul_rn(v, w[i]);
    if (b != nullptr) v = __fadd_rn(v, b[i]);
    yr[i] = v;
  }
}

}  // namespace

void rms_norm(const float* x, const float* w, float eps, int64_t n_rows, int64_t n, float* y,
              cudaStream_t stream) {
  KVTIER_ASSERT(n > 0 && n_rows <= 0x7fffffff, "rms_norm of {} rows of {}", n_rows, n);
  if (n_rows <= 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, stream>>>(x, w, eps, n, y);
  KVTIER_CUDA_CHECK_LAUNCH("rms_norm_kernel");
}

void layer_norm(const float* x, const float* w, const float* b, float eps, int64_t n_rows, int64_t n,
                float* y, cudaStream_t stream) {
  KVTIER_ASSERT(n > 0 && n_rows <= 0x7fffffff, "layer_norm of {} rows of {}", n_rows, n);
  if (n_rows <= 0) return;
  layer_norm_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, stream>>>(x, w, b, eps, n, y);
  KVTIER_CUDA_CHECK_LAUNCH("layer_norm_kernel");
}

}  // namespace kvtier::cuda
