#include "kv/make_kv_cache.h"

#include "core/error.h"
#include "kv/resident_kv.h"

namespace kvtier::kv {

uint64_t resident_kv_bytes(const KvGeometry& geo, int64_t capacity) {
  const uint64_t blocks = (static_cast<uint64_t>(capacity) + geo.block_tokens - 1) / geo.block_tokens;
  uint64_t total = 0;
  for (uint32_t l = 0; l < geo.n_layer(); ++l)
    total += uint64_t{geo.n_groups(l)} * blocks * geo.block_bytes(l);
  return total;
}

std::unique_ptr<KvCache> make_kv_cache(const TieredOptions& o, const KvGeometry& geometry, int64_t capacity,
                                       uint32_t n_head, MemoryLedger& ledger, ThreadPool& pool,
                                       cpu::Isa isa) {
  if (o.placement.placement != policy::Placement::kResident) {
    return std::make_unique<TieredKv>(geometry, capacity, n_head, ledger, pool, isa, o);
  }
  if (!o.disk_dir.empty()) {
    fail(ErrorKind::kInvalidArgument,
         "--kv-disk applies to the offloaded policies (layer, headinfer); resident keeps all KV in compute "
         "memory");
  }
  if (o.placement.static_heads != 0 || o.placement.group != 0) {
    fail(ErrorKind::kInvalidArgument, "--group and --static-heads apply to --kv-policy headinfer");
  }
  const uint64_t need = resident_kv_bytes(geometry, capacity);
  if (o.kv_mem != 0 && need > o.kv_mem) {
    fail(ErrorKind::kBudget,
         "resident KV for {} positions needs {} bytes but --kv-mem is {} bytes; use --kv-policy layer or "
         "headinfer (KV offloaded to host memory or --kv-disk), raise --kv-mem, or lower --ctx",
         capacity, need, o.kv_mem);
  }
  return std::make_unique<ResidentKv>(geometry, capacity, n_head, ledger, pool, isa);
}

}  // namespace kvtier::kv
