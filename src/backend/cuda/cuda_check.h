// Turns CUDA runtime and cuBLAS errors into kvtier::Error at backend edges, naming the failing call
// and where it was made. Included by both C++20 (.cpp) and CUDA C++17 (.cu) translation units.
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.h"

namespace kvtier::cuda {

// Throws Error(kIo) "CUDA: <what> failed at <file>:<line>: <message> (<name>)" unless status is
// cudaSuccess. Out-of-memory becomes Error(kBudget): the device refused an allocation.
inline void check(cudaError_t status, const char* what, const char* file = "?", int line = 0) {
  if (status == cudaSuccess) return;
  const ErrorKind kind = status == cudaErrorMemoryAllocation ? ErrorKind::kBudget : ErrorKind::kIo;
  fail(kind, "CUDA: {} failed at {}:{}: {} ({})", what, file, line, cudaGetErrorString(status),
       cudaGetErrorName(status));
}

// Checks the launch of the kernel just issued (configuration errors, not execution errors: those
// surface at the next synchronising call).
inline void check_launch(const char* kernel, const char* file, int line) {
  check(cudaGetLastError(), kernel, file, line);
}

}  // namespace kvtier::cuda

#define KVTIER_CUDA_CHECK(call) ::kvtier::cuda::check((call), #call, __FILE__, __LINE__)
#define KVTIER_CUDA_CHECK_LAUNCH(kernel) ::kvtier::cuda::check_launch(kernel, __FILE__, __LINE__)
