#include "core/thread_pool.h"

#include <algorithm>

#if defined(__linux__)
#include <sched.h>
#endif

#include "core/error.h"

namespace kvtier {
namespace {

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

// Polls `done` for up to `budget`; true if it became true. Every 64 polls it reads the clock and
// yields the core, so a thread that this one's polling keeps off a busy CPU still gets to run.
template <class Done>
bool spin_until(std::chrono::microseconds budget, Done done) {
  if (budget.count() <= 0) return done();
  const auto deadline = std::chrono::steady_clock::now() + budget;
  for (uint32_t i = 1;; ++i) {
    if (done()) return true;
    cpu_relax();
    if (i % 64 == 0) {
      if (std::chrono::steady_clock::now() >= deadline) return done();
      std::this_thread::yield();
    }
  }
}

// CPUs this process may run on.
int usable_cpus() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
#endif
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
}

}  // namespace

Range split_range(int64_t total, int n_parts, int part, int64_t align) {
  KVTIER_ASSERT(n_parts >= 1 && part >= 0 && part < n_parts && align >= 1 && total >= 0);
  const int64_t units = (total + align - 1) / align;
  const int64_t base = units / n_parts;
  const int64_t extra = units % n_parts;
  const int64_t u0 = part * base + std::min<int64_t>(part, extra);
  const int64_t u1 = u0 + base + (part < extra ? 1 : 0);
  return {std::min(total, u0 * align), std::min(total, u1 * align)};
}

ThreadPool::ThreadPool(int n_threads, std::chrono::microseconds spin) : n_threads_(n_threads), spin_(spin) {
  if (n_threads < 1)
    fail(ErrorKind::kInvalidArgument, "thread pool needs at least 1 thread, got {}", n_threads);
  // More threads than CPUs: a polling thread would hold the CPU that the thread it waits for needs
  // (decode fell from 240 to 10 tok/s at 3 threads on 2 CPUs), so every hand-off sleeps instead.
  if (n_threads > usable_cpus()) spin_ = std::chrono::microseconds{0};
  workers_.reserve(n_threads - 1);
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  run_word_.fetch_add(uint64_t{1} << 32);
  {
    std::lock_guard lock(mutex_);  // a worker between its last check and its wait holds the mutex
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run(int n, const std::function<void(int)>& fn) {
  KVTIER_ASSERT(n >= 0 && n <= n_threads_, "run({}) on a pool of {} threads", n, n_threads_);
  KVTIER_ASSERT(job_ == nullptr, "ThreadPool::run called while another run is in progress");
  if (n == 0) return;
  if (n == 1) {  // the caller alone: no hand-off
    fn(0);
    return;
  }
  job_ = &fn;
  pending_.store(n - 1, std::memory_order_relaxed);
  // Publishes job_ and pending_ to every worker that observes the new word.
  const uint64_t counter = (run_word_.load(std::memory_order_relaxed) >> 32) + 1;
  run_word_.store((counter << 32) | static_cast<uint32_t>(n));
  // Sequentially consistent with the worker's `sleeping_workers_` increment followed by its
  // re-check of `run_word_`: either it sees the new run or we see it asleep and wake it.
  if (sleeping_workers_.load() > 0) {
    std::lock_guard lock(mutex_);
    start_cv_.notify_all();
  }
  std::exception_ptr own_error;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    fn(0);
  } catch (...) {
    own_error = std::current_exception();
  }
  const auto t1 = std::chrono::steady_clock::now();
  wait_for_workers();
  // Waiting beyond a normal imbalance (a quarter of the caller's own time plus 50 us) is time the
  // workers lacked a CPU; contended() compares its recent sum with the runs' total time.
  const auto t2 = std::chrono::steady_clock::now();
  const auto normal = std::chrono::microseconds{50} + (t1 - t0) / 4;
  const double late = std::max(0.0, std::chrono::duration<double>(t2 - t1 - normal).count());
  late_time_ = 0.98 * late_time_ + late;
  run_time_ = 0.98 * run_time_ + std::chrono::duration<double>(t2 - t0).count();
  contended_.store(late_time_ > kContendedShare * run_time_, std::memory_order_relaxed);
  job_ = nullptr;
  std::exception_ptr err;
  {
    std::lock_guard lock(mutex_);
    err = own_error ? own_error : error_;
    error_ = nullptr;
  }
  if (err) std::rethrow_exception(err);
}

void ThreadPool::wait_for_workers() {
  auto finished = [this] { return pending_.load(std::memory_order_acquire) == 0; };
  if (spin_until(poll_time(), finished)) return;
  std::unique_lock lock(mutex_);
  caller_sleeping_.store(true);
  done_cv_.wait(lock, finished);
  caller_sleeping_.store(false);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t word = seen;
    auto started = [&] {
      word = run_word_.load(std::memory_order_acquire);
      return word != seen;
    };
    if (!spin_until(poll_time(), started)) {
      std::unique_lock lock(mutex_);
      sleeping_workers_.fetch_add(1);
      start_cv_.wait(lock, started);
      sleeping_workers_.fetch_sub(1);
    }
    seen = word;
    if (stop_.load()) return;
    // A worker outside this run may be passed over by the next runs; it only ever acts on a word it
    // loaded, so it never reads a half-published run.
    if (index >= static_cast<int>(static_cast<uint32_t>(word))) continue;
    try {
      (*job_)(index);
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    // The last worker to finish wakes the caller if it stopped polling (same argument as in run()).
    if (pending_.fetch_sub(1) == 1 && caller_sleeping_.load()) {
      std::lock_guard lock(mutex_);
      done_cv_.notify_one();
    }
  }
}

}  // namespace kvtier
