// A link throttle: paces transfers so that they never move more than `bytes_per_s` on average, to
// reproduce a slow home-tier link (the regimes of the KVPR paper: a link slow relative to compute)
// on any machine. A measurement aid, not a feature: real links are not paced.
//
// The link is a virtual pipe (a token bucket): a transfer of n bytes occupies it for n / bytes_per_s
// seconds, starting when the pipe is free, or `burst_s` before now if it has been idle longer (idle
// time is banked up to burst_s: a sleep that wakes late, as on a busy machine, does not lower the
// rate of back-to-back transfers). reserve() books that interval and returns its end; the caller
// copies, then finish() sleeps until that end if the copy was faster. Any run of transfers moves at
// most bytes_per_s · (elapsed + burst_s) bytes (exactly, for the injected clock).
#pragma once

#include <cstdint>
#include <limits>

namespace kvtier::kv {

// Seconds on some monotonic clock, and a sleep on it. Tests inject a fake one.
class LinkClock {
 public:
  virtual ~LinkClock() = default;
  virtual double now() = 0;
  virtual void sleep_until(double t) = 0;
};

// std::chrono::steady_clock and std::this_thread::sleep_until. Stateless, shared.
LinkClock& steady_link_clock();

class LinkPacer {
 public:
  static constexpr double kDefaultBurst = 0.002;  // seconds of idle link banked at most

  // bytes_per_s = 0: unlimited (reserve and finish do nothing). clock null: the steady clock.
  explicit LinkPacer(double bytes_per_s = 0, LinkClock* clock = nullptr, double burst_s = kDefaultBurst);

  bool limited() const { return rate_ > 0; }
  double bytes_per_s() const { return rate_; }
  // Books the link for `bytes`; returns the time the transfer may complete at the earliest.
  double reserve(uint64_t bytes);
  // Sleeps until `deadline` (from reserve) if it is still ahead; returns the seconds slept.
  double finish(double deadline);

 private:
  double rate_;
  LinkClock* clock_;
  double burst_;
  double free_at_ = -std::numeric_limits<double>::infinity();  // when the link's last booking ends
};

}  // namespace kvtier::kv
