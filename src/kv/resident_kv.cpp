#include "kv/resident_kv.h"

#include <algorithm>

#include "core/error.h"
#include "kv/footprint.h"
#include "kv/kv_row.h"

namespace kvtier::kv {

ResidentKv::ResidentKv(const KvGeometry& geometry, int64_t capacity, uint32_t n_head, MemoryLedger& ledger,
                       ThreadPool& pool, cpu::Isa isa)
    : geo_(geometry), capacity_(capacity), threads_(pool), isa_(isa) {
  const ResidentLayout r = resident_layout(geo_, capacity_, n_head, pool.size());
  max_blocks_ = r.max_blocks;
  const uint32_t L = geo_.n_layer();
  pool_index_ = r.pool_index;
  table_offset_.resize(L);
  length_.assign(L, 0);
  size_t entries = 0;
  for (uint32_t l = 0; l < L; ++l) {
    table_offset_[l] = entries;
    entries += size_t{geo_.n_groups(l)} * static_cast<size_t>(max_blocks_);
  }
  for (size_t i = 0; i < r.pool_blocks.size(); ++i) {
    pools_.push_back(
        std::make_unique<BlockPool>(ledger, Tier::kDevice, r.pool_block_bytes[i], r.pool_blocks[i]));
  }
  KVTIER_ASSERT(entries == r.table_entries);
  meta_reservation_ =
      Reservation(ledger, Tier::kDevice, Category::kKv,
                  entries * sizeof(uint32_t) + static_cast<size_t>(max_blocks_) * sizeof(cpu::KvSpan));
  table_.assign(entries, BlockPool::kNoBlock);
  span_buf_.resize(static_cast<size_t>(max_blocks_));
  scratch_reservation_ = Reservation(ledger, Tier::kDevice, Category::kScratch, r.scratch_bytes);
  scratch_.resize(r.scratch_bytes);
}

uint32_t& ResidentKv::slot(uint32_t layer, uint32_t group, uint32_t block) {
  return table_[table_offset_[layer] + size_t{group} * static_cast<size_t>(max_blocks_) + block];
}

uint32_t ResidentKv::slot(uint32_t layer, uint32_t group, uint32_t block) const {
  return table_[table_offset_[layer] + size_t{group} * static_cast<size_t>(max_blocks_) + block];
}

int64_t ResidentKv::length() const {
  return *std::min_element(length_.begin(), length_.end());
}

void ResidentKv::write(uint32_t layer, int64_t pos0, int64_t n, const float* k, const float* v) {
  KVTIER_ASSERT(layer < geo_.n_layer(), "layer {}", layer);
  KVTIER_ASSERT(pos0 == length_[layer], "layer {}: write at {} but {} positions stored", layer, pos0,
                length_[layer]);
  if (pos0 + n > capacity_) {
    fail(ErrorKind::kBudget, "the KV cache holds {} positions; {} are needed (raise --ctx)", capacity_,
         pos0 + n);
  }
  const int64_t hk = geo_.n_head_kv[layer];
  const int64_t g = geo_.heads_per_group(layer);
  const int64_t bt = geo_.block_tokens;
  const int64_t dk = geo_.head_dim_k;
  const int64_t dv = geo_.head_dim_v;
  const size_t esz = cpu::kv_dtype_bytes(geo_.dtype);
  BlockPool& pool = pool_of(layer);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = pos0 + t;
    const auto b = static_cast<uint32_t>(pos / bt);
    const int64_t row = pos % bt;
    for (int64_t grp = 0; grp < hk / g; ++grp) {
      uint32_t& s = slot(layer, static_cast<uint32_t>(grp), b);
      if (s == BlockPool::kNoBlock) s = pool.acquire();
      uint8_t* base = pool.data(s);
      for (int64_t i = 0; i < g; ++i) {
        const int64_t h = grp * g + i;
        uint8_t* kd = base + static_cast<size_t>((i * bt + row) * dk) * esz;
        uint8_t* vd = base + static_cast<size_t>(g * bt * dk + (i * bt + row) * dv) * esz;
        store_kv_row(geo_.dtype, k + (t * hk + h) * dk, dk, kd);
        store_kv_row(geo_.dtype, v + (t * hk + h) * dv, dv, vd);
      }
    }
  }
  length_[layer] = pos0 + n;
}

std::span<const cpu::KvSpan> ResidentKv::spans(uint32_t layer, uint32_t group, int64_t end,
                                               std::span<cpu::KvSpan> out) const {
  const int64_t bt = geo_.block_tokens;
  const int64_t g = geo_.heads_per_group(layer);
  const size_t esz = cpu::kv_dtype_bytes(geo_.dtype);
  const int64_t nb = blocks_for(end);
  KVTIER_ASSERT(static_cast<int64_t>(out.size()) >= nb, "span buffer of {} for {} blocks", out.size(), nb);
  const BlockPool& pool = pool_of(layer);
  for (int64_t b = 0; b < nb; ++b) {
    const uint32_t s = slot(layer, group, static_cast<uint32_t>(b));
    KVTIER_ASSERT(s != BlockPool::kNoBlock, "layer {} group {} block {} is not stored", layer, group, b);
    const uint8_t* base = pool.data(s);
    cpu::KvSpan& sp = out[static_cast<size_t>(b)];
    sp.pos0 = b * bt;
    sp.n_tokens = std::min(bt, end - b * bt);
    sp.k = base;
    sp.v = base + static_cast<size_t>(g * bt * geo_.head_dim_k) * esz;
    sp.k_head_stride = bt * geo_.head_dim_k;
    sp.v_head_stride = bt * geo_.head_dim_v;
  }
  return out.first(static_cast<size_t>(nb));
}

void ResidentKv::attend(uint32_t layer, int64_t pos0, int64_t n, const float* q, int64_t n_head,
                        const LayerAttention& la, float* o) {
  const int64_t end = pos0 + n;
  KVTIER_ASSERT(end <= length_[layer], "layer {}: attention up to {} but {} positions stored", layer, end,
                length_[layer]);
  const int64_t hk = geo_.n_head_kv[layer];
  const int64_t g = geo_.heads_per_group(layer);
  cpu::AttnParams ap;
  ap.head_dim_k = geo_.head_dim_k;
  ap.head_dim_v = geo_.head_dim_v;
  ap.q_per_kv = n_head / hk;
  ap.scale = la.scale;
  ap.softcap = la.softcap;
  ap.window = la.window;
  ap.kv_dtype = geo_.dtype;
  const int64_t qh = g * ap.q_per_kv;  // query heads per group
  for (int64_t grp = 0; grp < hk / g; ++grp) {
    const auto sp = spans(layer, static_cast<uint32_t>(grp), end, span_buf_);
    cpu::AttnQueries aq{q + grp * qh * ap.head_dim_k, n_head * ap.head_dim_k, n, qh, pos0};
    cpu::AttnOutput out{o + grp * qh * ap.head_dim_v, n_head * ap.head_dim_v, nullptr, 0};
    cpu::attend(threads_, isa_, ap, aq, sp, out, scratch_);
  }
}

void ResidentKv::truncate(int64_t n_tokens) {
  KVTIER_ASSERT(n_tokens >= 0 && n_tokens <= length(), "truncate to {} of {}", n_tokens, length());
  const int64_t keep = blocks_for(n_tokens);
  for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
    for (uint32_t grp = 0; grp < geo_.n_groups(l); ++grp) {
      for (int64_t b = keep; b < max_blocks_; ++b) {
        uint32_t& s = slot(l, grp, static_cast<uint32_t>(b));
        if (s != BlockPool::kNoBlock) {
          pool_of(l).release(s);
          s = BlockPool::kNoBlock;
        }
      }
    }
    length_[l] = n_tokens;
  }
}

uint64_t ResidentKv::blocks_in_use() const {
  uint64_t n = 0;
  for (const auto& p : pools_) n += p->in_use();
  return n;
}

uint64_t ResidentKv::kv_bytes_in_use() const {
  uint64_t n = 0;
  for (const auto& p : pools_) n += uint64_t{p->in_use()} * p->block_bytes();
  return n;
}

}  // namespace kvtier::kv
