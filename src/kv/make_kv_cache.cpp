#include "kv/make_kv_cache.h"

#include "core/error.h"
#include "kv/footprint.h"
#include "kv/h2o_kv.h"
#include "kv/locret_kv.h"
#include "kv/resident_kv.h"

namespace kvtier::kv {

std::unique_ptr<KvCache> make_kv_cache(const TieredOptions& o, const KvGeometry& geometry, int64_t capacity,
                                       uint32_t n_head, MemoryLedger& ledger, ThreadPool& pool,
                                       cpu::Isa isa) {
  check_placement_options(o);
  if (o.retention == policy::Retention::kLocret && o.placement.placement == policy::Placement::kResident)
    return std::make_unique<LocretKv>(geometry, capacity, n_head, ledger, pool, isa, o);
  if (o.retention == policy::Retention::kH2o)
    return std::make_unique<H2oKv>(geometry, capacity, n_head, ledger, pool, isa, o);
  if (o.placement.placement != policy::Placement::kResident) {
    return std::make_unique<TieredKv>(geometry, capacity, n_head, ledger, pool, isa, o);
  }
  check_resident_budget(resident_layout(geometry, capacity, n_head, pool.size(), o), capacity, o.kv_mem);
  return std::make_unique<ResidentKv>(geometry, capacity, n_head, ledger, pool, isa, o);
}

}  // namespace kvtier::kv
