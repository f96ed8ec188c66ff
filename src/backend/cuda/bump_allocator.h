// Offset bookkeeping of a fixed-capacity region carved front to back (a stack of allocations):
// the policy behind the device arena and the pinned host pool, with no CUDA in it so that it is
// testable anywhere. Allocation past the capacity throws Error(kBudget) naming the region, what was
// asked for, the bytes needed and the bytes available.
#pragma once

#include <cstddef>
#include <string>

namespace kvtier::cuda {

class BumpAllocator {
 public:
  // `name` appears in errors ("device arena", "pinned host pool"); `alignment` is a power of two.
  BumpAllocator(std::string name, size_t capacity, size_t alignment);

  // Offset of a new block of `bytes` (rounded up to the alignment); `what` names it in errors.
  size_t allocate(size_t bytes, const char* what);

  // A mark is the current top; rewind(mark) frees everything allocated after it (scratch scopes).
  size_t mark() const { return used_; }
  void rewind(size_t mark);
  void reset() { used_ = 0; }

  const std::string& name() const { return name_; }
  size_t capacity() const { return capacity_; }
  size_t used() const { return used_; }
  size_t peak() const { return peak_; }
  size_t available() const { return capacity_ - used_; }

 private:
  std::string name_;
  size_t capacity_;
  size_t alignment_;
  size_t used_ = 0;
  size_t peak_ = 0;
};

// "1.50 GiB (1610612736 bytes)": sizes in errors and reports.
std::string format_bytes(size_t bytes);

}  // namespace kvtier::cuda
