#include "backend/cuda/gemm.h"

#include <limits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_arena.h"
#include "backend/cuda/ops.h"

namespace kvtier::cuda {
namespace {

void check_blas(cublasStatus_t st, const char* what, const char* file, int line) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  fail(st == CUBLAS_STATUS_ALLOC_FAILED ? ErrorKind::kBudget : ErrorKind::kIo,
       "cuBLAS: {} failed at {}:{}: {} ({})", what, file, line, cublasGetStatusString(st),
       cublasGetStatusName(st));
}

#define KVTIER_CUBLAS_CHECK(call) check_blas((call), #call, __FILE__, __LINE__)

int to_int(int64_t v, const char* what) {
  if (v < 0 || v > std::numeric_limits<int>::max()) {
    fail(ErrorKind::kUnsupported, "cuBLAS GEMM: {} = {} exceeds the 32-bit range", what, v);
  }
  return static_cast<int>(v);
}

}  // namespace

Blas::Blas(DeviceArena& arena) {
  void* ws = arena.allocate_bytes(kWorkspaceBytes, "cuBLAS workspace");
  KVTIER_CUBLAS_CHECK(cublasCreate(&h_));
  try {
    KVTIER_CUBLAS_CHECK(cublasSetWorkspace(h_, ws, kWorkspaceBytes));
    KVTIER_CUBLAS_CHECK(cublasSetMathMode(h_, CUBLAS_DEFAULT_MATH));
    KVTIER_CUBLAS_CHECK(cublasSetAtomicsMode(h_, CUBLAS_ATOMICS_NOT_ALLOWED));
  } catch (...) {
    cublasDestroy(h_);
    throw;
  }
}

Blas::~Blas() {
  if (h_ != nullptr) cublasDestroy(h_);
}

void gemm_bf16(Blas& blas, const uint16_t* w, const uint16_t* x, int64_t n_tokens, int64_t k, int64_t n_out,
               float* y, cudaStream_t stream) {
  if (n_tokens == 0 || n_out == 0) return;
  const int m = to_int(n_out, "n_out"), n = to_int(n_tokens, "n_tokens"), kk = to_int(k, "k");
  KVTIER_CUBLAS_CHECK(cublasSetStream(blas.handle(), stream));
  const float alpha = 1.0f, beta = 0.0f;
  // Column-major view: y^T [n_out x n_tokens] = (W^T)^T [n_out x k] * x^T [k x n_tokens], where the
  // row-major W [n_out, k] is the column-major [k x n_out] matrix (hence OP_T) and x likewise.
  KVTIER_CUBLAS_CHECK(cublasGemmEx(blas.handle(), CUBLAS_OP_T, CUBLAS_OP_N, m, n, kk, &alpha, w, CUDA_R_16BF,
                                   kk, x, CUDA_R_16BF, kk, &beta, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT));
}

void gemm_bf16_f32in(Blas& blas, const uint16_t* w, const float* x, uint16_t* x_bf16, int64_t n_tokens,
                     int64_t k, int64_t n_out, float* y, cudaStream_t stream) {
  cast_f32_to_bf16(x, n_tokens * k, x_bf16, stream);
  gemm_bf16(blas, w, x_bf16, n_tokens, k, n_out, y, stream);
}

}  // namespace kvtier::cuda
