#include "backend/cuda/bump_allocator.h"

#include <fmt/format.h>

#include "core/error.h"

namespace kvtier::cuda {

BumpAllocator::BumpAllocator(std::string name, size_t capacity, size_t alignment)
    : name_(std::move(name)), capacity_(capacity), alignment_(alignment) {
  KVTIER_ASSERT(alignment > 0 && (alignment & (alignment - 1)) == 0, "alignment {}", alignment);
}

size_t BumpAllocator::allocate(size_t bytes, const char* what) {
  const size_t rounded = (bytes + alignment_ - 1) & ~(alignment_ - 1);
  if (rounded < bytes || rounded > available()) {
    fail(ErrorKind::kBudget,
         "{}: cannot allocate {} for {}: {} needed, {} available of {} ({} in use); raise the budget "
         "(--device-mem) or choose a policy that keeps less on the device (layer, headinfer)",
         name_, format_bytes(bytes), what, format_bytes(rounded), format_bytes(available()),
         format_bytes(capacity_), format_bytes(used_));
  }
  const size_t offset = used_;
  used_ += rounded;
  if (used_ > peak_) peak_ = used_;
  return offset;
}

void BumpAllocator::rewind(size_t mark) {
  KVTIER_ASSERT(mark <= used_, "{}: rewind to {} above the top {}", name_, mark, used_);
  used_ = mark;
}

std::string format_bytes(size_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (size_t{1} << 30)) return fmt::format("{:.2f} GiB ({} bytes)", b / (1 << 30), bytes);
  if (bytes >= (size_t{1} << 20)) return fmt::format("{:.2f} MiB ({} bytes)", b / (1 << 20), bytes);
  if (bytes >= (size_t{1} << 10)) return fmt::format("{:.2f} KiB ({} bytes)", b / (1 << 10), bytes);
  return fmt::format("{} bytes", bytes);
}

}  // namespace kvtier::cuda
