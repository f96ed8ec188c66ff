#include "kv/resident_kv.h"

#include <algorithm>

#include "core/error.h"
#include "kv/kv_row.h"
#include "policy/retention.h"

namespace kvtier::kv {
namespace {

std::vector<uint32_t> groups_of(const KvGeometry& g) {
  std::vector<uint32_t> out;
  for (uint32_t l = 0; l < g.n_layer(); ++l) out.push_back(g.n_groups(l));
  return out;
}

}  // namespace

ResidentKv::ResidentKv(const KvGeometry& geometry, int64_t capacity, uint32_t n_head, MemoryLedger& ledger,
                       ThreadPool& pool, cpu::Isa isa, const KvOptions& options)
    : geo_(geometry),
      capacity_(capacity),
      opt_(options),
      threads_(pool),
      isa_(isa),
      table_(std::max<uint32_t>(options.max_seqs, 1), groups_of(geometry),
             std::max<int64_t>(1, (capacity + geometry.block_tokens - 1) / geometry.block_tokens)),
      pass_(geometry.n_layer(), std::max<uint32_t>(options.max_seqs, 1), capacity) {
  const ResidentLayout r = resident_layout(geo_, capacity_, n_head, pool.size(), opt_);
  KVTIER_ASSERT(r.max_blocks == table_.max_blocks());
  pool_index_ = r.pool_index;
  for (size_t i = 0; i < r.pool_blocks.size(); ++i) {
    pools_.push_back(
        std::make_unique<BlockPool>(ledger, Tier::kDevice, r.pool_block_bytes[i], r.pool_blocks[i]));
  }
  meta_reservation_ = Reservation(ledger, Tier::kDevice, Category::kKv,
                                  r.table_bytes + static_cast<size_t>(r.max_blocks) * sizeof(cpu::KvSpan));
  positions_.assign(table_.n_seqs(), 0);
  written_.assign(geo_.n_layer(), 0);
  span_buf_.resize(static_cast<size_t>(r.max_blocks));
  scratch_reservation_ = Reservation(ledger, Tier::kDevice, Category::kScratch, r.scratch_bytes);
  scratch_.resize(r.scratch_bytes);
}

int64_t ResidentKv::positions(SeqId seq) const {
  pass_.check_seq(seq, "positions");
  return positions_[seq];
}

std::span<const PassPositions> ResidentKv::begin_batch(std::span<const PassInfo> seqs) {
  pass_.begin(seqs, positions_);
  return pass_.positions();
}

void ResidentKv::write(uint32_t layer, const LayerRows& rows) {
  pass_.write(layer);
  for (const SeqPass& sp : pass_.seqs()) write_seq(layer, rows, sp);
  written_[layer] = pass_.serial();
}

void ResidentKv::write_seq(uint32_t layer, const LayerRows& all, const SeqPass& sp) {
  const SeqId seq = sp.seq;
  const int64_t pos0 = sp.pos0;
  const int64_t n = sp.n;
  const int64_t hk = geo_.n_head_kv[layer];
  const int64_t g = geo_.heads_per_group(layer);
  const int64_t bt = geo_.block_tokens;
  const int64_t dk = geo_.head_dim_k;
  const int64_t dv = geo_.head_dim_v;
  const size_t esz = cpu::kv_dtype_bytes(geo_.dtype);
  BlockPool& pool = pool_of(layer);
  LayerRows rows;  // this sequence's rows
  rows.k = all.k + sp.row0 * hk * dk;
  rows.v = all.v + sp.row0 * hk * dv;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = pos0 + t;
    const int64_t b = pos / bt;
    const int64_t row = pos % bt;
    for (int64_t grp = 0; grp < hk / g; ++grp) {
      BlockEntry& e = table_.at(seq, layer, static_cast<uint32_t>(grp), b);
      if (e.slot == BlockTable::kNoSlot) {
        e.slot = pool.acquire();
        e.pos0 = b * bt;
      }
      e.n = static_cast<uint32_t>(row + 1);
      uint8_t* base = pool.data(e.slot);
      for (int64_t i = 0; i < g; ++i) {
        const int64_t h = grp * g + i;
        uint8_t* kd = base + static_cast<size_t>((i * bt + row) * dk) * esz;
        uint8_t* vd = base + static_cast<size_t>(g * bt * dk + (i * bt + row) * dv) * esz;
        store_kv_row(geo_.dtype, rows.k + (t * hk + h) * dk, dk, kd);
        store_kv_row(geo_.dtype, rows.v + (t * hk + h) * dv, dv, vd);
      }
    }
  }
}

std::span<const cpu::KvSpan> ResidentKv::spans(SeqId seq, uint32_t layer, uint32_t group, int64_t end,
                                               std::span<cpu::KvSpan> out) const {
  const int64_t bt = geo_.block_tokens;
  const int64_t g = geo_.heads_per_group(layer);
  const size_t esz = cpu::kv_dtype_bytes(geo_.dtype);
  const int64_t b0 = table_.first_block(seq, layer);
  const int64_t nb = blocks_for(end);
  KVTIER_ASSERT(static_cast<int64_t>(out.size()) >= nb - b0, "span buffer of {} for {} blocks", out.size(),
                nb - b0);
  const BlockPool& pool = pool_of(layer);
  for (int64_t b = b0; b < nb; ++b) {
    const BlockEntry& e = table_.at(seq, layer, group, b);
    KVTIER_ASSERT(e.slot != BlockTable::kNoSlot && e.pos0 == b * bt,
                  "seq {} layer {} group {} block {} is not stored", seq, layer, group, b);
    const uint8_t* base = pool.data(e.slot);
    cpu::KvSpan& sp = out[static_cast<size_t>(b - b0)];
    sp.pos0 = e.pos0;
    sp.n_tokens = std::min<int64_t>(bt, end - e.pos0);
    sp.k = base;
    sp.v = base + static_cast<size_t>(g * bt * geo_.head_dim_k) * esz;
    sp.k_head_stride = bt * geo_.head_dim_k;
    sp.v_head_stride = bt * geo_.head_dim_v;
  }
  return out.first(static_cast<size_t>(nb - b0));
}

void ResidentKv::attend(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o) {
  pass_.attend(layer);
  KVTIER_ASSERT(written_[layer] == pass_.serial(), "layer {}: attention before this pass's write", layer);
  const int64_t dk = geo_.head_dim_k;
  const int64_t dv = geo_.head_dim_v;
  for (const SeqPass& sp : pass_.seqs()) {
    attend_seq(layer, q + sp.row0 * n_head * dk, n_head, la, o + sp.row0 * n_head * dv, sp);
  }
}

void ResidentKv::attend_seq(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la,
                            float* o, const SeqPass& sp) {
  const SeqId seq = sp.seq;
  const int64_t pos0 = sp.pos0;
  const int64_t n = sp.n;
  const int64_t end = pos0 + n;
  KVTIER_ASSERT(la.window == geo_.window_of(layer) || geo_.window.empty(),
                "layer {}: attention window {} but the cache was sized for {}", layer, la.window,
                geo_.window_of(layer));
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
    const auto sp = spans(seq, layer, static_cast<uint32_t>(grp), end, span_buf_);
    cpu::AttnQueries aq{q + grp * qh * ap.head_dim_k, n_head * ap.head_dim_k, n, qh, pos0};
    cpu::AttnOutput out{o + grp * qh * ap.head_dim_v, n_head * ap.head_dim_v, nullptr, 0};
    cpu::attend(threads_, isa_, ap, aq, sp, out, scratch_);
  }
}

void ResidentKv::free_blocks(SeqId seq, uint32_t layer, int64_t from, int64_t to) {
  for (uint32_t grp = 0; grp < geo_.n_groups(layer); ++grp) {
    for (int64_t b = from; b < to; ++b) {
      BlockEntry& e = table_.at(seq, layer, grp, b);
      if (e.slot != BlockTable::kNoSlot) pool_of(layer).release(e.slot);
      e = BlockEntry{};
    }
  }
}

void ResidentKv::end_pass() {
  pass_.end();
  for (const SeqPass& sp : pass_.seqs()) {
    const SeqId seq = sp.seq;
    const int64_t end = sp.pos0 + sp.n;
    positions_[seq] = end;
    if (opt_.retention != policy::Retention::kSliding) continue;
    // Retention: a sliding-window layer frees the blocks wholly below what the next query can see.
    for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
      const int64_t keep = policy::sliding_first_block(end, geo_.window_of(l), geo_.block_tokens);
      const int64_t first = table_.first_block(seq, l);
      if (keep > first) {
        free_blocks(seq, l, first, keep);
        table_.set_first_block(seq, l, keep);
      }
    }
  }
}

void ResidentKv::abort_pass() {
  if (!pass_.open()) return;
  pass_.abort();
  // Rows written past the sequences' positions are ignored; blocks that hold none of their positions
  // go back to the pools.
  for (const SeqPass& sp : pass_.seqs()) {
    const SeqId seq = sp.seq;
    const int64_t keep = blocks_for(positions_[seq]);
    for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
      free_blocks(seq, l, std::max(keep, table_.first_block(seq, l)), table_.max_blocks());
    }
  }
}

void ResidentKv::truncate(SeqId seq, int64_t n) {
  pass_.check_truncate(seq, n, positions_[seq]);
  for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
    const int64_t first = table_.first_block(seq, l);
    const int64_t need = n == 0 ? 0 : policy::sliding_first_visible(n, geo_.window_of(l));
    if (n > 0 && first > 0 && need < first * geo_.block_tokens) {
      fail(ErrorKind::kInvalidArgument,
           "cannot truncate sequence {} to {} tokens: sliding retention already freed positions below {} of "
           "layer {}, which position {} attends; prefill again, or use a policy without +sliding",
           seq, n, first * geo_.block_tokens, l, n);
    }
  }
  const int64_t keep = blocks_for(n);
  for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
    free_blocks(seq, l, std::max(keep, table_.first_block(seq, l)), table_.max_blocks());
    if (n == 0) table_.set_first_block(seq, l, 0);
    if (keep > 0) {
      for (uint32_t grp = 0; grp < geo_.n_groups(l); ++grp) {
        BlockEntry& e = table_.at(seq, l, grp, keep - 1);
        if (e.slot != BlockTable::kNoSlot) e.n = static_cast<uint32_t>(n - e.pos0);
      }
    }
  }
  positions_[seq] = n;
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
