#include "kv/block_table.h"

#include "core/error.h"

namespace kvtier::kv {

BlockTable::BlockTable(uint32_t n_seqs, std::vector<uint32_t> groups, int64_t max_blocks)
    : n_seqs_(n_seqs), groups_(std::move(groups)), max_blocks_(max_blocks) {
  KVTIER_ASSERT(n_seqs > 0 && max_blocks > 0);
  for (uint32_t g : groups_) {
    layer_off_.push_back(per_seq_);
    per_seq_ += size_t{g} * static_cast<size_t>(max_blocks_);
  }
  entries_.resize(per_seq_ * n_seqs_);
  first_.assign(size_t{n_seqs_} * groups_.size(), 0);
}

uint64_t BlockTable::bytes(uint32_t n_seqs, std::span<const uint32_t> groups, int64_t max_blocks) {
  uint64_t per_seq = 0;
  for (uint32_t g : groups) per_seq += uint64_t{g} * static_cast<uint64_t>(max_blocks);
  return uint64_t{n_seqs} * (per_seq * sizeof(BlockEntry) + groups.size() * sizeof(int64_t));
}

size_t BlockTable::index(SeqId seq, uint32_t layer, uint32_t group, int64_t block) const {
  KVTIER_ASSERT(
      seq < n_seqs_ && layer < groups_.size() && group < groups_[layer] && block >= 0 && block < max_blocks_,
      "block table entry (seq {}, layer {}, group {}, block {})", seq, layer, group, block);
  return seq * per_seq_ + layer_off_[layer] + size_t{group} * static_cast<size_t>(max_blocks_) +
         static_cast<size_t>(block);
}

BlockEntry& BlockTable::at(SeqId seq, uint32_t layer, uint32_t group, int64_t block) {
  return entries_[index(seq, layer, group, block)];
}

const BlockEntry& BlockTable::at(SeqId seq, uint32_t layer, uint32_t group, int64_t block) const {
  return entries_[index(seq, layer, group, block)];
}

std::span<const SlotRun> coalesce(std::span<const uint32_t> slots, std::span<SlotRun> out) {
  KVTIER_ASSERT(out.size() >= slots.size(), "{} runs for {} slots", out.size(), slots.size());
  size_t n = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (n > 0 && out[n - 1].slot + out[n - 1].count == slots[i]) {
      ++out[n - 1].count;
    } else {
      out[n++] = {i, slots[i], 1};
    }
  }
  return out.first(n);
}

}  // namespace kvtier::kv
