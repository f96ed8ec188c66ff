// Asynchronous KV transfers between the home tier and compute-local staging buffers.
//
// One copy thread executes jobs strictly in submission order, which gives every ordering the
// ping-pong protocol needs without barriers: a store of a unit's new rows always lands before a
// later load of that unit (read-after-write across steps), and a buffer's store is done before a
// later load overwrites that buffer. The compute thread waits on individual jobs (tickets), never
// on the whole queue. Job slots and their run lists are allocated up front: submitting does not
// allocate. A failed job's error is rethrown by wait() (and by every later wait: the engine stops).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "kv/home_store.h"

namespace kvtier::kv {

// A contiguous copy between home offset and a buffer address.
struct CopyRun {
  uint64_t home_offset = 0;
  uint8_t* buf = nullptr;
  uint64_t bytes = 0;
};

enum class CopyDir { kLoad, kStore };  // home -> buffer, buffer -> home

struct TransferStats {
  uint64_t bytes_loaded = 0;  // home -> compute
  uint64_t bytes_stored = 0;  // compute -> home
  uint64_t jobs = 0;
  double wait_seconds = 0;  // time the compute thread spent blocked in wait()
  double busy_seconds = 0;  // time the copy thread spent copying
};

class TransferEngine {
 public:
  using Ticket = uint64_t;

  // queue_slots: jobs in flight at most (submit blocks when full); max_runs: runs per job.
  // delay_us > 0 (tests): each job sleeps a random 0..delay_us microseconds first, to expose races.
  TransferEngine(HomeStore& home, size_t queue_slots, size_t max_runs, uint32_t delay_us = 0);
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  Ticket submit(CopyDir dir, std::span<const CopyRun> runs);
  // Blocks until the job is done; rethrows the engine's first error.
  void wait(Ticket t);
  bool done(Ticket t) const;
  // Waits for every submitted job.
  void drain();
  TransferStats stats() const;
  HomeStore& home() { return home_; }

 private:
  struct Slot {
    CopyDir dir = CopyDir::kLoad;
    size_t n_runs = 0;
    std::vector<CopyRun> runs;  // [max_runs]
  };
  void worker();

  HomeStore& home_;
  std::vector<Slot> slots_;
  uint32_t delay_us_;
  mutable std::mutex mu_;
  std::condition_variable cv_work_;
  std::condition_variable cv_done_;
  Ticket submitted_ = 0;  // tickets are 1, 2, ...; job t uses slot (t - 1) % slots
  Ticket completed_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  TransferStats stats_;
  std::thread thread_;
};

}  // namespace kvtier::kv
