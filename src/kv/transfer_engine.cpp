#include "kv/transfer_engine.h"

#include <chrono>
#include <random>

#include "core/error.h"

namespace kvtier::kv {

TransferEngine::TransferEngine(HomeStore& home, uint64_t home_block_bytes, size_t queue_slots,
                               size_t max_copies, uint32_t delay_us, LinkLimit link)
    : home_(home),
      home_block_bytes_(home_block_bytes),
      home_pins_(home_block_bytes > 0 ? (home.size() + home_block_bytes - 1) / home_block_bytes : 0),
      slots_(queue_slots),
      delay_us_(delay_us),
      pacer_(link.bytes_per_s, link.clock) {
  KVTIER_ASSERT(home_block_bytes > 0 && queue_slots > 0 && max_copies > 0);
  KVTIER_ASSERT(home_pins_.size() > 0, "home tier of {} bytes", home.size());
  for (auto& s : slots_) s.runs.resize(max_copies);
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

void TransferEngine::pin_runs(const Slot& s) {
  for (size_t i = 0; i < s.n_runs; ++i) {
    const BlockCopy& r = s.runs[i];
    if (r.bytes == 0) continue;
    for (uint64_t b = r.home_offset / home_block_bytes_;
         b <= (r.home_offset + r.bytes - 1) / home_block_bytes_; ++b)
      home_pins_.pin(b);
  }
  if (s.buffer.pool != nullptr) s.buffer.pool->pin(s.buffer.slot);
}

void TransferEngine::unpin_runs(const Slot& s) {
  if (s.buffer.pool != nullptr) s.buffer.pool->unpin(s.buffer.slot);
  for (size_t i = 0; i < s.n_runs; ++i) {
    const BlockCopy& r = s.runs[i];
    if (r.bytes == 0) continue;
    for (uint64_t b = r.home_offset / home_block_bytes_;
         b <= (r.home_offset + r.bytes - 1) / home_block_bytes_; ++b)
      home_pins_.unpin(b);
  }
}

bool TransferEngine::home_pinned(uint64_t offset, uint64_t bytes) const {
  if (bytes == 0) return false;
  const uint64_t last = std::min<uint64_t>((offset + bytes - 1) / home_block_bytes_, home_pins_.size() - 1);
  for (uint64_t b = offset / home_block_bytes_; b <= last; ++b) {
    if (home_pins_.pins(b) != 0) return true;
  }
  return false;
}

TransferEngine::Ticket TransferEngine::prepare(CopyDir dir, std::span<const BlockCopy> copies,
                                               BufferRef buffer, Gaps gaps) {
  std::unique_lock<std::mutex> lk(mu_);
  KVTIER_ASSERT(copies.size() <= slots_.front().runs.size(), "{} copies in one job", copies.size());
  cv_done_.wait(lk, [&] { return submitted_ - completed_ < slots_.size() || error_; });
  if (error_) std::rethrow_exception(error_);
  Slot& s = slots_[submitted_ % slots_.size()];
  s.dir = dir;
  s.buffer = buffer;
  // Coalesce: a copy that continues the previous one in both the home tier and the buffer extends
  // its run; in a gather, so does one a short gap further on in both (the gap is read too).
  const uint64_t max_gap = dir == CopyDir::kLoad && gaps == Gaps::kGather ? home_.gather_gap() : 0;
  s.n_runs = 0;
  uint64_t n_blocks = 0, slack = 0;
  for (const BlockCopy& b : copies) {
    if (b.bytes > 0)
      n_blocks += (b.home_offset + b.bytes - 1) / home_block_bytes_ - b.home_offset / home_block_bytes_ + 1;
    KVTIER_ASSERT(b.home_offset + b.bytes <= home_.size(), "block [{}, +{}) outside the home tier",
                  b.home_offset, b.bytes);
    if (s.n_runs > 0) {
      BlockCopy& r = s.runs[s.n_runs - 1];
      if (r.home_offset + r.bytes == b.home_offset && r.buf + r.bytes == b.buf) {
        r.bytes += b.bytes;
        continue;
      }
      const uint64_t r_end = r.home_offset + r.bytes;
      if (b.bytes > 0 && b.home_offset > r_end && b.home_offset - r_end <= max_gap &&
          b.buf - r.buf == static_cast<ptrdiff_t>(b.home_offset - r.home_offset)) {
        slack += b.home_offset - r_end;
        r.bytes = b.home_offset + b.bytes - r.home_offset;
        continue;
      }
    }
    s.runs[s.n_runs++] = b;
  }
  pin_runs(s);
  stats_.blocks += n_blocks;
  stats_.runs += s.n_runs;
  stats_.slack_bytes += slack;
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
  std::unique_lock<std::mutex> lk(mu_);
  const Ticket last = submitted_;
  // Unlike wait(), also after an error: every job completes (and unpins) before this returns.
  const auto t0 = std::chrono::steady_clock::now();
  cv_done_.wait(lk, [&] { return completed_ >= last; });
  stats_.wait_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (error_) std::rethrow_exception(error_);
}

TransferStats TransferEngine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

void TransferEngine::worker() {
  std::mt19937 rng(12345);
  for (;;) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_work_.wait(lk, [&] { return stop_ || completed_ < submitted_; });
    if (completed_ == submitted_) return;  // stop requested and nothing queued
    const Slot& s = slots_[completed_ % slots_.size()];
    const bool failed = error_ != nullptr;  // after an error, jobs complete without copying
    lk.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t bytes = 0;
    double throttled = 0;
    std::exception_ptr err;
    if (!failed) {
      if (delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % delay_us_));
      double deadline = 0;
      if (s.dir == CopyDir::kLoad && pacer_.limited()) {
        uint64_t job_bytes = 0;
        for (size_t i = 0; i < s.n_runs; ++i) job_bytes += s.runs[i].bytes;
        deadline = pacer_.reserve(job_bytes);
      }
      try {
        if (s.dir == CopyDir::kLoad) {
          home_.read_batch(std::span<const BlockCopy>(s.runs.data(), s.n_runs));
          for (size_t i = 0; i < s.n_runs; ++i) bytes += s.runs[i].bytes;
        } else {
          for (size_t i = 0; i < s.n_runs; ++i) {
            const BlockCopy& r = s.runs[i];
            home_.write(r.home_offset, r.buf, r.bytes);
            bytes += r.bytes;
          }
        }
      } catch (...) {
        err = std::current_exception();
      }
      if (s.dir == CopyDir::kLoad) throttled = pacer_.finish(deadline);
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    unpin_runs(s);  // phase two: the job's blocks may be freed or rewritten again
    lk.lock();
    stats_.busy_seconds += dt;
    stats_.throttle_seconds += throttled;
    ++stats_.jobs;
    (s.dir == CopyDir::kLoad ? stats_.bytes_loaded : stats_.bytes_stored) += bytes;
    if (err && !error_) error_ = err;
    ++completed_;
    lk.unlock();
    cv_done_.notify_all();
  }
}

}  // namespace kvtier::kv
