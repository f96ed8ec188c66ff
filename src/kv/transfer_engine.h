// Asynchronous KV transfers between the home tier and compute-local staging buffers, in two phases.
//
//   prepare(): on the compute thread. Pins every home-tier block the job touches and the compute-side
//              buffer (a BlockPool slot), coalesces adjacent copies into runs (one I/O each), queues
//              the job and returns its ticket. Does not allocate: job slots and run lists are sized
//              up front.
//
// A copy names one home block or an extent of consecutive ones (the home tier's pin granularity is
// home_block_bytes; a copy need not be block-aligned). Copies that continue each other in both the
// home tier and the buffer merge into one run; stats count blocks covered and runs issued.
//   complete:  on the copy thread, when the job's runs are copied: the pins are released, then the
//              ticket completes. wait(ticket) is the completion event the compute waits on for one
//              span of KV; there is no global barrier in the layer loop.
//
// While a block is pinned, whatever would free, truncate or rewrite it from outside the queue must
// not: BlockPool::release refuses (Error kInternal), TieredKv::truncate waits for the pins to drop,
// and TieredKv asserts a staging buffer is unpinned before the compute writes into it.
//
// One copy thread executes jobs strictly in submission order, which gives every ordering the
// ping-pong protocol needs between jobs: a store of a unit's new rows always lands before a later
// load of that unit (read-after-write across steps), and a buffer's store is done before a later load
// overwrites that buffer. A failed job's error is rethrown by wait() (and by every later wait and
// prepare: the engine stops); its pins are released all the same.
//
// Link throttle (a measurement aid, kvtier's --link-gbps): with LinkLimit::bytes_per_s > 0 every load
// job (home -> compute) is paced by a LinkPacer so that loads move at most that many bytes per second
// (plus a burst of LinkPacer::kDefaultBurst seconds' worth), whatever the home tier's real speed; the
// throttle's sleeps count in busy_seconds and throttle_seconds. Stores are not paced.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "kv/block_pool.h"
#include "kv/home_store.h"
#include "kv/link_pacer.h"
#include "kv/pin_table.h"

namespace kvtier::kv {

// The compute-side buffer of a job (a slot of a block pool), pinned while the job is in flight.
struct BufferRef {
  BlockPool* pool = nullptr;
  uint32_t slot = 0;
};

enum class CopyDir { kLoad, kStore };  // home -> buffer, buffer -> home

// What the buffer bytes between a load's copies are. kExact: they must stay as they are (only the named
// bytes move). kGather: nobody reads them (a gather of chosen rows into their places in a staging plane),
// so copies with the same home-to-buffer displacement whose gap is at most HomeStore::gather_gap() are
// read as one run through the gap: fewer, longer reads for a few unneeded bytes (stats: slack_bytes).
enum class Gaps { kExact, kGather };

struct TransferStats {
  uint64_t bytes_loaded = 0;  // home -> compute: the bytes read (page-rounded, gather slack included)
  uint64_t slack_bytes = 0;   // of bytes_loaded: gaps read through to merge a gather's copies (Gaps)
  uint64_t bytes_stored = 0;  // compute -> home
  uint64_t jobs = 0;
  uint64_t blocks = 0;          // home blocks the prepared copies cover (counted per copy)
  uint64_t runs = 0;            // I/O calls issued for them after coalescing (and merging gathers)
  double wait_seconds = 0;      // time the compute thread spent blocked in wait()
  double busy_seconds = 0;      // time the copy thread spent copying (and, throttled, holding the link)
  double throttle_seconds = 0;  // of busy_seconds: sleeps of the link throttle
};

// The link throttle of load jobs: 0 = none. clock null: the steady clock (tests inject a fake one).
struct LinkLimit {
  double bytes_per_s = 0;
  LinkClock* clock = nullptr;
};

class TransferEngine {
 public:
  using Ticket = uint64_t;

  // home_block_bytes: pin granularity of the home tier (block i = bytes [i * B, (i + 1) * B)).
  // queue_slots: jobs in flight at most (prepare blocks when full); max_copies: copies per job.
  // delay_us > 0 (tests): each job sleeps a random 0..delay_us microseconds first, to expose races.
  // link: the throttle of load jobs (see above).
  TransferEngine(HomeStore& home, uint64_t home_block_bytes, size_t queue_slots, size_t max_copies,
                 uint32_t delay_us = 0, LinkLimit link = {});
  ~TransferEngine();
  TransferEngine(const TransferEngine&) = delete;
  TransferEngine& operator=(const TransferEngine&) = delete;

  // Phase one (see above). Copies run in the order given; an empty job is a FIFO fence. A load's runs
  // are read together (HomeStore::read_batch: several in flight on a disk home).
  Ticket prepare(CopyDir dir, std::span<const BlockCopy> copies, BufferRef buffer = {},
                 Gaps gaps = Gaps::kExact);
  // Blocks until the job has completed (its pins released); rethrows the engine's first error.
  void wait(Ticket t);
  bool done(Ticket t) const;
  // Waits for every prepared job.
  void drain();
  TransferStats stats() const;
  HomeStore& home() { return home_; }
  uint64_t home_block_bytes() const { return home_block_bytes_; }
  // Pins of the home tier's blocks.
  const PinTable& home_pins() const { return home_pins_; }
  // Whether any home block overlapping [offset, offset + bytes) is pinned.
  bool home_pinned(uint64_t offset, uint64_t bytes) const;

 private:
  struct Slot {
    CopyDir dir = CopyDir::kLoad;
    size_t n_runs = 0;
    std::vector<BlockCopy> runs;  // [max_copies] coalesced runs
    BufferRef buffer;
  };
  void worker();
  void pin_runs(const Slot& s);
  void unpin_runs(const Slot& s);

  HomeStore& home_;
  uint64_t home_block_bytes_;
  PinTable home_pins_;  // [ceil(home size / home_block_bytes)]
  std::vector<Slot> slots_;
  uint32_t delay_us_;
  LinkPacer pacer_;  // used by the copy thread only
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
