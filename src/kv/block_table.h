// Which physical block holds which positions: a slot map per (sequence, layer, head group, logical
// block). Logical block b of a sequence's layer is its b-th run of block_tokens positions; the entry
// names the pool slot that stores it and the positions it holds, so positions can be dropped (a
// retention policy frees a block) without moving the rest, and slots need not follow positions.
// Gathering walks a range of logical blocks; coalesce() merges adjacent slots into runs so that
// transfers of scattered blocks still move as few extents as possible.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/kv_cache.h"

namespace kvtier::kv {

struct BlockEntry {
  uint32_t slot = 0xffffffffu;  // pool slot; kNoSlot when the block is not stored
  uint32_t n = 0;               // positions held: [pos0, pos0 + n)
  int64_t pos0 = 0;
};

class BlockTable {
 public:
  static constexpr uint32_t kNoSlot = 0xffffffffu;

  // groups: [n_layer] head groups of each layer; max_blocks: logical blocks per (seq, layer, group).
  BlockTable(uint32_t n_seqs, std::vector<uint32_t> groups, int64_t max_blocks);
  // Bytes of such a table (its entries), for the ledger.
  static uint64_t bytes(uint32_t n_seqs, std::span<const uint32_t> groups, int64_t max_blocks);

  BlockEntry& at(SeqId seq, uint32_t layer, uint32_t group, int64_t block);
  const BlockEntry& at(SeqId seq, uint32_t layer, uint32_t group, int64_t block) const;

  uint32_t n_seqs() const { return n_seqs_; }
  uint32_t n_layer() const { return static_cast<uint32_t>(groups_.size()); }
  uint32_t groups(uint32_t layer) const { return groups_[layer]; }
  int64_t max_blocks() const { return max_blocks_; }
  // First logical block of (seq, layer) still stored (blocks below were freed by retention).
  int64_t first_block(SeqId seq, uint32_t layer) const { return first_[seq * groups_.size() + layer]; }
  void set_first_block(SeqId seq, uint32_t layer, int64_t b) { first_[seq * groups_.size() + layer] = b; }

 private:
  size_t index(SeqId seq, uint32_t layer, uint32_t group, int64_t block) const;

  uint32_t n_seqs_;
  std::vector<uint32_t> groups_;  // [n_layer]
  int64_t max_blocks_;
  std::vector<size_t> layer_off_;    // [n_layer] first entry of the layer within a sequence
  size_t per_seq_ = 0;               // entries per sequence
  std::vector<BlockEntry> entries_;  // [seq][layer][group][block]
  std::vector<int64_t> first_;       // [seq][layer]
};

// A run of consecutive slots: items [index, index + count) of a slot list hold slots
// [slot, slot + count).
struct SlotRun {
  size_t index = 0;
  uint32_t slot = 0;
  uint32_t count = 0;
};
// Splits `slots` (in order) into maximal runs of consecutive slots; writes them to `out` (at least
// slots.size() entries) and returns the filled part.
std::span<const SlotRun> coalesce(std::span<const uint32_t> slots, std::span<SlotRun> out);

}  // namespace kvtier::kv
