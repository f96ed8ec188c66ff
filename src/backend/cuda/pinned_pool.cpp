#include "backend/cuda/pinned_pool.h"

#include <cuda_runtime_api.h>

#include "core/error.h"

namespace kvtier::cuda {

constexpr size_t kHostAlignment = 4096;

PinnedHostPool::PinnedHostPool(size_t capacity_bytes)
    : alloc_("pinned host pool", capacity_bytes, kHostAlignment) {
  if (capacity_bytes == 0) return;
  void* p = nullptr;
  // Mapped: kernels may read it over the link (InfiniGen gathers chosen rows from the host planes).
  const cudaError_t st = cudaHostAlloc(&p, capacity_bytes, cudaHostAllocPortable | cudaHostAllocMapped);
  if (st != cudaSuccess) {
    cudaGetLastError();
    fail(ErrorKind::kBudget,
         "pinned host pool: cudaHostAlloc of {} failed ({}, {}): the system would not page-lock that much "
         "host memory; lower the host budget, free RAM, or raise the locked-memory limit (ulimit -l)",
         format_bytes(capacity_bytes), cudaGetErrorString(st), cudaGetErrorName(st));
  }
  base_ = static_cast<uint8_t*>(p);
}

PinnedHostPool::~PinnedHostPool() {
  if (base_ != nullptr) cudaFreeHost(base_);
}

void* PinnedHostPool::allocate_bytes(size_t bytes, const char* what) {
  return base_ + alloc_.allocate(bytes, what);
}

}  // namespace kvtier::cuda
