#include "policy/kv_pool.h"

#include <algorithm>

#include "core/error.h"

namespace kvtier::policy {

std::string_view pool_eviction_name(PoolEviction e) {
  switch (e) {
    case PoolEviction::kCounter:
      return "counter";
    case PoolEviction::kFifo:
      return "fifo";
    case PoolEviction::kLru:
      return "lru";
  }
  return "?";
}

PoolEviction parse_pool_eviction(std::string_view name) {
  for (const PoolEviction e : {PoolEviction::kCounter, PoolEviction::kFifo, PoolEviction::kLru})
    if (pool_eviction_name(e) == name) return e;
  fail(ErrorKind::kInvalidArgument, "unknown pool eviction '{}' (known: counter, fifo, lru)", name);
}

int64_t pool_slots(uint64_t limit_bytes, int64_t n_layer, int64_t n_seq, int64_t n_head_kv,
                   uint64_t row_bytes) {
  KVTIER_ASSERT(n_layer >= 1 && n_seq >= 1 && n_head_kv >= 1 && row_bytes >= 1);
  const uint64_t per_slot = static_cast<uint64_t>(n_layer) * static_cast<uint64_t>(n_seq) *
                            static_cast<uint64_t>(n_head_kv) * 2 * row_bytes;
  return static_cast<int64_t>(limit_bytes / per_slot);
}

std::string_view pool_prefill_name(PoolPrefill p) {
  return p == PoolPrefill::kWeight ? "weight" : "order";
}

PoolPrefill parse_pool_prefill(std::string_view name) {
  for (const PoolPrefill p : {PoolPrefill::kWeight, PoolPrefill::kOrder})
    if (pool_prefill_name(p) == name) return p;
  fail(ErrorKind::kInvalidArgument, "unknown pool prefill rule '{}' (known: weight, order)", name);
}

PoolSlots::PoolSlots(int64_t capacity, PoolEviction eviction, PoolPrefill prefill)
    : capacity_(capacity),
      eviction_(eviction),
      prefill_(prefill),
      pos_(static_cast<size_t>(capacity), -1),
      counter_(static_cast<size_t>(capacity), 0),
      last_used_(static_cast<size_t>(capacity), 0),
      mass_(static_cast<size_t>(capacity), 0.0f) {
  if (capacity < 1) fail(ErrorKind::kBudget, "a KV pool of {} slots cannot hold a token", capacity);
}

int32_t PoolSlots::victim(int64_t position, bool prefill) const {
  const bool by_mass = prefill && uses_mass();
  auto better = [&](size_t a, size_t b) {  // a is a better victim than b (ties: the lower slot wins by order)
    if (by_mass) return mass_[a] < mass_[b];
    switch (eviction_) {
      case PoolEviction::kCounter:
        return counter_[a] < counter_[b];
      case PoolEviction::kFifo:
        return pos_[a] < pos_[b];
      case PoolEviction::kLru:
        return last_used_[a] < last_used_[b];
    }
    return false;
  };
  const int64_t older = position / 2;
  for (const bool only_old : {true, false}) {
    size_t best = pos_.size();
    for (size_t i = 0; i < pos_.size(); ++i) {
      if (only_old && pos_[i] >= older) continue;
      if (best == pos_.size() || better(i, best)) best = i;
    }
    if (best != pos_.size()) return static_cast<int32_t>(best);
  }
  KVTIER_ASSERT(false, "a full pool without slots");
  return 0;
}

PoolSlots::Insert PoolSlots::insert(int64_t position, int64_t step, bool prefill) {
  Insert r;
  if (live_ < capacity_) {
    r.slot = static_cast<int32_t>(live_++);
  } else {
    r.slot = victim(position, prefill);
    r.evicted = pos_[static_cast<size_t>(r.slot)];
    ++evictions_;
  }
  const auto i = static_cast<size_t>(r.slot);
  pos_[i] = position;
  counter_[i] = 0;
  last_used_[i] = step;
  mass_[i] = 0.0f;
  return r;
}

void PoolSlots::touch(std::span<const int32_t> slots, int64_t step) {
  for (const int32_t s : slots) {
    KVTIER_ASSERT(s >= 0 && s < live_, "slot {} of a pool with {} live", s, live_);
    const auto i = static_cast<size_t>(s);
    if (counter_[i] == 255)
      for (uint8_t& c : counter_) c = static_cast<uint8_t>(c >> 1);
    ++counter_[i];
    last_used_[i] = step;
  }
}

}  // namespace kvtier::policy
