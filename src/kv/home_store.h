// The home tier of offloaded KV: the master copy of every offloaded head, in host DRAM or in a disk
// file. Bytes are addressed by offset; callers lay out one plane per (layer, KV head, K|V).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kv/ledger.h"

namespace kvtier::kv {

// Test hook: the disk store fails its I/O once `fail_after_bytes` bytes have been written.
struct DiskFaults {
  uint64_t fail_after_bytes = UINT64_MAX;
  int error = 0;  // errno reported (EIO, ENOSPC, ...)
};

// One copy between the home tier and compute memory: `bytes` at `home_offset` in the home tier <->
// `buf` (one home block, or an extent of consecutive ones).
struct BlockCopy {
  uint64_t home_offset = 0;
  uint8_t* buf = nullptr;
  uint64_t bytes = 0;
};

class HomeStore {
 public:
  virtual ~HomeStore() = default;
  virtual Tier tier() const = 0;
  // Offsets, sizes and buffer addresses of read/write must be multiples of this (4096 for direct
  // disk I/O, 1 for memory).
  virtual uint64_t alignment() const = 0;
  virtual uint64_t size() const = 0;
  // Called from the transfer thread only. Throw Error(kIo) on failure.
  virtual void read(uint64_t offset, uint8_t* dst, uint64_t bytes) = 0;
  virtual void write(uint64_t offset, const uint8_t* src, uint64_t bytes) = 0;
  // Reads every copy (home -> buf). The disk store keeps up to queue_depth() of them in flight at once
  // (io_uring), so that the device works on them together; the default reads them one after another.
  // Called from the transfer thread only; throws Error(kIo) once every read it issued has finished.
  virtual void read_batch(std::span<const BlockCopy> reads) {
    for (const BlockCopy& r : reads) read(r.home_offset, r.buf, r.bytes);
  }
  // Reads read_batch() keeps in flight at once (1: one after another).
  virtual uint32_t queue_depth() const { return 1; }
  // A gather (the chosen rows of a unit, scattered over its pages) may read through a gap between two
  // of its extents rather than issue another read when the gap is at most this many bytes: below it,
  // the extra bytes cost less than one more request. 0: never (host memory: a copy costs its bytes).
  virtual uint64_t gather_gap() const { return 0; }
  // A line for reports: where the bytes live and how they move.
  virtual std::string describe() const = 0;
};

// Host DRAM, accounted as (kHost, kKv); the host budget of the ledger applies.
std::unique_ptr<HomeStore> make_host_store(MemoryLedger& ledger, uint64_t bytes);

// An unnamed file in `dir` (O_TMPFILE, or created and unlinked at once, so nothing is left behind
// even if the process dies), with O_DIRECT where the file system supports it, space allocated up
// front (a full disk fails here, before the run starts). Accounted as (kDisk, kKv). read_batch() goes
// through an io_uring of kDiskQueueDepth entries where the build has liburing and the kernel allows it
// (describe() says which), else one pread after another. gather_gap() is kDiskGatherGap with io_uring,
// kDiskGatherGapSerial without: measured on the dev VM's virtual disk (docs/benchmarks.md, "Selective
// loads on a disk home"), a 4 KiB read costs ~80 us alone (~64 KiB of transfer at ~0.8 GB/s) but far
// less among 32 in flight, where reading more than two unneeded I/O pages costs more than it saves.
// Whether this build has liburing (the kernel may still refuse io_uring: describe() then says why).
bool disk_io_uring_built();
inline constexpr uint32_t kDiskQueueDepth = 32;
inline constexpr uint64_t kDiskGatherGap = 8 * 1024;
inline constexpr uint64_t kDiskGatherGapSerial = 64 * 1024;
std::unique_ptr<HomeStore> make_disk_store(MemoryLedger& ledger, const std::string& dir, uint64_t bytes,
                                           const DiskFaults& faults = {});

}  // namespace kvtier::kv
