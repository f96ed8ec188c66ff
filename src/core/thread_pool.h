// A fixed pool of worker threads owned by the engine. `run(n, fn)` calls fn(i) for i in [0, n) with
// task i on a fixed thread (task 0 on the caller), so work is never oversubscribed and a kernel that
// splits its output by `split_range` is deterministic for a given thread count.
//
// Hand-off is spin-then-sleep: after a task, a worker polls for the next run() for `spin` before it
// blocks on a condition variable, and the caller polls for the workers' completion for as long before
// it blocks. Decode issues a few hundred small runs per token, microseconds apart; a futex wake per
// run would cost more than the work it splits. Idle pools sleep, so a waiting server burns no CPU.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvtier {

struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Part `part` of `n_parts` of [0, total): contiguous, in order, boundaries multiples of `align`
// (except the end); parts differ in size by at most one `align` unit. Depends only on the arguments.
Range split_range(int64_t total, int n_parts, int part, int64_t align = 1);

class ThreadPool {
 public:
  // How long an idle worker (or a waiting caller) polls before it blocks.
  static constexpr std::chrono::microseconds kDefaultSpin{200};

  // n_threads >= 1 counts the calling thread: n_threads - 1 workers are started.
  explicit ThreadPool(int n_threads, std::chrono::microseconds spin = kDefaultSpin);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(i) for every i in [0, n), n <= size(), and returns when all calls have returned.
  // Task 0 runs on the caller, task i on worker i. The first exception thrown by a task is rethrown
  // here after all tasks finished. Calls to run() must not overlap (one owner drives the pool).
  void run(int n, const std::function<void(int)>& fn);

 private:
  void worker_loop(int index);
  void wait_for_workers();

  int n_threads_;
  std::chrono::microseconds spin_;
  std::vector<std::thread> workers_;

  // Written by run() before `run_word_` changes, read by active workers after they see the change.
  const std::function<void(int)>* job_ = nullptr;

  // (run counter << 32) | tasks of the run: one word, so a worker reads which run it sees and how
  // many tasks that run has in one load. The counter also moves once at shutdown.
  std::atomic<uint64_t> run_word_{0};
  std::atomic<int> pending_{0};  // worker tasks of the current run not finished yet
  std::atomic<bool> stop_{false};
  std::atomic<int> sleeping_workers_{0};  // workers blocked (or about to block) on start_cv_
  std::atomic<bool> caller_sleeping_{false};

  std::mutex mutex_;  // guards error_ and the two condition variables' waits
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  std::exception_ptr error_;
};

}  // namespace kvtier
