// The transfer engine's two phases: prepare pins the home blocks and the buffer of a job, completion
// unpins; a pinned block cannot be released; adjacent blocks coalesce into one I/O; errors release
// pins too. Then the same on TieredKv: truncate waits for in-flight (delayed) copies, and loads of
// long histories are fewer runs than blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include "core/error.h"
#include "kv/block_pool.h"
#include "kv/tiered_kv.h"
#include "kv/transfer_engine.h"

namespace kvtier::kv {
namespace {

constexpr uint64_t kBlock = 4096;

// A home tier in memory whose I/O waits until the test opens a gate; counts I/O calls.
class GatedStore final : public HomeStore {
 public:
  explicit GatedStore(uint64_t bytes) : data_(bytes) {
    for (size_t i = 0; i < data_.size(); ++i) data_[i] = static_cast<uint8_t>(i * 7 + 1);
  }
  Tier tier() const override { return Tier::kHost; }
  uint64_t alignment() const override { return 1; }
  uint64_t size() const override { return data_.size(); }
  void read(uint64_t offset, uint8_t* dst, uint64_t bytes) override {
    pass_gate();
    if (fail_) fail(ErrorKind::kIo, "injected read failure");
    std::memcpy(dst, data_.data() + offset, bytes);
    ++reads;
    read_bytes += bytes;
  }
  void write(uint64_t offset, const uint8_t* src, uint64_t bytes) override {
    pass_gate();
    std::memcpy(data_.data() + offset, src, bytes);
    ++writes;
  }
  std::string describe() const override { return "gated test store"; }
  uint64_t gather_gap() const override { return gap; }

  void close_gate() {
    std::lock_guard<std::mutex> lk(mu_);
    open_ = false;
  }
  void open_gate() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void fail_reads() { fail_ = true; }
  const uint8_t* bytes(uint64_t offset) const { return data_.data() + offset; }

  // Read by the test only after the engine drained (the copy thread wrote them before completing).
  uint64_t reads = 0, writes = 0, read_bytes = 0;
  uint64_t gap = 0;  // gather_gap()

 private:
  void pass_gate() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return open_; });
  }
  std::vector<uint8_t> data_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  bool fail_ = false;
};

TEST(TransferEngine, PrepareRequiresCompletionBeforeARelease) {
  MemoryLedger ledger;
  GatedStore store(16 * kBlock);
  BlockPool buffers(ledger, Tier::kDevice, 4 * kBlock, 2, 4096);
  const uint32_t slot = buffers.acquire();
  TransferEngine engine(store, kBlock, 4, 8);

  store.close_gate();
  const BlockCopy blocks[] = {{2 * kBlock, buffers.data(slot), kBlock},
                              {3 * kBlock, buffers.data(slot) + kBlock, kBlock}};
  const auto t = engine.prepare(CopyDir::kLoad, blocks, {&buffers, slot});
  // In flight: the buffer slot and both home blocks are pinned; nothing else is.
  EXPECT_EQ(buffers.pins(slot), 1u);
  EXPECT_EQ(engine.home_pins().pins(2), 1u);
  EXPECT_EQ(engine.home_pins().pins(3), 1u);
  EXPECT_EQ(engine.home_pins().pinned_blocks(), 2u);
  EXPECT_TRUE(engine.home_pinned(3 * kBlock + 100, 1));
  EXPECT_FALSE(engine.home_pinned(4 * kBlock, kBlock));
  EXPECT_FALSE(engine.done(t));
  try {
    buffers.release(slot);
    ADD_FAILURE() << "a pinned block was released";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    EXPECT_NE(std::string(e.what()).find("transfer"), std::string::npos) << e.what();
  }
  // A second job on the same block stacks a second pin.
  const auto t2 = engine.prepare(CopyDir::kStore, std::span(blocks, 1), {&buffers, slot});
  EXPECT_EQ(buffers.pins(slot), 2u);
  EXPECT_EQ(engine.home_pins().pins(2), 2u);

  store.open_gate();
  engine.wait(t);
  engine.wait(t2);
  EXPECT_EQ(buffers.pins(slot), 0u);
  EXPECT_EQ(engine.home_pins().pinned_blocks(), 0u);
  EXPECT_EQ(std::memcmp(buffers.data(slot), store.bytes(2 * kBlock), 2 * kBlock), 0);
  buffers.release(slot);  // unpinned: allowed
}

TEST(TransferEngine, AdjacentBlocksCoalesceIntoOneIo) {
  MemoryLedger ledger;
  GatedStore store(32 * kBlock);
  BlockPool buffers(ledger, Tier::kDevice, 16 * kBlock, 1, 4096);
  uint8_t* buf = buffers.data(buffers.acquire());
  TransferEngine engine(store, kBlock, 4, 16);

  // 8 blocks contiguous in the home tier and in the buffer: one run of 8 blocks.
  std::vector<BlockCopy> contiguous;
  for (uint64_t i = 0; i < 8; ++i) contiguous.push_back({(4 + i) * kBlock, buf + i * kBlock, kBlock});
  engine.wait(engine.prepare(CopyDir::kLoad, contiguous));
  EXPECT_EQ(store.reads, 1u);
  EXPECT_EQ(store.read_bytes, 8 * kBlock);
  EXPECT_EQ(std::memcmp(buf, store.bytes(4 * kBlock), 8 * kBlock), 0);
  auto st = engine.stats();
  EXPECT_EQ(st.blocks, 8u);
  EXPECT_EQ(st.runs, 1u);

  // Every other home block: no two are adjacent, 8 runs.
  std::vector<BlockCopy> strided;
  for (uint64_t i = 0; i < 8; ++i) strided.push_back({2 * i * kBlock, buf + i * kBlock, kBlock});
  engine.wait(engine.prepare(CopyDir::kLoad, strided));
  EXPECT_EQ(store.reads, 9u);
  // Adjacent in the home tier but not in the buffer: not merged either.
  const BlockCopy split[] = {{0, buf, kBlock}, {kBlock, buf + 2 * kBlock, kBlock}};
  engine.wait(engine.prepare(CopyDir::kLoad, split));
  EXPECT_EQ(store.reads, 11u);
  // Partial blocks that continue each other merge as well (a run need not be block-aligned).
  const BlockCopy partial[] = {{kBlock - 100, buf, 100}, {kBlock, buf + 100, 50}};
  engine.wait(engine.prepare(CopyDir::kStore, partial));
  EXPECT_EQ(store.writes, 1u);
  // One copy may name an extent of several blocks: it pins (and counts) every block it overlaps.
  const BlockCopy extent[] = {{kBlock + 1, buf, 3 * kBlock}};
  store.close_gate();
  const auto t = engine.prepare(CopyDir::kLoad, extent);
  EXPECT_EQ(engine.home_pins().pinned_blocks(), 4u);
  store.open_gate();
  engine.wait(t);
  st = engine.stats();
  EXPECT_EQ(st.blocks, 8u + 8u + 2u + 2u + 4u);
  EXPECT_EQ(st.runs, 1u + 8u + 2u + 1u + 1u);
  EXPECT_EQ(engine.home_pins().pinned_blocks(), 0u);
}

// A gather may read through gaps of at most gather_gap() bytes between copies that keep the same
// home-to-buffer displacement; the named bytes land where they would without merging, the gaps are
// counted as slack, and exact loads and stores never merge across a gap.
TEST(TransferEngine, GathersReadThroughShortGapsAndCountTheSlack) {
  MemoryLedger ledger;
  GatedStore store(64 * kBlock);
  store.gap = 2 * kBlock;
  BlockPool buffers(ledger, Tier::kDevice, 64 * kBlock, 1, 4096);
  uint8_t* buf = buffers.data(buffers.acquire());
  TransferEngine engine(store, kBlock, 4, 16);
  // Rows of 100 bytes at home offsets = buffer offsets: gaps of 300 B, 2 blocks (merged), 2 blocks + 1
  // (not merged); then a copy with another displacement (not merged whatever its gap).
  const BlockCopy copies[] = {
      {1000, buf + 1000, 100},
      {1400, buf + 1400, 100},                                    // gap 300
      {1500 + 2 * kBlock, buf + 1500 + 2 * kBlock, 100},          // gap 2 blocks: merged
      {1600 + 4 * kBlock + 1, buf + 1600 + 4 * kBlock + 1, 100},  // gap 2 blocks + 1: a new run
      {1800 + 4 * kBlock, buf + 10 * kBlock, 100},                // other displacement: a new run
  };
  std::memset(buf, 0xEE, 64 * kBlock);
  engine.wait(engine.prepare(CopyDir::kLoad, copies, {}, Gaps::kGather));
  EXPECT_EQ(store.reads, 3u);
  auto st = engine.stats();
  EXPECT_EQ(st.runs, 3u);
  EXPECT_EQ(st.slack_bytes, 300 + 2 * kBlock);
  EXPECT_EQ(st.bytes_loaded, 5 * 100 + st.slack_bytes);
  EXPECT_EQ(store.read_bytes, st.bytes_loaded);
  for (const BlockCopy& c : copies) EXPECT_EQ(std::memcmp(c.buf, store.bytes(c.home_offset), c.bytes), 0);
  EXPECT_EQ(buf[999], 0xEE);  // before the first copy and after the runs: untouched
  EXPECT_EQ(buf[1600 + 4 * kBlock], 0xEE);
  EXPECT_EQ(buf[1700 + 4 * kBlock + 1], 0xEE);
  // The same copies as an exact load, and as a store: one run each, no slack.
  engine.wait(engine.prepare(CopyDir::kLoad, copies));
  engine.wait(engine.prepare(CopyDir::kStore, copies, {}, Gaps::kGather));
  st = engine.stats();
  EXPECT_EQ(st.runs, 3u + 5u + 5u);
  EXPECT_EQ(st.slack_bytes, 300 + 2 * kBlock);
  EXPECT_EQ(store.writes, 5u);
  // Without a gather gap (host memory), a gather is exact too.
  store.gap = 0;
  engine.wait(engine.prepare(CopyDir::kLoad, copies, {}, Gaps::kGather));
  EXPECT_EQ(engine.stats().runs, 3u + 5u + 5u + 5u);
  EXPECT_EQ(engine.home_pins().pinned_blocks(), 0u);
}

// The disk home's batched reads (io_uring where built and allowed) land the same bytes as one read at a
// time: many extents (more than the queue depth), of 4 KiB to 1 MiB, in any order.
TEST(DiskStore, BatchedReadsMatchSingleReads) {
  MemoryLedger ledger;
  const auto dir = std::filesystem::path(KVTIER_BINARY_DIR) / "test_tmp" / "batch_disk";
  std::filesystem::create_directories(dir);
  constexpr uint64_t kSize = 8 << 20;
  auto store = make_disk_store(ledger, dir.string(), kSize);
  EXPECT_EQ(store->gather_gap(), store->queue_depth() > 1 ? kDiskGatherGap : kDiskGatherGapSerial);
  if (disk_io_uring_built() && store->describe().find("io_uring:") == std::string::npos) {
    EXPECT_EQ(store->queue_depth(), kDiskQueueDepth) << store->describe();
    EXPECT_NE(store->describe().find("io_uring reads"), std::string::npos) << store->describe();
  }
  BlockPool mem(ledger, Tier::kHost, kSize, 3, 4096);
  uint8_t* src = mem.data(mem.acquire());
  uint8_t* a = mem.data(mem.acquire());
  uint8_t* b = mem.data(mem.acquire());
  std::mt19937 rng(7);
  for (uint64_t i = 0; i < kSize; ++i) src[i] = static_cast<uint8_t>(rng());
  store->write(0, src, kSize);
  std::vector<BlockCopy> reads;
  uint64_t off = 0;
  while (off < kSize) {  // one extent of 1 MiB, then of 1..48 I/O pages, gaps of 0..3 pages; shuffled
    const uint64_t n = std::min<uint64_t>(off == 0 ? 256 * kBlock : (1 + rng() % 48) * kBlock, kSize - off);
    reads.push_back({off, a + off, n});
    off += n + (rng() % 4) * kBlock;
  }
  std::shuffle(reads.begin(), reads.end(), rng);
  ASSERT_GT(reads.size(), size_t{kDiskQueueDepth});
  std::memset(a, 0, kSize);
  std::memset(b, 0, kSize);
  store->read_batch(reads);
  for (const BlockCopy& r : reads) store->read(r.home_offset, b + r.home_offset, r.bytes);
  EXPECT_EQ(std::memcmp(a, b, kSize), 0);
  for (const BlockCopy& r : reads) EXPECT_EQ(std::memcmp(a + r.home_offset, src + r.home_offset, r.bytes), 0);
}

TEST(TransferEngine, AFailedCopyReleasesItsPinsAndStopsTheEngine) {
  MemoryLedger ledger;
  GatedStore store(8 * kBlock);
  BlockPool buffers(ledger, Tier::kDevice, kBlock, 2, 4096);
  const uint32_t a = buffers.acquire(), b = buffers.acquire();
  TransferEngine engine(store, kBlock, 4, 4);
  store.close_gate();
  store.fail_reads();
  const BlockCopy ja[] = {{0, buffers.data(a), kBlock}};
  const BlockCopy jb[] = {{kBlock, buffers.data(b), kBlock}};
  const auto ta = engine.prepare(CopyDir::kLoad, ja, {&buffers, a});
  const auto tb = engine.prepare(CopyDir::kLoad, jb, {&buffers, b});
  store.open_gate();
  EXPECT_THROW(engine.wait(ta), Error);
  EXPECT_THROW(engine.drain(), Error);  // returns only when the job behind the failed one completed
  EXPECT_TRUE(engine.done(tb));
  EXPECT_EQ(buffers.pinned_blocks(), 0u);
  EXPECT_EQ(engine.home_pins().pinned_blocks(), 0u);
  EXPECT_THROW(engine.prepare(CopyDir::kLoad, ja, {&buffers, a}), Error);
  buffers.release(a);
  buffers.release(b);
}

// TieredKv: one head per layer, dk = dv = 64 (f16: 128-byte rows, 64-token blocks = 8 KiB).
struct Pass {
  int64_t pos0, n;
};

void run_pass(TieredKv& kv, uint32_t layers, Pass p, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  EXPECT_EQ(kv.begin_pass({0, p.n}).pos0, p.pos0);
  for (uint32_t l = 0; l < layers; ++l) {
    std::vector<float> k(p.n * 64), v(p.n * 64), q(p.n * 2 * 64), o(p.n * 2 * 64);
    for (auto* vec : {&k, &v, &q}) {
      for (float& x : *vec) x = nd(rng);
    }
    kv.write(l, {k.data(), v.data()});
    kv.attend(l, q.data(), 2, {0.125f, 0.0f, 0}, o.data());
  }
  kv.end_pass();
}

TieredKv make_tiered(MemoryLedger& ledger, ThreadPool& pool, uint32_t layers, uint32_t delay_us) {
  KvGeometry g;
  g.n_head_kv.assign(layers, 1);
  g.head_dim_k = g.head_dim_v = 64;
  g.block_tokens = 64;
  TieredOptions o;
  o.placement.placement = policy::Placement::kHeadInfer;
  o.placement.group = 1;
  o.max_new_rows = 256;
  o.copy_delay_us = delay_us;
  return TieredKv(g, 1024, 2, ledger, pool, cpu::best_isa(), o);
}

TEST(TieredKv, TruncateWaitsForDelayedCopiesInFlight) {
  MemoryLedger ledger;
  ThreadPool pool(2);
  std::mt19937 rng(3);
  TieredKv kv = make_tiered(ledger, pool, 3, 40000);  // each copy job sleeps up to 40 ms first
  int64_t len = 0;
  int seen_pinned = 0;
  for (int round = 0; round < 4; ++round) {
    run_pass(kv, 3, {len, 100}, rng);
    len += 100;
    // The last unit's store and the next pass's prefetch are in flight, pinning their blocks.
    const auto before = kv.stats().transfer.jobs;
    const size_t pinned = kv.pinned_blocks();
    seen_pinned += pinned > 0;
    kv.truncate(0, len - 30);  // waits: every pin has dropped when it returns
    len -= 30;
    EXPECT_EQ(kv.pinned_blocks(), 0u);
    if (pinned > 0) {
      EXPECT_GT(kv.stats().transfer.jobs, before);
    }
  }
  EXPECT_GE(seen_pinned, 3) << "copies were expected to be in flight after most passes";
  EXPECT_EQ(kv.positions(0), len);
}

TEST(TieredKv, LoadsOfLongHistoriesCoalesceBlocksIntoRuns) {
  MemoryLedger ledger;
  ThreadPool pool(2);
  std::mt19937 rng(5);
  TieredKv kv = make_tiered(ledger, pool, 2, 0);
  for (int64_t pos = 0; pos < 768; pos += 256) run_pass(kv, 2, {pos, 256}, rng);
  run_pass(kv, 2, {768, 1}, rng);
  const auto st = kv.stats().transfer;
  // A unit's history of up to 768 rows is 12 blocks of 64 rows per plane, loaded as one run.
  EXPECT_GT(st.blocks, 3 * st.runs) << st.blocks << " blocks, " << st.runs << " runs";
}

}  // namespace
}  // namespace kvtier::kv
