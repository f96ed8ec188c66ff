// Page-locked host memory for the host tier and the staging buffers of H2D/D2H copies: one
// cudaHostAlloc up front, carved by a bump allocator. Pinning can fail (locked-memory limits, RAM):
// that is Error(kBudget) naming the size asked for, never a silent fallback to pageable memory.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cuda/bump_allocator.h"

namespace kvtier::cuda {

class PinnedHostPool {
 public:
  explicit PinnedHostPool(size_t capacity_bytes);
  ~PinnedHostPool();
  PinnedHostPool(const PinnedHostPool&) = delete;
  PinnedHostPool& operator=(const PinnedHostPool&) = delete;

  // `bytes` of pinned host memory, 4096-byte aligned; `what` names it in a budget error.
  void* allocate_bytes(size_t bytes, const char* what);
  template <typename T>
  T* allocate(size_t count, const char* what) {
    return static_cast<T*>(allocate_bytes(count * sizeof(T), what));
  }

  size_t mark() const { return alloc_.mark(); }
  void rewind(size_t mark) { alloc_.rewind(mark); }

  size_t capacity() const { return alloc_.capacity(); }
  size_t used() const { return alloc_.used(); }
  size_t peak() const { return alloc_.peak(); }

 private:
  uint8_t* base_ = nullptr;  // [capacity] bytes of page-locked host memory
  BumpAllocator alloc_;
};

}  // namespace kvtier::cuda
