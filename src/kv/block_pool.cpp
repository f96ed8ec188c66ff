#include "kv/block_pool.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace kvtier::kv {

void BlockPool::FreeDeleter::operator()(uint8_t* p) const {
  std::free(p);
}

uint64_t BlockPool::slab_bytes(uint64_t block_bytes, uint32_t n_blocks, uint64_t align) {
  return (block_bytes + align - 1) / align * align * n_blocks;
}

BlockPool::BlockPool(MemoryLedger& ledger, Tier tier, uint64_t block_bytes, uint32_t n_blocks, uint64_t align,
                     Category category)
    : tier_(tier),
      block_bytes_((block_bytes + align - 1) / align * align),
      n_blocks_(n_blocks),
      reservation_(ledger, tier, category, slab_bytes(block_bytes, n_blocks, align)),
      pins_(n_blocks) {
  KVTIER_ASSERT(align >= 64 && (align & (align - 1)) == 0, "block alignment {}", align);
  const uint64_t total = std::max<uint64_t>(align, block_bytes_ * n_blocks);
  slab_.reset(static_cast<uint8_t*>(std::aligned_alloc(align, total)));
  if (!slab_) fail(ErrorKind::kBudget, "cannot allocate {} bytes for {} KV blocks", total, n_blocks);
  free_.resize(n_blocks);
  // Lowest slot first: blocks acquired in order are adjacent in the slab.
  for (uint32_t i = 0; i < n_blocks; ++i) free_[i] = n_blocks - 1 - i;
}

uint32_t BlockPool::acquire() {
  if (free_.empty()) {
    fail(ErrorKind::kBudget, "KV block pool of {} blocks ({} bytes each) in {} is exhausted (raise --ctx)",
         n_blocks_, block_bytes_, tier_name(tier_));
  }
  const uint32_t s = free_.back();
  free_.pop_back();
  peak_in_use_ = std::max(peak_in_use_, in_use());
  return s;
}

void BlockPool::release(uint32_t slot) {
  KVTIER_ASSERT(slot < n_blocks_ && free_.size() < n_blocks_, "release of block {}", slot);
  if (pins_.pins(slot) != 0) {
    fail(ErrorKind::kInternal, "block {} of the {} KV pool is released while {} transfer(s) still use it",
         slot, tier_name(tier_), pins_.pins(slot));
  }
  free_.push_back(slot);
}

}  // namespace kvtier::kv
