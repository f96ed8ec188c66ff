// A fixed pool of worker threads owned by the engine. `run(n, fn)` calls fn(i) for i in [0, n) with
// task i on a fixed thread (task 0 on the caller), so work is never oversubscribed and a kernel that
// splits its output by `split_range` is deterministic for a given thread count.
//
// Hand-off is spin-then-sleep: after a task, a worker polls for the next run() for `spin` before it
// blocks on a condition variable, and the caller polls for the workers' completion for as long before
// it blocks. Decode issues a few hundred small runs per token, microseconds apart; a futex wake per
// run would cost more than the work it splits. Idle pools sleep, so a waiting server burns no CPU.
// A pool of more threads than the process has CPUs never polls (a poller would hold the CPU the
// awaited thread needs).
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

  // n_threads >= 1 counts the calling thread: n_threads - 1 workers are started. `spin` is the
  // polling time (0: every hand-off sleeps; also forced when n_threads exceeds the usable CPUs).
  explicit ThreadPool(int n_threads, std::chrono::microseconds spin = kDefaultSpin);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Whether hand-offs poll now (cheap, microseconds) or sleep (a futex wake per run()). A pool polls
  // unless it has more threads than CPUs or is contended: recent runs spent a good share of their
  // time waiting for workers that lacked a CPU (other processes' load); then polling would take
  // CPU time from the threads doing the work, and splitting small work loses.
  bool polls() const { return spin_.count() > 0 && !contended_.load(std::memory_order_relaxed); }
  // Threads worth using for a job of `work` units (the caller's measure of its size): all of them
  // while the pool polls; a sleeping pool pays a futex wake per hand-off and may wait for a worker
  // without a CPU, so below `sleeping_min_work` the job then runs on the caller alone.
  int threads_for(int64_t work, int64_t sleeping_min_work) const {
    return polls() || work >= sleeping_min_work ? n_threads_ : 1;
  }

  // Calls fn(i) for every i in [0, n), n <= size(), and returns when all calls have returned.
  // Task 0 runs on the caller, task i on worker i. The first exception thrown by a task is rethrown
  // here after all tasks finished. Calls to run() must not overlap (one owner drives the pool).
  void run(int n, const std::function<void(int)>& fn);

 private:
  void worker_loop(int index);
  void wait_for_workers();
  std::chrono::microseconds poll_time() const { return polls() ? spin_ : std::chrono::microseconds{0}; }

  static constexpr double kContendedShare = 0.2;  // of recent run() time spent waiting for late workers

  int n_threads_;
  std::chrono::microseconds spin_;
  // Decaying sums over recent run()s (seconds): time waited beyond normal imbalance, and total time.
  double late_time_ = 0.0;
  double run_time_ = 0.0;
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
  std::atomic<bool> contended_{false};  // set by run(), read by the workers to stop polling

  std::mutex mutex_;  // guards error_ and the two condition variables' waits
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  std::exception_ptr error_;
};

}  // namespace kvtier
