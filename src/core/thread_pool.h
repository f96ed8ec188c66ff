// A fixed pool of worker threads owned by the engine. `run(n, fn)` calls fn(i) for i in [0, n) with
// task i on a fixed thread (task 0 on the caller), so work is never oversubscribed and a kernel that
// splits its output by `split_range` is deterministic for a given thread count.
#pragma once

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
  // n_threads >= 1 counts the calling thread: n_threads - 1 workers are started.
  explicit ThreadPool(int n_threads);
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

  int n_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;  // bumped for every run()
  int n_active_ = 0;         // tasks of the current run
  int pending_ = 0;          // worker tasks of the current run not finished yet
  bool stop_ = false;
  const std::function<void(int)>* job_ = nullptr;
  std::exception_ptr error_;
};

}  // namespace kvtier
