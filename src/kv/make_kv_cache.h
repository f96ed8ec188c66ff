// Builds the KV cache of a placement policy: ResidentKv for `resident`, TieredKv for the offloaded
// ones. Budgets are checked before anything large is allocated.
#pragma once

#include <memory>

#include "kv/kv_cache.h"
#include "kv/tiered_kv.h"

namespace kvtier::kv {

// Throws Error(kBudget) with needed and available bytes when the placement cannot fit options.kv_mem,
// and Error(kInvalidArgument) for options that do not apply to the placement. What it allocates is
// kv_footprint(options, geometry, capacity, n_head, pool.size()) (kv/footprint.h).
std::unique_ptr<KvCache> make_kv_cache(const TieredOptions& options, const KvGeometry& geometry,
                                       int64_t capacity, uint32_t n_head, MemoryLedger& ledger,
                                       ThreadPool& pool, cpu::Isa isa);

}  // namespace kvtier::kv
