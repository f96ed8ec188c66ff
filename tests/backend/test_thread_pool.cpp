#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

namespace kvtier {
namespace {

TEST(SplitRange, CoversInOrderAligned) {
  for (int64_t total : {0, 1, 15, 16, 17, 100, 1000}) {
    for (int parts = 1; parts <= 5; ++parts) {
      for (int64_t align : {1, 16}) {
        int64_t next = 0;
        for (int p = 0; p < parts; ++p) {
          const Range r = split_range(total, parts, p, align);
          EXPECT_EQ(r.begin, next);
          EXPECT_LE(r.begin, r.end);
          if (r.end != total) {
            EXPECT_EQ(r.end % align, 0);
          }
          next = r.end;
        }
        EXPECT_EQ(next, total);
      }
    }
  }
}

TEST(ThreadPool, EveryTaskRunsOnceOnItsOwnThread) {
  for (int n = 1; n <= 4; ++n) {
    ThreadPool pool(n);
    for (int round = 0; round < 50; ++round) {
      for (int used = 0; used <= n; ++used) {
        std::vector<int> hits(static_cast<size_t>(n), 0);
        std::vector<std::thread::id> ids(static_cast<size_t>(n));
        pool.run(used, [&](int i) {
          ++hits[static_cast<size_t>(i)];  // each index is written by one task only
          ids[static_cast<size_t>(i)] = std::this_thread::get_id();
        });
        for (int i = 0; i < n; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)], i < used ? 1 : 0);
        if (used >= 1) {
          EXPECT_EQ(ids[0], std::this_thread::get_id());
        }
        for (int i = 1; i < used; ++i) EXPECT_NE(ids[static_cast<size_t>(i)], std::this_thread::get_id());
      }
    }
  }
}

TEST(ThreadPool, DeterministicPartialSums) {
  // Float sums split by split_range: identical across repetitions for a fixed thread count.
  std::vector<float> data(10007);
  for (size_t i = 0; i < data.size(); ++i) data[i] = 1.0f / static_cast<float>(i + 1);
  for (int n = 1; n <= 4; ++n) {
    ThreadPool pool(n);
    float first = 0.0f;
    for (int round = 0; round < 20; ++round) {
      std::vector<float> partial(static_cast<size_t>(n), 0.0f);
      pool.run(n, [&](int p) {
        const Range r = split_range(static_cast<int64_t>(data.size()), n, p, 16);
        float s = 0.0f;
        for (int64_t i = r.begin; i < r.end; ++i) s += data[static_cast<size_t>(i)];
        partial[static_cast<size_t>(p)] = s;
      });
      float total = 0.0f;
      for (float s : partial) total += s;
      if (round == 0) first = total;
      EXPECT_EQ(total, first);
    }
  }
}

TEST(ThreadPool, ExceptionsReachTheCaller) {
  ThreadPool pool(3);
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.run(3,
                        [&](int i) {
                          ++ran;
                          if (i == 2) throw std::runtime_error("task 2");
                        }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 3);
  // The pool stays usable.
  std::atomic<int> again{0};
  pool.run(3, [&](int) { ++again; });
  EXPECT_EQ(again.load(), 3);
}

// Hand-off under each waiting mode: no polling (every hand-off sleeps), the default polling, and
// polling with pauses between runs longer than the poll, so workers fall asleep and are woken.
TEST(ThreadPool, HandOffSleepingAndPolling) {
  using std::chrono::microseconds;
  for (const microseconds spin : {microseconds{0}, ThreadPool::kDefaultSpin, microseconds{20}}) {
    for (int n = 2; n <= 4; ++n) {
      ThreadPool pool(n, spin);
      std::vector<int> hits(static_cast<size_t>(n), 0);
      int64_t expected_total = 0;
      for (int round = 0; round < 2000; ++round) {
        const int used = 1 + round % n;  // a varying task count leaves some workers out of a run
        pool.run(used, [&](int i) { ++hits[static_cast<size_t>(i)]; });
        expected_total += used;
        if (spin.count() == 20 && round % 100 == 0) std::this_thread::sleep_for(microseconds{300});
      }
      int64_t total = 0;
      for (int i = 0; i < n; ++i) {
        int expect = 0;
        for (int round = 0; round < 2000; ++round) expect += (i < 1 + round % n) ? 1 : 0;
        EXPECT_EQ(hits[static_cast<size_t>(i)], expect) << "task " << i << ", spin " << spin.count();
        total += hits[static_cast<size_t>(i)];
      }
      EXPECT_EQ(total, expected_total);
    }
  }
}

// Results written by workers are visible to the caller when run() returns, in every waiting mode.
TEST(ThreadPool, WorkersWritesVisibleAfterRun) {
  for (const auto spin : {std::chrono::microseconds{0}, ThreadPool::kDefaultSpin}) {
    ThreadPool pool(2, spin);
    std::vector<uint64_t> out(2, 0);
    for (uint64_t round = 1; round <= 5000; ++round) {
      pool.run(2, [&](int i) { out[static_cast<size_t>(i)] = round * 2 + static_cast<uint64_t>(i); });
      ASSERT_EQ(out[1], round * 2 + 1);
    }
  }
}

// Polling is off with no spin, with more threads than CPUs, and once runs keep waiting for workers
// that finish far later than the caller (what a worker without a CPU looks like).
TEST(ThreadPool, PollsOnlyWhenItPays) {
  EXPECT_FALSE(ThreadPool(2, std::chrono::microseconds{0}).polls());
  EXPECT_FALSE(ThreadPool(static_cast<int>(std::thread::hardware_concurrency()) + 1).polls());
  ThreadPool pool(2);
  if (!pool.polls()) GTEST_SKIP() << "this process has a single CPU";
  for (int i = 0; i < 5; ++i) {
    pool.run(2, [](int part) {
      if (part == 1) std::this_thread::sleep_for(std::chrono::milliseconds{5});
    });
  }
  EXPECT_FALSE(pool.polls());
  // Still correct while sleeping between runs.
  std::vector<int> hits(2, 0);
  for (int i = 0; i < 100; ++i) pool.run(2, [&](int part) { ++hits[static_cast<size_t>(part)]; });
  EXPECT_EQ(hits, (std::vector<int>{100, 100}));
}

// A pool that was never used, or is idle and asleep, shuts down promptly.
TEST(ThreadPool, ShutsDownWhenIdle) {
  { ThreadPool unused(4); }
  ThreadPool pool(3, std::chrono::microseconds{10});
  pool.run(3, [](int) {});
  std::this_thread::sleep_for(std::chrono::milliseconds{5});
}

}  // namespace
}  // namespace kvtier
