// Pin counts of a fixed set of blocks (block pool slots, home-tier blocks). A block is pinned while
// a transfer that reads or writes it is in flight: the transfer engine pins when a job is prepared
// (compute thread) and unpins when the copy completes (copy thread), so counts are atomic. Whoever
// frees, truncates or rewrites a block checks its count first (see BlockPool::release,
// TieredKv::truncate).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "core/error.h"

namespace kvtier::kv {

class PinTable {
 public:
  explicit PinTable(size_t n_blocks)
      : n_(n_blocks), count_(std::make_unique<std::atomic<uint32_t>[]>(n_blocks)) {}

  size_t size() const { return n_; }
  void pin(size_t i) {
    KVTIER_ASSERT(i < n_, "pin of block {} of {}", i, n_);
    count_[i].fetch_add(1, std::memory_order_relaxed);
  }
  // Release order: the copy's bytes are visible to whoever sees the count drop.
  void unpin(size_t i) {
    KVTIER_ASSERT(i < n_, "unpin of block {} of {}", i, n_);
    const uint32_t before = count_[i].fetch_sub(1, std::memory_order_release);
    KVTIER_ASSERT(before > 0, "unpin of unpinned block {}", i);
  }
  uint32_t pins(size_t i) const { return count_[i].load(std::memory_order_acquire); }
  // Blocks with a non-zero count (tests, assertions).
  size_t pinned_blocks() const {
    size_t n = 0;
    for (size_t i = 0; i < n_; ++i) n += pins(i) != 0;
    return n;
  }

 private:
  size_t n_;
  std::unique_ptr<std::atomic<uint32_t>[]> count_;  // [n_blocks]
};

}  // namespace kvtier::kv
