// The home tier of offloaded KV: the master copy of every offloaded head, in host DRAM or in a disk
// file. Bytes are addressed by offset; callers lay out one plane per (layer, KV head, K|V).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kv/ledger.h"

namespace kvtier::kv {

// Test hook: the disk store fails its I/O once `fail_after_bytes` bytes have been written.
struct DiskFaults {
  uint64_t fail_after_bytes = UINT64_MAX;
  int error = 0;  // errno reported (EIO, ENOSPC, ...)
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
  // A line for reports: where the bytes live and how they move.
  virtual std::string describe() const = 0;
};

// Host DRAM, accounted as (kHost, kKv); the host budget of the ledger applies.
std::unique_ptr<HomeStore> make_host_store(MemoryLedger& ledger, uint64_t bytes);

// An unnamed file in `dir` (O_TMPFILE, or created and unlinked at once, so nothing is left behind
// even if the process dies), with O_DIRECT where the file system supports it, space allocated up
// front (a full disk fails here, before the run starts). Accounted as (kDisk, kKv).
std::unique_ptr<HomeStore> make_disk_store(MemoryLedger& ledger, const std::string& dir, uint64_t bytes,
                                           const DiskFaults& faults = {});

}  // namespace kvtier::kv
