// A pool of equally sized KV blocks in one tier, carved from one slab allocated up front (no
// allocation afterwards: acquiring a block pops a free list). The slab is accounted in the ledger.
// Blocks can be pinned by in-flight transfers; releasing a pinned block is refused (Error kInternal:
// the caller must wait for the transfer's completion first).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kv/ledger.h"
#include "kv/pin_table.h"

namespace kvtier::kv {

class BlockPool {
 public:
  static constexpr uint32_t kNoBlock = 0xffffffffu;

  // align: block size and slab alignment (64, or a page for direct I/O). category: how the ledger
  // counts the slab.
  BlockPool(MemoryLedger& ledger, Tier tier, uint64_t block_bytes, uint32_t n_blocks, uint64_t align = 64,
            Category category = Category::kKv);
  // Ledger bytes of such a pool (block size rounded up to `align`).
  static uint64_t slab_bytes(uint64_t block_bytes, uint32_t n_blocks, uint64_t align = 64);

  // A free slot, or throws Error(kBudget) when the pool is exhausted.
  uint32_t acquire();
  // Throws Error(kInternal) if the slot is pinned (a transfer still reads or writes it).
  void release(uint32_t slot);

  void pin(uint32_t slot) { pins_.pin(slot); }
  void unpin(uint32_t slot) { pins_.unpin(slot); }
  uint32_t pins(uint32_t slot) const { return pins_.pins(slot); }
  size_t pinned_blocks() const { return pins_.pinned_blocks(); }

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
  std::unique_ptr<uint8_t, FreeDeleter> slab_;  // [n_blocks, block_bytes], `align`-aligned
  std::vector<uint32_t> free_;                  // stack of free slots
  PinTable pins_;                               // [n_blocks]
  uint32_t peak_in_use_ = 0;
};

}  // namespace kvtier::kv
