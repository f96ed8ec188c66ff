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
      kivi_(kivi_format_of(geometry, options)),
      qtable_(std::max<uint32_t>(options.max_seqs, 1),
              kivi_.bits == 0 ? std::vector<uint32_t>{} : groups_of(geometry),
              std::max<int64_t>(1, (capacity + geometry.block_tokens - 1) / geometry.block_tokens)),
      pass_(geometry.n_layer(), std::max<uint32_t>(options.max_seqs, 1), capacity) {
  const ResidentLayout r = resident_layout(geo_, capacity_, n_head, pool.size(), opt_);
  KVTIER_ASSERT(r.max_blocks == table_.max_blocks());
  pool_index_ = r.pool_index;
  quant_pool_index_ = r.quant_pool_index;
  for (size_t i = 0; i < r.pool_blocks.size(); ++i) {
    pools_.push_back(
        std::make_unique<BlockPool>(ledger, Tier::kDevice, r.pool_block_bytes[i], r.pool_blocks[i]));
  }
  meta_reservation_ = Reservation(
      ledger, Tier::kDevice, Category::kKv,
      r.table_bytes + static_cast<size_t>(r.max_blocks) * sizeof(cpu::KvSpan) + r.selection_bytes);
  positions_.assign(table_.n_seqs(), 0);
  qend_.assign(table_.n_seqs(), 0);
  written_.assign(geo_.n_layer(), 0);
  span_buf_.resize(static_cast<size_t>(r.max_blocks));
  scratch_reservation_ = Reservation(ledger, Tier::kDevice, Category::kScratch, r.scratch_bytes);
  scratch_.resize(r.scratch_bytes - r.retention_bytes);
  if (opt_.selection == policy::Selection::kQuest) {
    std::vector<uint32_t> heads(geo_.n_head_kv.begin(), geo_.n_head_kv.end());
    quest_ = QuestIndex(table_.n_seqs(), heads, capacity_, opt_.knobs.quest_page, geo_.head_dim_k);
    const auto pages = static_cast<size_t>(quest_.pages(capacity_));
    quest_ranges_.resize(pages);
    quest_order_.resize(pages);
    quest_bound_.resize(pages);
    quest_spans_.resize(pages + static_cast<size_t>(table_.max_blocks()));
  }
  if (opt_.retention == policy::Retention::kStreaming) {
    streaming_ = StreamingBuffers(max_new_rows(capacity_, opt_), n_head, geo_.head_dim_k, geo_.head_dim_v,
                                  policy::streaming_sink_blocks(opt_.knobs.sinks, geo_.block_tokens),
                                  table_.max_blocks());
  }
}

bool ResidentKv::attend_quest(uint32_t layer, const float* q, int64_t n_head, const cpu::AttnParams& ap,
                              float* o, const SeqPass& pass) {
  const SeqId seq = pass.seq;
  const int64_t end = pass.pos0 + pass.n;
  if (pass.n != 1 || geo_.window_of(layer) != 0 || quest_.pages(end) * quest_.page() <= opt_.knobs.budget)
    return false;  // prefill is dense (as in the paper); a budget covering the context selects everything
  const int64_t hk = geo_.n_head_kv[layer];
  const int64_t g = geo_.heads_per_group(layer);
  const int64_t G = ap.q_per_kv;
  const int64_t bt = geo_.block_tokens;
  const int64_t dk = geo_.head_dim_k, dv = geo_.head_dim_v;
  const size_t esz = cpu::kv_dtype_bytes(geo_.dtype);
  const BlockPool& pool = pool_of(layer);
  for (int64_t h = 0; h < hk; ++h) {
    const auto ranges = quest_.select(seq, layer, static_cast<uint32_t>(h), q + h * G * dk, G, end,
                                      opt_.knobs.budget, quest_ranges_, quest_order_, quest_bound_);
    const auto grp = static_cast<uint32_t>(h / g);
    const int64_t i = h % g;  // the head's place in its group's blocks
    size_t n = 0;
    for (const PosRange& r : ranges) {
      for (int64_t a = r.pos0; a < r.pos0 + r.n;) {
        const int64_t b = a / bt;
        const int64_t stop = std::min(r.pos0 + r.n, (b + 1) * bt);
        const BlockEntry& e = table_.at(seq, layer, grp, b);
        KVTIER_ASSERT(e.slot != BlockTable::kNoSlot, "seq {} layer {} block {} is not stored", seq, layer, b);
        const uint8_t* base = pool.data(e.slot);
        const int64_t row = a - b * bt;
        cpu::KvSpan& sp = quest_spans_[n++];
        sp.pos0 = a;
        sp.n_tokens = stop - a;
        sp.k = base + static_cast<size_t>((i * bt + row) * dk) * esz;
        sp.v = base + static_cast<size_t>(g * bt * dk + (i * bt + row) * dv) * esz;
        sp.k_head_stride = bt * dk;
        sp.v_head_stride = bt * dv;
        a = stop;
      }
    }
    const cpu::AttnQueries aq{q + h * G * dk, n_head * dk, 1, G, pass.pos0};
    const cpu::AttnOutput out{o + h * G * dv, n_head * dv, nullptr, 0};
    cpu::attend(threads_, isa_, ap, aq, std::span(quest_spans_.data(), n), out, scratch_);
  }
  return true;
}

uint32_t ResidentKv::needs() const {
  return kv_needs(opt_);
}

bool ResidentKv::streams(uint32_t layer) const {
  return opt_.retention == policy::Retention::kStreaming && geo_.window_of(layer) == 0;
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
  q_pre_ = rows.q_pre;
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
  if (opt_.selection == policy::Selection::kQuest) quest_.update(seq, layer, pos0, n, rows.k);
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
  size_t n_spans = 0;
  const int64_t qend = kivi_.bits == 0 ? 0 : qend_[seq];
  for (int64_t b = b0; b < nb; ++b) {
    if (streams(layer) && table_.at(seq, layer, group, b).slot == BlockTable::kNoSlot) {
      continue;  // dropped between sinks and window (streaming does not combine with kivi)
    }
    cpu::KvSpan& sp = out[n_spans++];
    sp = cpu::KvSpan{};
    sp.pos0 = b * bt;
    sp.n_tokens = std::min<int64_t>(bt, end - sp.pos0);
    sp.k_head_stride = bt * geo_.head_dim_k;
    sp.v_head_stride = bt * geo_.head_dim_v;
    sp.n_quant = std::clamp<int64_t>(qend - sp.pos0, 0, sp.n_tokens);
    if (sp.n_quant > 0) {  // KIVI: the block's quantised part
      const BlockEntry& qe = qtable_.at(seq, layer, group, b);
      KVTIER_ASSERT(qe.slot != BlockTable::kNoSlot, "seq {} layer {} group {} block {} is not quantised", seq,
                    layer, group, b);
      const uint64_t kb = cpu::kivi_block_bytes(kivi_, cpu::KiviPlane::kKey, geo_.head_dim_k);
      sp.q_base = sp.pos0;
      sp.kq = quant_pool_of(layer).data(qe.slot);
      sp.vq = sp.kq + g * kb;
      sp.kq_head_stride = static_cast<int64_t>(kb);
      sp.vq_head_stride =
          static_cast<int64_t>(cpu::kivi_block_bytes(kivi_, cpu::KiviPlane::kValue, geo_.head_dim_v));
    }
    if (sp.n_quant == sp.n_tokens) continue;  // no f16 rows left
    const BlockEntry& e = table_.at(seq, layer, group, b);
    KVTIER_ASSERT(e.slot != BlockTable::kNoSlot && e.pos0 == b * bt,
                  "seq {} layer {} group {} block {} is not stored", seq, layer, group, b);
    const uint8_t* base = pool.data(e.slot);
    sp.k = base;
    sp.v = base + static_cast<size_t>(g * bt * geo_.head_dim_k) * esz;
  }
  return out.first(n_spans);
}

void ResidentKv::attend(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o) {
  pass_.attend(layer);
  KVTIER_ASSERT(written_[layer] == pass_.serial(), "layer {}: attention before this pass's write", layer);
  const int64_t dk = geo_.head_dim_k;
  const int64_t dv = geo_.head_dim_v;
  for (const SeqPass& sp : pass_.seqs()) {
    const float* q_pre = q_pre_ == nullptr ? nullptr : q_pre_ + sp.row0 * n_head * dk;
    attend_seq(layer, q + sp.row0 * n_head * dk, q_pre, n_head, la, o + sp.row0 * n_head * dv, sp);
  }
}

void ResidentKv::attend_seq(uint32_t layer, const float* q, const float* q_pre, int64_t n_head,
                            const LayerAttention& la, float* o, const SeqPass& pass) {
  const SeqId seq = pass.seq;
  const int64_t pos0 = pass.pos0;
  const int64_t n = pass.n;
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
  ap.kivi = kivi_;
  if (opt_.selection == policy::Selection::kQuest && attend_quest(layer, q, n_head, ap, o, pass)) return;
  const int64_t qh = g * ap.q_per_kv;  // query heads per group
  const bool stream = streams(layer);
  const int64_t sinks = opt_.knobs.sinks;
  const int64_t window = policy::streaming_window(opt_.knobs);
  if (stream) {  // the queries that attend the sinks, rotated to the sink position
    const int64_t n_plain = policy::streaming_plain_queries(pos0, n, sinks, window);
    if (n_plain < n) {
      KVTIER_ASSERT(compute_ != nullptr && q_pre != nullptr,
                    "streaming retention needs the model's compute hook and q before RoPE");
      const int64_t row = n_head * ap.head_dim_k;
      compute_->rope_q(layer, q_pre + n_plain * row, n - n_plain,
                       policy::streaming_sink_position(sinks, window),
                       streaming_.q_sink.data() + n_plain * row);
    }
  }
  for (int64_t grp = 0; grp < hk / g; ++grp) {
    const auto sp = spans(seq, layer, static_cast<uint32_t>(grp), end, span_buf_);
    cpu::AttnQueries aq{q + grp * qh * ap.head_dim_k, n_head * ap.head_dim_k, n, qh, pos0};
    cpu::AttnOutput out{o + grp * qh * ap.head_dim_v, n_head * ap.head_dim_v, nullptr, 0};
    if (stream) {
      attend_streaming(threads_, isa_, ap, sinks, window, aq,
                       streaming_.q_sink.data() + grp * qh * ap.head_dim_k, grp * qh, sp, out, streaming_,
                       scratch_);
    } else {
      cpu::attend(threads_, isa_, ap, aq, sp, out, scratch_);
    }
  }
}

void ResidentKv::free_blocks(SeqId seq, uint32_t layer, int64_t from, int64_t to) {
  for (uint32_t grp = 0; grp < geo_.n_groups(layer); ++grp) {
    for (int64_t b = from; b < to; ++b) {
      BlockEntry& e = table_.at(seq, layer, grp, b);
      if (e.slot != BlockTable::kNoSlot) pool_of(layer).release(e.slot);
      e = BlockEntry{};
      if (kivi_.bits == 0) continue;
      BlockEntry& qe = qtable_.at(seq, layer, grp, b);
      if (qe.slot != BlockTable::kNoSlot) quant_pool_of(layer).release(qe.slot);
      qe = BlockEntry{};
    }
  }
}

void ResidentKv::end_pass() {
  pass_.end();
  for (const SeqPass& sp : pass_.seqs()) {
    const SeqId seq = sp.seq;
    const int64_t end = sp.pos0 + sp.n;
    positions_[seq] = end;
    if (kivi_.bits != 0) flush_kivi(seq, end);
    if (opt_.retention == policy::Retention::kStreaming) {
      // StreamingLLM: a layer without a window of its own frees the blocks between the sinks and the
      // next query's window (a hole in its table); one with a window keeps it as sliding does.
      for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
        if (!streams(l)) continue;
        const policy::BlockRange r = policy::streaming_free_blocks(
            end, opt_.knobs.sinks, policy::streaming_window(opt_.knobs), geo_.block_tokens);
        if (r.first < r.last) free_blocks(seq, l, r.first, r.last);
      }
    } else if (opt_.retention != policy::Retention::kSliding) {
      continue;
    }
    // Retention: a sliding-window layer frees the blocks wholly below what the next query can see.
    for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
      if (geo_.window_of(l) == 0) continue;
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
      if (opt_.selection == policy::Selection::kQuest) quest_.truncate(seq, l, positions_[seq]);
    }
  }
}

void ResidentKv::truncate(SeqId seq, int64_t n) {
  pass_.check_truncate(seq, n, positions_[seq]);
  if (opt_.retention == policy::Retention::kStreaming && n > 0) {
    // A query at n attends the sinks and its window, or everything while its window reaches the sinks.
    const policy::BlockRange r = policy::streaming_free_blocks(
        n, opt_.knobs.sinks, policy::streaming_window(opt_.knobs), geo_.block_tokens);
    const int64_t from = r.first < r.last ? r.last : 0;
    for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
      for (int64_t b = from; streams(l) && b < blocks_for(n); ++b) {
        if (table_.at(seq, l, 0, b).slot != BlockTable::kNoSlot) continue;
        fail(ErrorKind::kInvalidArgument,
             "cannot truncate sequence {} to {} tokens: streaming retention already dropped positions "
             "{}..{} of layer {}, which position {} attends; prefill again",
             seq, n, b * geo_.block_tokens, (b + 1) * geo_.block_tokens - 1, l, n);
      }
    }
  }
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
  if (kivi_.bits != 0 && n > 0 && n < qend_[seq]) {
    fail(
        ErrorKind::kInvalidArgument,
        "cannot truncate sequence {} to {} tokens: KIVI already quantised positions below {} (their f16 rows "
        "are gone); truncate to at least {}, prefill again, or raise --kivi-residual",
        seq, n, qend_[seq], qend_[seq]);
  }
  if (n == 0 && !qend_.empty()) qend_[seq] = 0;
  const int64_t keep = blocks_for(n);
  for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
    free_blocks(seq, l, std::max(keep, table_.first_block(seq, l)), table_.max_blocks());
    if (opt_.selection == policy::Selection::kQuest) quest_.truncate(seq, l, n);
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
