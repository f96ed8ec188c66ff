// The CUDA backend's resources for one device, made once up front: the device arena (the budget of
// --device-mem), the pinned host pool, the compute/H2D/D2H streams and the cuBLAS handle (its
// workspace in the arena). Owned by the engine and passed down; nothing global.
#pragma once

#include <cstddef>
#include <memory>

#include "backend/cuda/device_arena.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/pinned_pool.h"
#include "backend/cuda/stream.h"

namespace kvtier::cuda {

struct ContextOptions {
  int device = 0;
  size_t device_budget = 0;  // bytes of the device arena (--device-mem)
  size_t pinned_bytes = 0;   // bytes of page-locked host memory (host tier + staging)
};

// Planned vs measured memory: the arena's budget and peak next to what the device reports.
struct MemoryReport {
  size_t arena_budget = 0;
  size_t arena_used = 0;
  size_t arena_peak = 0;
  size_t pinned_capacity = 0;
  size_t pinned_peak = 0;
  size_t device_free = 0;  // cudaMemGetInfo now
  size_t device_total = 0;
};

class Context {
 public:
  // Selects the device and reserves everything. Throws Error(kInvalidArgument) for a device index
  // that does not exist, Error(kBudget) when the arena or the pinned pool cannot be had.
  explicit Context(const ContextOptions& o);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  int device() const { return device_; }
  DeviceArena& arena() { return *arena_; }
  PinnedHostPool& pinned() { return *pinned_; }
  Streams& streams() { return *streams_; }
  Blas& blas() { return *blas_; }

  MemoryReport memory_report() const;

 private:
  int device_;
  std::unique_ptr<DeviceArena> arena_;
  std::unique_ptr<PinnedHostPool> pinned_;
  std::unique_ptr<Streams> streams_;
  std::unique_ptr<Blas> blas_;
};

}  // namespace kvtier::cuda
