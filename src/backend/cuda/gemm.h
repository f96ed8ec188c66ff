// Matrix products through cuBLAS: bf16 weights and activations, f32 accumulation and output.
//   y[t, o] = sum_k x[t, k] * w[o, k]     (y = x W^T, the layout of GGUF weights: one row per output)
// cuBLAS is deterministic for a fixed shape, device and library version (no atomics mode, a fixed
// workspace); the algorithm it picks may differ between shapes, so an exact policy compares runs
// with the same chunk size (as design.md's exactness promise says).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kvtier::cuda {

class DeviceArena;

// A cuBLAS handle bound to a workspace carved from the arena (so cuBLAS allocates nothing later).
class Blas {
 public:
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  explicit Blas(DeviceArena& arena);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  cublasHandle_t handle() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

// y = x W^T. w: [n_out, k] bf16 bits (device); x: [n_tokens, k] bf16 bits (device);
// y: [n_tokens, n_out] f32 (device). Enqueued on `stream`.
void gemm_bf16(Blas& blas, const uint16_t* w, const uint16_t* x, int64_t n_tokens, int64_t k, int64_t n_out,
               float* y, cudaStream_t stream);

// The same from f32 activations: x is first rounded to bf16 into x_bf16 ([n_tokens, k] scratch).
void gemm_bf16_f32in(Blas& blas, const uint16_t* w, const float* x, uint16_t* x_bf16, int64_t n_tokens,
                     int64_t k, int64_t n_out, float* y, cudaStream_t stream);

}  // namespace kvtier::cuda
