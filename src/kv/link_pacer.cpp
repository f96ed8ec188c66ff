#include "kv/link_pacer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "core/error.h"

namespace kvtier::kv {
namespace {

class SteadyClock final : public LinkClock {
 public:
  double now() override {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  void sleep_until(double t) override {
    const auto until = std::chrono::steady_clock::time_point(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(t)));
    std::this_thread::sleep_until(until);
  }
};

}  // namespace

LinkClock& steady_link_clock() {
  static SteadyClock clock;  // no state: every call reads the OS clock
  return clock;
}

LinkPacer::LinkPacer(double bytes_per_s, LinkClock* clock, double burst_s)
    : rate_(bytes_per_s), clock_(clock != nullptr ? clock : &steady_link_clock()), burst_(burst_s) {
  KVTIER_ASSERT(bytes_per_s >= 0 && std::isfinite(bytes_per_s), "link rate {}", bytes_per_s);
  KVTIER_ASSERT(burst_s >= 0 && std::isfinite(burst_s), "link burst {}", burst_s);
}

double LinkPacer::reserve(uint64_t bytes) {
  if (!limited()) return 0;
  const double start = std::max(clock_->now() - burst_, free_at_);
  free_at_ = start + static_cast<double>(bytes) / rate_;
  return free_at_;
}

double LinkPacer::finish(double deadline) {
  if (!limited()) return 0;
  const double now = clock_->now();
  if (now >= deadline) return 0;
  clock_->sleep_until(deadline);
  return deadline - now;
}

}  // namespace kvtier::kv
