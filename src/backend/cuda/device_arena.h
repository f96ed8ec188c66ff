// Device memory with a byte budget: one cudaMalloc of the whole budget up front, carved by a bump
// allocator (no allocation on the hot path). The budget emulates a smaller card on a larger one
// (--device-mem 24GiB on an 80 GiB H100). Going over is Error(kBudget) naming the bytes needed and
// available.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cuda/bump_allocator.h"

namespace kvtier::cuda {

class DeviceArena {
 public:
  // Reserves `budget_bytes` on the current device. Throws Error(kBudget) when the device cannot
  // provide them (the message names the free device memory).
  explicit DeviceArena(size_t budget_bytes);
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // `bytes` of device memory, 256-byte aligned; `what` names it in a budget error.
  void* allocate_bytes(size_t bytes, const char* what);
  template <typename T>
  T* allocate(size_t count, const char* what) {
    return static_cast<T*>(allocate_bytes(count * sizeof(T), what));
  }

  size_t mark() const { return alloc_.mark(); }
  void rewind(size_t mark) { alloc_.rewind(mark); }

  size_t budget() const { return alloc_.capacity(); }
  size_t used() const { return alloc_.used(); }
  size_t peak() const { return alloc_.peak(); }

 private:
  uint8_t* base_ = nullptr;  // [budget] bytes of device memory
  BumpAllocator alloc_;
};

// cudaMemGetInfo of the current device, reported next to the arena's peak.
struct DeviceMemInfo {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};
DeviceMemInfo device_mem_info();

}  // namespace kvtier::cuda
