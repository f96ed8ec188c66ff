// The resident placement: every block of one sequence lives in compute-local memory (a block pool
// per block size, allocated up front for `capacity` positions). Attention hands the blocks of each
// KV-head group, in position order, as spans to the backend's blocked attention.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "backend/cpu/attention.h"
#include "core/thread_pool.h"
#include "kv/block_pool.h"
#include "kv/kv_cache.h"

namespace kvtier::kv {

class ResidentKv final : public KvCache {
 public:
  // n_head: query heads (for scratch sizing). Throws Error(kBudget) if the pools do not fit.
  ResidentKv(const KvGeometry& geometry, int64_t capacity, uint32_t n_head, MemoryLedger& ledger,
             ThreadPool& pool, cpu::Isa isa);

  const KvGeometry& geometry() const override { return geo_; }
  int64_t capacity() const override { return capacity_; }
  int64_t length() const override;
  void write(uint32_t layer, int64_t pos0, int64_t n, const float* k, const float* v) override;
  void attend(uint32_t layer, int64_t pos0, int64_t n, const float* q, int64_t n_head,
              const LayerAttention& la, float* o) override;
  void truncate(int64_t n_tokens) override;

  // The spans of group `group` of `layer` covering positions [0, end), one per block, in order.
  // Writes into `out` (at least blocks_for(end) entries) and returns the filled part.
  std::span<const cpu::KvSpan> spans(uint32_t layer, uint32_t group, int64_t end,
                                     std::span<cpu::KvSpan> out) const;
  int64_t blocks_for(int64_t n_tokens) const {
    return (n_tokens + geo_.block_tokens - 1) / geo_.block_tokens;
  }
  // Blocks in use now, and the most ever, over all pools.
  uint64_t blocks_in_use() const;
  uint64_t kv_bytes_in_use() const;

 private:
  BlockPool& pool_of(uint32_t layer) { return *pools_[pool_index_[layer]]; }
  const BlockPool& pool_of(uint32_t layer) const { return *pools_[pool_index_[layer]]; }
  uint32_t& slot(uint32_t layer, uint32_t group, uint32_t block);
  uint32_t slot(uint32_t layer, uint32_t group, uint32_t block) const;

  KvGeometry geo_;
  int64_t capacity_;
  int64_t max_blocks_;  // token blocks per (layer, group)
  ThreadPool& threads_;
  cpu::Isa isa_;
  std::vector<std::unique_ptr<BlockPool>> pools_;  // one per distinct block size
  std::vector<uint32_t> pool_index_;               // [n_layer]
  std::vector<size_t> table_offset_;               // [n_layer] first entry of the layer in table_
  Reservation meta_reservation_;                   // table_ and span_buf_
  std::vector<uint32_t> table_;                    // [layer][group][block] -> slot (kNoBlock if none)
  std::vector<int64_t> length_;                    // [n_layer] positions written
  std::vector<cpu::KvSpan> span_buf_;              // [max_blocks] spans of one attend call
  Reservation scratch_reservation_;
  std::vector<uint8_t> scratch_;  // attention scratch, sized for the widest layer
};

}  // namespace kvtier::kv
