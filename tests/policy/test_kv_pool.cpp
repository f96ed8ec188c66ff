// InfiniGen's bounded KV pool decisions (spec infinigen.md §8; §14 A8, the pure parts).
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "policy/kv_pool.h"

namespace kvtier::policy {
namespace {

TEST(KvPool, NoEvictionWhileTheLimitHoldsEveryToken) {
  for (const PoolEviction e : {PoolEviction::kCounter, PoolEviction::kFifo, PoolEviction::kLru}) {
    PoolSlots p(100, e);
    for (int64_t t = 0; t < 100; ++t) {
      const auto r = p.insert(t, t);
      EXPECT_EQ(r.slot, t);
      EXPECT_EQ(r.evicted, -1);
    }
    EXPECT_EQ(p.evictions(), 0);
    EXPECT_EQ(p.live(), 100);
  }
}

TEST(KvPool, CounterSaturatesAt255AndThenHalvesEveryCounter) {
  PoolSlots p(4, PoolEviction::kCounter);
  for (int64_t t = 0; t < 4; ++t) p.insert(t, 0);
  const std::vector<int32_t> zero = {0}, one = {1};
  for (int i = 0; i < 255; ++i) p.touch(zero, i);
  for (int i = 0; i < 11; ++i) p.touch(one, i);
  EXPECT_EQ(p.counter(0), 255);
  EXPECT_EQ(p.counter(1), 11);
  p.touch(zero, 300);  // 255 fetched again: every counter halved, then this one counts
  EXPECT_EQ(p.counter(0), 128);
  EXPECT_EQ(p.counter(1), 5);
  EXPECT_EQ(p.counter(2), 0);
}

TEST(KvPool, CounterEvictsTheLeastFetchedOfTheOlderHalfLowestSlotFirst) {
  PoolSlots p(8, PoolEviction::kCounter);
  for (int64_t t = 0; t < 8; ++t) p.insert(t, 0);
  const std::vector<int32_t> hot = {0, 1, 3, 4, 5, 6, 7};  // slot 2 never fetched
  p.touch(hot, 1);
  auto r = p.insert(8, 2);  // older half: positions < 4, i.e. slots 0..3; slot 2 has count 0
  EXPECT_EQ(r.slot, 2);
  EXPECT_EQ(r.evicted, 2);
  EXPECT_EQ(p.position(2), 8);
  EXPECT_EQ(p.counter(2), 0);
  // Slots 0, 1, 3 (positions < 4.5) tie at 1: the lowest slot goes. The fresh slot 2 (count 0) is
  // not eligible: position 8 is not in the older half.
  r = p.insert(9, 3);
  EXPECT_EQ(r.slot, 0);
  EXPECT_EQ(r.evicted, 0);
}

TEST(KvPool, FifoEvictsTheOldestAndLruTheLeastRecentlyFetched) {
  PoolSlots fifo(4, PoolEviction::kFifo), lru(4, PoolEviction::kLru);
  for (int64_t t = 0; t < 4; ++t) {
    fifo.insert(t, t);
    lru.insert(t, t);
  }
  const std::vector<int32_t> first = {0};
  fifo.touch(first, 10);
  lru.touch(first, 10);
  EXPECT_EQ(fifo.insert(10, 11).evicted, 0);  // oldest, however often fetched
  EXPECT_EQ(lru.insert(10, 11).evicted, 1);   // slot 0 was fetched at step 10; slot 1 last at 1
}

// Spec §15.13 [D] (PoolPrefill::kWeight): a prefill token's victim under Counter and LRU is the
// older-half slot with the least prefill attention weight; a decode token's is still by counter / last
// use, and FIFO's by age. With kOrder (the default) the weights are not read.
TEST(KvPool, APrefillTokenEvictsTheLeastAttendedRowUnderCounterAndLru) {
  for (const PoolEviction e : {PoolEviction::kCounter, PoolEviction::kLru, PoolEviction::kFifo}) {
    SCOPED_TRACE(std::string(pool_eviction_name(e)));
    PoolSlots p(8, e, PoolPrefill::kWeight);
    for (int64_t t = 0; t < 8; ++t) p.insert(t, 0, true);
    const float mass[8] = {5.0f, 0.5f, 0.25f, 2.0f, 0.1f, 3.0f, 3.0f, 3.0f};  // slot 4: not older half
    for (int32_t s = 0; s < 8; ++s) p.add_mass(s, mass[s]);
    EXPECT_EQ(p.mass(2), 0.25f);
    auto r = p.insert(8, 1, true);  // older half: positions < 4
    EXPECT_EQ(r.evicted, e == PoolEviction::kFifo ? 0 : 2);
    EXPECT_EQ(p.mass(r.slot), 0.0f);  // the new row starts unweighed
    // a decode step ignores the weights: Counter's counters tie at 0 and LRU's inserts tie at step 0
    // among the older half (positions < 4.5), so the lowest slot goes; FIFO the oldest
    r = p.insert(9, 2, false);
    EXPECT_EQ(r.evicted, e == PoolEviction::kFifo ? 1 : 0);
    // order: the same weights, the lowest slot of the older half
    PoolSlots q(8, e, PoolPrefill::kOrder);
    for (int64_t t = 0; t < 8; ++t) q.insert(t, 0, true);
    for (int32_t s = 0; s < 8; ++s) q.add_mass(s, mass[s]);
    EXPECT_FALSE(q.uses_mass());
    EXPECT_EQ(q.insert(8, 1, true).evicted, 0);
  }
  EXPECT_EQ(parse_pool_prefill("weight"), PoolPrefill::kWeight);
  EXPECT_EQ(pool_prefill_name(PoolPrefill::kOrder), "order");
  EXPECT_THROW(parse_pool_prefill("attention"), Error);
}

TEST(KvPool, VictimsComeOnlyFromTheOlderHalfWhileThereIsOne) {
  for (const PoolEviction e : {PoolEviction::kCounter, PoolEviction::kFifo, PoolEviction::kLru}) {
    PoolSlots p(64, e);
    std::set<int64_t> held;
    int64_t checked = 0;
    for (int64_t t = 0; t < 120; ++t) {
      const bool has_old = !held.empty() && *held.begin() < t / 2;
      const auto r = p.insert(t, t);
      if (r.evicted >= 0) {
        if (has_old) {
          EXPECT_LT(r.evicted, t / 2) << pool_eviction_name(e) << " at " << t;
          ++checked;
        }
        EXPECT_EQ(held.erase(r.evicted), 1u);
      }
      held.insert(t);
      // Fetch the old tokens only: by count or recency the newest would be the victims, were they
      // eligible.
      std::vector<int32_t> old;
      for (int32_t s = 0; s < p.live(); ++s)
        if (p.position(s) < 40) old.push_back(s);
      p.touch(old, t);
    }
    EXPECT_GT(checked, 20) << pool_eviction_name(e);
    EXPECT_EQ(static_cast<int64_t>(held.size()), 64);
    EXPECT_EQ(p.evictions(), 120 - 64);
  }
}

TEST(KvPool, WithoutAnOldSlotTheVictimComesFromAll) {
  PoolSlots p(2, PoolEviction::kCounter);
  p.insert(10, 0);
  p.insert(11, 0);
  EXPECT_EQ(p.insert(12, 1).slot, 0);  // 12 / 2 = 6: no slot is that old
}

TEST(KvPool, NamesSlotsAndErrors) {
  EXPECT_EQ(parse_pool_eviction("counter"), PoolEviction::kCounter);
  EXPECT_EQ(parse_pool_eviction("fifo"), PoolEviction::kFifo);
  EXPECT_EQ(parse_pool_eviction("lru"), PoolEviction::kLru);
  EXPECT_THROW(parse_pool_eviction("random"), Error);
  // 2 layers x 1 sequence x 3 heads x (K + V) x 128 B = 1536 B per slot.
  EXPECT_EQ(pool_slots(1536 * 10 + 5, 2, 1, 3, 128), 10);
  EXPECT_EQ(pool_slots(100, 2, 1, 3, 128), 0);
  EXPECT_THROW(PoolSlots(0, PoolEviction::kCounter), Error);
}

}  // namespace
}  // namespace kvtier::policy
