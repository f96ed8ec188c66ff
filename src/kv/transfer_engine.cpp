#include "kv/transfer_engine.h"

#include <chrono>
#include <random>

#include "core/error.h"

namespace kvtier::kv {

TransferEngine::TransferEngine(HomeStore& home, size_t queue_slots, size_t max_runs, uint32_t delay_us)
    : home_(home), slots_(queue_slots), delay_us_(delay_us) {
  KVTIER_ASSERT(queue_slots > 0 && max_runs > 0);
  for (auto& s : slots_) s.runs.resize(max_runs);
  thread_ = std::thread([this] { worker(); });
}

TransferEngine::~TransferEngine() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  thread_.join();
}

TransferEngine::Ticket TransferEngine::submit(CopyDir dir, std::span<const CopyRun> runs) {
  std::unique_lock<std::mutex> lk(mu_);
  KVTIER_ASSERT(runs.size() <= slots_.front().runs.size(), "{} runs in one job", runs.size());
  cv_done_.wait(lk, [&] { return submitted_ - completed_ < slots_.size() || error_; });
  if (error_) std::rethrow_exception(error_);
  Slot& s = slots_[submitted_ % slots_.size()];
  s.dir = dir;
  s.n_runs = runs.size();
  std::copy(runs.begin(), runs.end(), s.runs.begin());
  const Ticket t = ++submitted_;
  lk.unlock();
  cv_work_.notify_one();
  return t;
}

void TransferEngine::wait(Ticket t) {
  std::unique_lock<std::mutex> lk(mu_);
  if (completed_ < t && !error_) {
    const auto t0 = std::chrono::steady_clock::now();
    cv_done_.wait(lk, [&] { return completed_ >= t || error_; });
    stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (error_) std::rethrow_exception(error_);
}

bool TransferEngine::done(Ticket t) const {
  std::lock_guard<std::mutex> lk(mu_);
  return completed_ >= t;
}

void TransferEngine::drain() {
  Ticket last;
  {
    std::lock_guard<std::mutex> lk(mu_);
    last = submitted_;
  }
  wait(last);
}

TransferStats TransferEngine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void TransferEngine::worker() {
  std::mt19937 rng(12345);
  for (;;) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_work_.wait(lk, [&] { return stop_ || (completed_ < submitted_ && !error_); });
    if (stop_) return;
    const Slot& s = slots_[completed_ % slots_.size()];
    lk.unlock();
    if (delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % delay_us_));
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t bytes = 0;
    std::exception_ptr err;
    try {
      for (size_t i = 0; i < s.n_runs; ++i) {
        const CopyRun& r = s.runs[i];
        if (s.dir == CopyDir::kLoad) {
          home_.read(r.home_offset, r.buf, r.bytes);
        } else {
          home_.write(r.home_offset, r.buf, r.bytes);
        }
        bytes += r.bytes;
      }
    } catch (...) {
      err = std::current_exception();
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    lk.lock();
    stats_.busy_seconds += dt;
    ++stats_.jobs;
    (s.dir == CopyDir::kLoad ? stats_.bytes_loaded : stats_.bytes_stored) += bytes;
    if (err && !error_) error_ = err;
    ++completed_;
    lk.unlock();
    cv_done_.notify_all();
  }
}

}  // namespace kvtier::kv
