#include "backend/cuda/context.h"

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_check.h"

namespace kvtier::cuda {

Context::Context(const ContextOptions& o) : device_(o.device) {
  int n = 0;
  const cudaError_t st = cudaGetDeviceCount(&n);
  if (st != cudaSuccess) {
    cudaGetLastError();
    fail(ErrorKind::kUnsupported, "CUDA backend: no usable CUDA device ({})", cudaGetErrorString(st));
  }
  if (o.device < 0 || o.device >= n) {
    fail(ErrorKind::kInvalidArgument, "CUDA device {} does not exist ({} visible)", o.device, n);
  }
  KVTIER_CUDA_CHECK(cudaSetDevice(o.device));
  arena_ = std::make_unique<DeviceArena>(o.device_budget);
  pinned_ = std::make_unique<PinnedHostPool>(o.pinned_bytes);
  streams_ = std::make_unique<Streams>();
  blas_ = std::make_unique<Blas>(*arena_);
}

// Members go in reverse order: the cuBLAS handle before its workspace's arena.
Context::~Context() = default;

MemoryReport Context::memory_report() const {
  MemoryReport r;
  r.arena_budget = arena_->budget();
  r.arena_used = arena_->used();
  r.arena_peak = arena_->peak();
  r.pinned_capacity = pinned_->capacity();
  r.pinned_peak = pinned_->peak();
  const DeviceMemInfo m = device_mem_info();
  r.device_free = m.free_bytes;
  r.device_total = m.total_bytes;
  return r;
}

}  // namespace kvtier::cuda
