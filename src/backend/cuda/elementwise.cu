// Elementwise ops and gated products (ops.h). One thread per element in grid-stride loops: each
// output depends on its own inputs only, so results never depend on the launch shape.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_types.cuh"
#include "backend/cuda/ops.h"

namespace kvtier::cuda {
namespace {

constexpr int kThreads = 256;

__device__ __forceinline__ float silu_f(float x) {
  return x / (1.0f + expf(-x));
}

__device__ __forceinline__ float gelu_tanh_f(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + tanhf(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

enum class Unary { kSilu, kGelu, kRelu, kScale, kSoftcap };
enum class Binary { kAdd, kMul };

template <Unary op>
__global__ void unary_kernel(const float* x, float c, int64_t n, float* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = x[i];
    float r;
    if constexpr (op == Unary::kSilu) {
      r = silu_f(v);
    } else if constexpr (op == Unary::kGelu) {
      r = gelu_tanh_f(v);
    } else if constexpr (op == Unary::kRelu) {
      r = v > 0.0f ? v : 0.0f;
    } else if constexpr (op == Unary::kScale) {
      r = __fmul_rn(c, v);
    } else {
      r = __fmul_rn(c, tanhf(__fdiv_rn(v, c)));
    }
    y[i] = r;
  }
}

template <Binary op>
__global__ void binary_kernel(const float* a, const float* b, int64_t n, float* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = op == Binary::kAdd ? __fadd_rn(a[i], b[i]) : __fmul_rn(a[i], b[i]);
  }
}

__global__ void add_rows_kernel(const float* x, int64_t x_stride, const float* b, int64_t n_rows, int64_t n,
                                float* y, int64_t y_stride) {
  const int64_t total = n_rows * n;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / n, c = i % n;
    y[r * y_stride + c] = __fadd_rn(x[r * x_stride + c], b[c]);
  }
}

template <GluAct act>
__global__ void glu_kernel(const float* gate, int64_t gate_stride, const float* up, int64_t up_stride,
                           int64_t n_rows, int64_t n_cols, float* y, int64_t y_stride) {
  const int64_t n = n_rows * n_cols;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / n_cols, c = i % n_cols;
    const float g = gate[r * gate_stride + c];
    const float a = act == GluAct::kSilu ? silu_f(g) : gelu_tanh_f(g);
    y[r * y_stride + c] = __fmul_rn(a, up[r * up_stride + c]);
  }
}

template <Unary op>
void launch_unary(const float* x, float c, int64_t n, float* y, cudaStream_t stream) {
  if (n <= 0) return;
  unary_kernel<op><<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, c, n, y);
  KVTIER_CUDA_CHECK_LAUNCH("unary_kernel");
}

template <Binary op>
void launch_binary(const float* a, const float* b, int64_t n, float* y, cudaStream_t stream) {
  if (n <= 0) return;
  binary_kernel<op><<<grid_for(n, kThreads), kThreads, 0, stream>>>(a, b, n, y);
  KVTIER_CUDA_CHECK_LAUNCH("binary_kernel");
}

}  // namespace

void silu(const float* x, int64_t n, float* y, cudaStream_t stream) {
  launch_unary<Unary::kSilu>(x, 0.0f, n, y, stream);
}
void gelu_tanh(const float* x, int64_t n, float* y, cudaStream_t stream) {
  launch_unary<Unary::kGelu>(x, 0.0f, n, y, stream);
}
void relu(const float* x, int64_t n, float* y, cudaStream_t stream) {
  launch_unary<Unary::kRelu>(x, 0.0f, n, y, stream);
}
void scale(const float* x, float c, int64_t n, float* y, cudaStream_t stream) {
  launch_unary<Unary::kScale>(x, c, n, y, stream);
}
void softcap(const float* x, float cap, int64_t n, float* y, cudaStream_t stream) {
  KVTIER_ASSERT(cap > 0.0f, "softcap {}", cap);
  launch_unary<Unary::kSoftcap>(x, cap, n, y, stream);
}
void add(const float* a, const float* b, int64_t n, float* y, cudaStream_t stream) {
  launch_binary<Binary::kAdd>(a, b, n, y, stream);
}
void mul(const float* a, const float* b, int64_t n, float* y, cudaStream_t stream) {
  launch_binary<Binary::kMul>(a, b, n, y, stream);
}

void add_rows(const float* x, int64_t x_stride, const float* b, int64_t n_rows, int64_t n, float* y,
              int64_t y_stride, cudaStream_t stream) {
  const int64_t total = n_rows * n;
  if (total <= 0) return;
  add_rows_kernel<<<grid_for(total, kThreads), kThreads, 0, stream>>>(x, x_stride, b, n_rows, n, y, y_stride);
  KVTIER_CUDA_CHECK_LAUNCH("add_rows_kernel");
}

void glu(GluAct act, const float* gate, int64_t gate_stride, const float* up, int64_t up_stride,
         int64_t n_rows, int64_t n_cols, float* y, int64_t y_stride, cudaStream_t stream) {
  const int64_t n = n_rows * n_cols;
  if (n <= 0) return;
  if (act == GluAct::kSilu) {
    glu_kernel<GluAct::kSilu><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        gate, gate_stride, up, up_stride, n_rows, n_cols, y, y_stride);
  } else {
    glu_kernel<GluAct::kGeluTanh><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        gate, gate_stride, up, up_stride, n_rows, n_cols, y, y_stride);
  }
  KVTIER_CUDA_CHECK_LAUNCH("glu_kernel");
}

}  // namespace kvtier::cuda
