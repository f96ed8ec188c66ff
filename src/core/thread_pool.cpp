#include "core/thread_pool.h"

#include <algorithm>

#include "core/error.h"

namespace kvtier {

Range split_range(int64_t total, int n_parts, int part, int64_t align) {
  KVTIER_ASSERT(n_parts >= 1 && part >= 0 && part < n_parts && align >= 1 && total >= 0);
  const int64_t units = (total + align - 1) / align;
  const int64_t base = units / n_parts;
  const int64_t extra = units % n_parts;
  const int64_t u0 = part * base + std::min<int64_t>(part, extra);
  const int64_t u1 = u0 + base + (part < extra ? 1 : 0);
  return {std::min(total, u0 * align), std::min(total, u1 * align)};
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  if (n_threads < 1)
    fail(ErrorKind::kInvalidArgument, "thread pool needs at least 1 thread, got {}", n_threads);
  workers_.reserve(n_threads - 1);
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run(int n, const std::function<void(int)>& fn) {
  KVTIER_ASSERT(n >= 0 && n <= n_threads_, "run({}) on a pool of {} threads", n, n_threads_);
  if (n == 0) return;
  {
    std::lock_guard lock(mutex_);
    KVTIER_ASSERT(job_ == nullptr, "ThreadPool::run called while another run is in progress");
    job_ = &fn;
    n_active_ = n;
    pending_ = n - 1;
    error_ = nullptr;
    ++generation_;
  }
  if (n > 1) start_cv_.notify_all();
  std::exception_ptr own_error;
  try {
    fn(0);
  } catch (...) {
    own_error = std::current_exception();
  }
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
  std::exception_ptr err = own_error ? own_error : error_;
  error_ = nullptr;
  lock.unlock();
  if (err) std::rethrow_exception(err);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    if (index >= n_active_) continue;
    const std::function<void(int)>* job = job_;
    lock.unlock();
    std::exception_ptr err;
    try {
      (*job)(index);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    if (err && !error_) error_ = err;
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

}  // namespace kvtier
