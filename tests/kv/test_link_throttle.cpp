// The link throttle (--link-gbps): the pacing arithmetic with an injected clock (exact), then the
// transfer engine's loads under it, on the fake clock and once on the real one (only the cap is
// checked there: a busy machine can make copies slower, never faster).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "kv/block_pool.h"
#include "kv/link_pacer.h"
#include "kv/transfer_engine.h"

namespace kvtier::kv {
namespace {

// A clock that only moves when someone sleeps on it or the test (or a store) advances it.
class FakeClock final : public LinkClock {
 public:
  double now() override { return t_; }
  void sleep_until(double t) override {
    ++sleeps;
    if (t > t_) t_ = t;
  }
  void advance(double dt) { t_ += dt; }
  int sleeps = 0;

 private:
  double t_ = 100.0;
};

// A home tier in memory whose reads take `seconds_per_byte` of fake time (0: instant).
class FakeTimedStore final : public HomeStore {
 public:
  FakeTimedStore(uint64_t bytes, FakeClock& clock, double seconds_per_byte)
      : data_(bytes), clock_(clock), spb_(seconds_per_byte) {}
  Tier tier() const override { return Tier::kHost; }
  uint64_t alignment() const override { return 1; }
  uint64_t size() const override { return data_.size(); }
  void read(uint64_t offset, uint8_t* dst, uint64_t bytes) override {
    std::memcpy(dst, data_.data() + offset, bytes);
    clock_.advance(spb_ * static_cast<double>(bytes));
  }
  void write(uint64_t offset, const uint8_t* src, uint64_t bytes) override {
    std::memcpy(data_.data() + offset, src, bytes);
  }
  std::string describe() const override { return "fake-timed test store"; }

 private:
  std::vector<uint8_t> data_;
  FakeClock& clock_;
  double spb_;
};

TEST(LinkPacer, BackToBackTransfersTakeBytesOverRate) {
  FakeClock clock;
  LinkPacer pacer(1000.0, &clock, 0.0);  // 1000 B/s, no burst
  const double t0 = clock.now();
  double slept = 0;
  for (uint64_t bytes : {500u, 1500u, 1000u}) slept += pacer.finish(pacer.reserve(bytes));
  EXPECT_DOUBLE_EQ(clock.now() - t0, 3.0);  // 3000 B at 1000 B/s
  EXPECT_DOUBLE_EQ(slept, 3.0);
  EXPECT_EQ(clock.sleeps, 3);
}

TEST(LinkPacer, IdleTimeIsBankedOnlyUpToTheBurstAndSlowCopiesAreNotSlowedFurther) {
  FakeClock clock;
  LinkPacer pacer(100.0, &clock, 0.5);  // 100 B/s, half a second of burst
  pacer.finish(pacer.reserve(100));     // 1 s (the first transfer starts on the burst as well)
  clock.advance(10.0);                  // the link idles for 10 s
  const double t1 = clock.now();
  const double d = pacer.reserve(200);
  EXPECT_DOUBLE_EQ(d - t1, 1.5);  // 2 s for 200 B, less at most the 0.5 s burst (not the 10 s idle)
  pacer.finish(d);
  EXPECT_DOUBLE_EQ(clock.now() - t1, 1.5);
  // A copy slower than the link (3 s for 100 B): no extra sleep.
  const double t2 = clock.now();
  const double d2 = pacer.reserve(100);
  clock.advance(3.0);
  EXPECT_EQ(pacer.finish(d2), 0.0);
  EXPECT_DOUBLE_EQ(clock.now() - t2, 3.0);
  // Back-to-back bookings queue behind each other: two reservations before any copy.
  clock.advance(5.0);
  const double t3 = clock.now();
  const double a = pacer.reserve(100);
  const double b = pacer.reserve(100);
  EXPECT_DOUBLE_EQ(a - t3, 0.5);
  EXPECT_DOUBLE_EQ(b - t3, 1.5);
}

// A sleep that wakes late (a busy machine) is absorbed by the burst: the rate of back-to-back
// transfers stays at the cap instead of dropping by the lateness of every wake-up.
TEST(LinkPacer, LateWakeUpsDoNotLowerTheRate) {
  FakeClock clock;
  LinkPacer pacer(1000.0, &clock, 0.002);
  double first_start = 0;
  for (int i = 0; i < 100; ++i) {
    const double d = pacer.reserve(100);  // 0.1 s each
    if (i == 0) first_start = d - 0.1;
    pacer.finish(d);
    clock.advance(0.001);  // every wake-up 1 ms late
  }
  // 10 s of link time from the first booking; only the last wake-up's lateness remains.
  EXPECT_NEAR(clock.now() - first_start, 10.0 + 0.001, 1e-9);
}

TEST(LinkPacer, UnlimitedDoesNothing) {
  FakeClock clock;
  LinkPacer pacer(0, &clock, 0.0);
  EXPECT_FALSE(pacer.limited());
  EXPECT_EQ(pacer.finish(pacer.reserve(1u << 30)), 0.0);
  EXPECT_EQ(clock.sleeps, 0);
}

struct EngineRig {
  static constexpr uint64_t kJob = 64 * 1024;
  static constexpr int kJobs = 16;
  MemoryLedger ledger;
  BlockPool buffers{ledger, Tier::kDevice, kJob, 1, 4096};
  uint32_t slot = buffers.acquire();

  // Runs kJobs loads of kJob bytes (each a separate home region) and then as many stores.
  void run(TransferEngine& engine) {
    for (int j = 0; j < kJobs; ++j) {
      const BlockCopy c{static_cast<uint64_t>(j) * kJob, buffers.data(slot), kJob};
      engine.prepare(CopyDir::kLoad, {&c, 1}, {&buffers, slot});
    }
    engine.drain();
  }
  void store(TransferEngine& engine) {
    for (int j = 0; j < kJobs; ++j) {
      const BlockCopy c{static_cast<uint64_t>(j) * kJob, buffers.data(slot), kJob};
      engine.prepare(CopyDir::kStore, {&c, 1}, {&buffers, slot});
    }
    engine.drain();
  }
};

TEST(LinkThrottle, EngineLoadsMoveAtTheCapOnAnInjectedClock) {
  EngineRig rig;
  FakeClock clock;
  FakeTimedStore store(EngineRig::kJob * EngineRig::kJobs, clock, 0.0);  // an infinitely fast home tier
  const double cap = 1e6;                                                // 1 MB/s
  TransferEngine engine(store, 4096, 4, 4, 0, LinkLimit{cap, &clock});
  const double t0 = clock.now();
  rig.run(engine);
  const double bytes = static_cast<double>(EngineRig::kJob) * EngineRig::kJobs;
  const double burst = LinkPacer::kDefaultBurst;  // the idle link's banked time, used by the first job
  EXPECT_NEAR(clock.now() - t0, bytes / cap - burst, 1e-9);  // exact up to summation rounding
  const TransferStats st = engine.stats();
  EXPECT_EQ(st.bytes_loaded, static_cast<uint64_t>(bytes));
  EXPECT_NEAR(st.throttle_seconds, bytes / cap - burst, 1e-9);
  // Stores are not paced.
  const double t1 = clock.now();
  rig.store(engine);
  EXPECT_EQ(clock.now(), t1);
}

TEST(LinkThrottle, ASlowerHomeTierIsNotSlowedFurther) {
  EngineRig rig;
  FakeClock clock;
  const double home_rate = 5e5;  // the home tier itself moves 0.5 MB/s
  FakeTimedStore store(EngineRig::kJob * EngineRig::kJobs, clock, 1.0 / home_rate);
  TransferEngine engine(store, 4096, 4, 4, 0, LinkLimit{1e6, &clock});
  const double t0 = clock.now();
  rig.run(engine);
  const double bytes = static_cast<double>(EngineRig::kJob) * EngineRig::kJobs;
  EXPECT_NEAR(clock.now() - t0, bytes / home_rate, 1e-9);
  EXPECT_EQ(engine.stats().throttle_seconds, 0.0);
}

TEST(LinkThrottle, EngineWithoutALimitNeverSleeps) {
  EngineRig rig;
  FakeClock clock;
  FakeTimedStore store(EngineRig::kJob * EngineRig::kJobs, clock, 0.0);
  TransferEngine engine(store, 4096, 4, 4, 0, LinkLimit{0, &clock});
  rig.run(engine);
  EXPECT_EQ(clock.sleeps, 0);
  EXPECT_EQ(engine.stats().throttle_seconds, 0.0);
}

// The real clock: 4 MiB through a host store capped at 40 MB/s (~0.1 s). Only the upper bound is
// held: at most cap · (elapsed + burst) bytes (2 % here), 10 % allowed; sleeping can only lengthen the run.
TEST(LinkThrottle, RealClockRespectsTheCap) {
  MemoryLedger ledger;
  auto home = make_host_store(ledger, EngineRig::kJob * 64);
  BlockPool buffers(ledger, Tier::kDevice, EngineRig::kJob, 1, 4096);
  const uint32_t slot = buffers.acquire();
  const double cap = 40e6;
  TransferEngine engine(*home, 4096, 4, 4, 0, LinkLimit{cap, nullptr});
  const auto t0 = std::chrono::steady_clock::now();
  for (int j = 0; j < 64; ++j) {
    const BlockCopy c{static_cast<uint64_t>(j) * EngineRig::kJob, buffers.data(slot), EngineRig::kJob};
    engine.prepare(CopyDir::kLoad, {&c, 1}, {&buffers, slot});
  }
  engine.drain();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double rate = static_cast<double>(EngineRig::kJob) * 64 / dt;
  EXPECT_LE(rate, cap * 1.1) << "measured " << rate / 1e6 << " MB/s under a cap of " << cap / 1e6;
  EXPECT_GT(engine.stats().throttle_seconds, 0.0);
}

}  // namespace
}  // namespace kvtier::kv
