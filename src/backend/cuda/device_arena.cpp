#include "backend/cuda/device_arena.h"

#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_check.h"

namespace kvtier::cuda {

constexpr size_t kDeviceAlignment = 256;

DeviceMemInfo device_mem_info() {
  DeviceMemInfo m;
  KVTIER_CUDA_CHECK(cudaMemGetInfo(&m.free_bytes, &m.total_bytes));
  return m;
}

DeviceArena::DeviceArena(size_t budget_bytes) : alloc_("device arena", budget_bytes, kDeviceAlignment) {
  if (budget_bytes == 0) return;
  void* p = nullptr;
  const cudaError_t st = cudaMalloc(&p, budget_bytes);
  if (st != cudaSuccess) {
    cudaGetLastError();  // clear the error state before asking for the free memory
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail(ErrorKind::kBudget,
         "device arena: cannot reserve a budget of {}: cudaMalloc failed ({}); the device has {} free of {}; "
         "lower --device-mem",
         format_bytes(budget_bytes), cudaGetErrorString(st), format_bytes(free_b), format_bytes(total_b));
  }
  base_ = static_cast<uint8_t*>(p);
}

DeviceArena::~DeviceArena() {
  if (base_ != nullptr) cudaFree(base_);  // no throw from a destructor; errors here are sticky anyway
}

void* DeviceArena::allocate_bytes(size_t bytes, const char* what) {
  return base_ + alloc_.allocate(bytes, what);
}

}  // namespace kvtier::cuda
