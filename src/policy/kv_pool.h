// InfiniGen's bounded KV pool (spec infinigen.md §8, §15.13), pure decisions: the slots of one
// (layer, sequence, KV head) pool of a fixed capacity, which slot a new token takes, and the use
// counts that choose victims. The kv layer moves the bytes: a token's K, V and partial-key rows all
// go to the slot insert() returns.
//
//   Counter (the paper's default): each fetch adds 1 to the slot's uint8 counter; when a counter at
//           255 is fetched again, every counter of the pool is halved first. Victim: the smallest
//           counter.
//   FIFO:   victim: the oldest token (smallest position).
//   LRU:    victim: the slot fetched least recently (a new token counts as used at its insert step).
// Victims come from the older half only (position < new position / 2, as [R]), so a fresh token
// with a zero count is not evicted at once; when no slot is that old, from all slots. Ties go to the
// lowest slot.
//
// A prompt larger than the pool (spec §15.13), PoolPrefill::kWeight ([D]): a prefill token's victim
// under Counter and LRU is the slot with the smallest cumulative prefill attention weight (add_mass:
// the softmax probability the prefill passes' queries gave the slot's row, summed over queries and
// the KV head's query heads), since no row has been fetched yet and their counters and last uses say
// nothing. kOrder: as at decode. FIFO stays by age.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace kvtier::policy {

enum class PoolEviction { kCounter, kFifo, kLru };
// How a prefill token picks its victim under Counter and LRU (FIFO: by age either way).
//   weight: the least cumulative prefill attention weight (spec §15.13 [D]);
//   order:  as at decode, where no row has been fetched yet at prefill: the lowest slot of the older
//           half (the oldest rows while slots follow positions).
enum class PoolPrefill { kWeight, kOrder };

std::string_view pool_eviction_name(PoolEviction e);
// Throws Error(kInvalidArgument) listing the known names.
PoolEviction parse_pool_eviction(std::string_view name);
std::string_view pool_prefill_name(PoolPrefill p);
PoolPrefill parse_pool_prefill(std::string_view name);  // Error(kInvalidArgument) listing the known

// Slots per (layer, sequence, KV head) for a limit of `limit_bytes` of KV over n_layer layers,
// n_seq sequences and n_head_kv heads of K and V rows of row_bytes each (§15.14); 0 when none fit.
int64_t pool_slots(uint64_t limit_bytes, int64_t n_layer, int64_t n_seq, int64_t n_head_kv,
                   uint64_t row_bytes);

class PoolSlots {
 public:
  PoolSlots(int64_t capacity, PoolEviction eviction, PoolPrefill prefill = PoolPrefill::kOrder);

  struct Insert {
    int32_t slot = 0;
    int64_t evicted = -1;  // the position whose rows the slot held, -1 for a free slot
  };
  // The slot for the token at `position` (positions increase), inserted at decode step `step`;
  // `prefill`: the token comes in a prefill pass (a victim by prefill attention weight, see above).
  Insert insert(int64_t position, int64_t step, bool prefill = false);
  // Adds prefill attention weight to the row the slot holds (a new row starts at 0).
  void add_mass(int32_t slot, float mass) { mass_[static_cast<size_t>(slot)] += mass; }
  // The slots fetched at `step` (distinct): counters and last use.
  void touch(std::span<const int32_t> slots, int64_t step);

  int64_t capacity() const { return capacity_; }
  int64_t live() const { return live_; }
  int64_t evictions() const { return evictions_; }
  int64_t position(int32_t slot) const { return pos_[static_cast<size_t>(slot)]; }
  uint8_t counter(int32_t slot) const { return counter_[static_cast<size_t>(slot)]; }
  float mass(int32_t slot) const { return mass_[static_cast<size_t>(slot)]; }
  // Does a prefill token's eviction read the attention weights (Counter and LRU)?
  bool uses_mass() const { return prefill_ == PoolPrefill::kWeight && eviction_ != PoolEviction::kFifo; }

 private:
  int32_t victim(int64_t position, bool prefill) const;

  int64_t capacity_;
  PoolEviction eviction_;
  PoolPrefill prefill_;
  int64_t live_ = 0;
  int64_t evictions_ = 0;
  std::vector<int64_t> pos_;        // [capacity] position of each slot's token
  std::vector<uint8_t> counter_;    // [capacity] Counter
  std::vector<int64_t> last_used_;  // [capacity] LRU: step of the last fetch (or insert)
  std::vector<float> mass_;         // [capacity] cumulative prefill attention weight of the slot's row
};

}  // namespace kvtier::policy
