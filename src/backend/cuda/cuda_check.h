// Turns CUDA runtime errors into kvtier::Error at backend edges.
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.h"

namespace kvtier::cuda {

inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    fail(ErrorKind::kIo, "CUDA: {} failed: {} ({})", what, cudaGetErrorString(status),
         cudaGetErrorName(status));
  }
}

}  // namespace kvtier::cuda

#define KVTIER_CUDA_CHECK(call) ::kvtier::cuda::check((call), #call)
