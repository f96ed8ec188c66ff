// A pool of equally sized KV blocks in one tier, carved from one slab allocated up front (no
// allocation afterwards: acquiring a block pops a free list). The slab is accounted in the ledger.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kv/ledger.h"

namespace kvtier::kv {

class BlockPool {
 public:
  static constexpr uint32_t kNoBlock = 0xffffffffu;

  BlockPool(MemoryLedger& ledger, Tier tier, uint64_t block_bytes, uint32_t n_blocks);

  // A free slot, or throws Error(kBudget) when the pool is exhausted.
  uint32_t acquire();
  void release(uint32_t slot);

  uint8_t* data(uint32_t slot) { return slab_.get() + uint64_t{slot} * block_bytes_; }
  const uint8_t* data(uint32_t slot) const { return slab_.get() + uint64_t{slot} * block_bytes_; }
  uint64_t block_bytes() const { return block_bytes_; }
  uint32_t capacity() const { return n_blocks_; }
  uint32_t in_use() const { return n_blocks_ - static_cast<uint32_t>(free_.size()); }
  uint32_t peak_in_use() const { return peak_in_use_; }
  Tier tier() const { return tier_; }

 private:
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  Tier tier_;
  uint64_t block_bytes_;
  uint32_t n_blocks_;
  Reservation reservation_;
  std::unique_ptr<uint8_t, FreeDeleter> slab_;  // [n_blocks, block_bytes], 64-byte aligned
  std::vector<uint32_t> free_;                  // stack of free slots
  uint32_t peak_in_use_ = 0;
};

}  // namespace kvtier::kv
