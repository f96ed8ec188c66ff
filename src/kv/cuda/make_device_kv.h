// The GPU KV cache of a placement: resident, or layer / headinfer through pinned host memory.
#pragma once

#include <memory>

#include "backend/cuda/context.h"
#include "kv/cuda/device_kv.h"
#include "kv/ledger.h"

namespace kvtier::kv_cuda {

std::unique_ptr<DeviceKvCache> make_device_kv(cuda::Context& ctx, const DeviceKvShape& shape,
                                              const DeviceKvOptions& opt, kv::MemoryLedger& ledger);

// Pinned host bytes the placement needs (0 for resident).
uint64_t device_kv_host_bytes(const DeviceKvShape& shape, const DeviceKvOptions& opt);

}  // namespace kvtier::kv_cuda
