#include "kv/tiered_kv.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/align.h"
#include "core/error.h"
#include "kv/kv_row.h"
#include "kv/page_extents.h"
#include "policy/hybrid_plan.h"
#include "policy/kvpr_schedule.h"
#include "policy/retention.h"

namespace kvtier::kv {
namespace {

uint8_t* aligned_bytes(uint64_t bytes, const char* what) {
  void* p = std::aligned_alloc(kPageAlign, round_up(std::max<uint64_t>(bytes, 1), kPageAlign));
  if (p == nullptr) fail(ErrorKind::kBudget, "cannot allocate {} bytes for {}", bytes, what);
  return static_cast<uint8_t*>(p);
}

}  // namespace

void TieredKv::FreeDeleter::operator()(uint8_t* p) const {
  std::free(p);
}

TieredKv::TieredKv(const KvGeometry& geometry, int64_t capacity, uint32_t n_head, MemoryLedger& ledger,
                   ThreadPool& pool, cpu::Isa isa, const TieredOptions& options)
    : geo_(geometry),
      capacity_(capacity),
      threads_(pool),
      isa_(isa),
      opt_(options),
      pass_(geometry.n_layer(), std::max<uint32_t>(options.max_seqs, 1), capacity),
      pages_(std::max<uint32_t>(options.max_seqs, 1), std::vector<uint32_t>(geometry.n_layer(), 1),
             std::max<int64_t>(1, (tiered_home_rows(capacity, options) + geometry.block_tokens - 1) /
                                      geometry.block_tokens)),
      kivi_(kivi_format_of(geometry, options)),
      qpages_(std::max<uint32_t>(options.max_seqs, 1),
              std::vector<uint32_t>(kivi_.bits == 0 ? 0 : geometry.n_layer(), 1),
              std::max<int64_t>(1, (capacity + geometry.block_tokens - 1) / geometry.block_tokens)) {
  // validates, checks the budget (locret: sized for the rows it holds, not the context)
  lay_ = tiered_layout(geo_, tiered_home_rows(capacity_, opt_), n_head, pool.size(), opt_);
  if (opt_.max_new_rows <= 0) opt_.max_new_rows = capacity_;
  esz_ = cpu::kv_dtype_bytes(geo_.dtype);
  row_max_ = std::max(geo_.head_dim_k, geo_.head_dim_v) * esz_;
  shape_.n_head_kv = geo_.n_head_kv;
  shape_.head_bytes_per_token = 2 * row_max_;

  // Compute-local: static heads, new-row staging, attention scratch, then the staging buffers.
  static_reservation_ = Reservation(ledger, Tier::kDevice, Category::kKv, lay_.static_bytes);
  if (lay_.static_bytes > 0) static_.reset(aligned_bytes(lay_.static_bytes, "static KV heads"));
  staging_reservation_ = Reservation(ledger, Tier::kDevice, Category::kStaging, lay_.staging_bytes);
  new_k_.resize(static_cast<size_t>(opt_.max_new_rows) * lay_.h_max * geo_.head_dim_k * esz_);
  new_v_.resize(static_cast<size_t>(opt_.max_new_rows) * lay_.h_max * geo_.head_dim_v * esz_);
  if (kvpr()) {
    new_x_.resize(static_cast<size_t>(opt_.max_new_rows) * lay_.xrow_bytes);
    re_k_.resize(static_cast<size_t>(lay_.recompute_rows) * lay_.h_max * geo_.head_dim_k);
    re_v_.resize(static_cast<size_t>(lay_.recompute_rows) * lay_.h_max * geo_.head_dim_v);
    re_pos_.resize(static_cast<size_t>(lay_.recompute_rows));
  }
  if (hybrid()) {
    act_ratio_ = hybrid_ratio();
    act_blocks_.resize(static_cast<size_t>(pages_.max_blocks()) + 1);
    int64_t a = 0;
    for (size_t b = 0; b < act_blocks_.size(); ++b) {
      const bool act =
          policy::next_block_type(act_ratio_, a, static_cast<int64_t>(b) - a) == policy::BlockKind::kAct;
      act_blocks_[b] = act ? 1 : 0;
      a += act ? 1 : 0;
    }
  }
  scratch_reservation_ = Reservation(ledger, Tier::kDevice, Category::kScratch, lay_.scratch_bytes);
  scratch_.resize(lay_.scratch_bytes - lay_.retention_bytes);
  if (opt_.retention == policy::Retention::kStreaming) {
    streaming_ = StreamingBuffers(opt_.max_new_rows, n_head, geo_.head_dim_k, geo_.head_dim_v,
                                  policy::streaming_sink_blocks(opt_.knobs.sinks, geo_.block_tokens),
                                  pages_.max_blocks());
  }
  staging_ =
      std::make_unique<BlockPool>(ledger, Tier::kDevice, lay_.buffer_bytes, lay_.n_buffers, kPageAlign);
  for (uint32_t i = 0; i < lay_.n_buffers; ++i) buffer_slots_.push_back(staging_->acquire());

  home_ = opt_.disk_dir.empty() ? make_host_store(ledger, lay_.home_bytes)
                                : make_disk_store(ledger, opt_.disk_dir, lay_.home_bytes, opt_.disk_faults);
  home_block_bytes_ = lay_.home_block_bytes;
  home_pins_reservation_ = Reservation(ledger, Tier::kHost, Category::kKv, lay_.home_pin_bytes);
  table_reservation_ = Reservation(ledger, Tier::kHost, Category::kKv, lay_.table_bytes);
  for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
    std::vector<uint32_t>& f = free_pages_.emplace_back();
    for (uint32_t p = lay_.home_pages[l]; p-- > 0;) f.push_back(p);  // page 0 on top
    if (kivi_.bits == 0) continue;
    std::vector<uint32_t>& fq = free_qpages_.emplace_back();
    for (uint32_t p = lay_.home_qpages[l]; p-- > 0;) fq.push_back(p);
  }
  length_.assign(pages_.n_seqs(), 0);
  qend_.assign(pages_.n_seqs(), 0);
  x_end_.assign(static_cast<size_t>(pages_.n_seqs()) * geo_.n_layer(), 0);
  // A job moves one extent per page per plane at most (the engine merges adjacent ones into runs).
  copy_reservation_ = Reservation(ledger, Tier::kHost, Category::kKv, lay_.copy_list_bytes);
  copies_.resize(lay_.max_copies);
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  engine_ = std::make_unique<TransferEngine>(*home_, home_block_bytes_, lay_.queue_slots, copies_.size(),
                                             opt_.copy_delay_us, LinkLimit{opt_.link_bytes_per_s, nullptr});
  if (opt_.selection == policy::Selection::kInfinigen) infinigen_init(n_head, ledger);
  if (quest()) quest_init(ledger);
  lr_n_head_ = n_head;
  if (locret()) locret_init(ledger);
}

TieredKv::~TieredKv() {
  // The copy thread may still be writing into the buffers: stop it before they are freed.
  try {
    engine_->drain();
  } catch (...) {  // the error was reported to whoever waited; nothing more to do at teardown
  }
  engine_.reset();
}

int64_t TieredKv::positions(SeqId seq) const {
  pass_.check_seq(seq, "positions");
  return locret() ? lr_len_[seq] : length_[seq];
}

uint32_t TieredKv::needs() const {
  return kv_needs(opt_);
}

bool TieredKv::streams(uint32_t layer) const {
  return opt_.retention == policy::Retention::kStreaming && geo_.window_of(layer) == 0;
}

std::span<const cpu::KvSpan> TieredKv::stored_spans(uint32_t layer, const uint8_t* base, int64_t head_stride,
                                                    int64_t first, int64_t end) {
  const int64_t bt = geo_.block_tokens;
  size_t n = 0;
  // Blocks no query of the pass sees were not loaded (submit_load); those freed earlier have no page.
  const policy::BlockRange drop =
      policy::streaming_free_blocks(pass_pos0_, opt_.knobs.sinks, policy::streaming_window(opt_.knobs), bt);
  for (int64_t r = first; r < end;) {
    const int64_t b = r / bt;
    if (pages_.at(pass_seq_, layer, 0, b).slot == BlockTable::kNoSlot || (b >= drop.first && b < drop.last)) {
      r = (b + 1) * bt;
      continue;
    }
    const int64_t r1 = std::min(end, (b + 1) * bt);
    if (n > 0 && streaming_.spans[n - 1].pos0 + streaming_.spans[n - 1].n_tokens == r) {
      streaming_.spans[n - 1].n_tokens += r1 - r;  // continues the previous run
    } else {
      KVTIER_ASSERT(n < streaming_.spans.size(), "more than {} stored runs", streaming_.spans.size());
      cpu::KvSpan& sp = streaming_.spans[n++];
      sp.pos0 = r;
      sp.n_tokens = r1 - r;
      sp.k = base + static_cast<uint64_t>(r) * geo_.head_dim_k * esz_;
      sp.v = base + static_cast<uint64_t>(head_stride) * esz_ / 2 +
             static_cast<uint64_t>(r) * geo_.head_dim_v * esz_;
      sp.k_head_stride = head_stride;
      sp.v_head_stride = head_stride;
    }
    r = r1;
  }
  return std::span<const cpu::KvSpan>(streaming_.spans.data(), n);
}

int64_t TieredKv::first_row(uint32_t layer, int64_t pos0) const {
  const bool sliding = opt_.retention == policy::Retention::kSliding ||
                       (opt_.retention == policy::Retention::kStreaming && geo_.window_of(layer) > 0);
  if (!sliding) return 0;
  const int64_t bt = geo_.block_tokens;
  return policy::sliding_first_block(pos0, geo_.window_of(layer), bt) * bt;
}

uint64_t TieredKv::page_offset(uint32_t layer, uint32_t head, int kv, uint32_t page) const {
  const uint64_t pages = lay_.home_pages[layer];
  const uint64_t region = lay_.home_offset[layer] + head * lay_.head_region_bytes(layer) +
                          (kv == 0 ? 0 : pages * lay_.page_bytes[0]);
  return region + uint64_t{page} * lay_.page_bytes[kv];
}

void TieredKv::ensure_pages(SeqId seq, uint32_t layer, int64_t r0, int64_t r1) {
  const int64_t bt = geo_.block_tokens;
  for (int64_t b = r0 / bt; b < (r1 + bt - 1) / bt; ++b) {
    BlockEntry& e = pages_.at(seq, layer, 0, b);
    if (e.slot == BlockTable::kNoSlot) {
      // The layout sized the regions for every block a sequence may hold (tiered_layout).
      KVTIER_ASSERT(!free_pages_[layer].empty(), "layer {}: no free home page for block {}", layer, b);
      e.slot = free_pages_[layer].back();
      free_pages_[layer].pop_back();
      e.pos0 = b * bt;
    }
    e.n = static_cast<uint32_t>(std::min(r1, (b + 1) * bt) - b * bt);
  }
}

void TieredKv::release_pages(SeqId seq, uint32_t layer, int64_t b0, int64_t b1) {
  for (int64_t b = b1 - 1; b >= b0; --b) {  // pushed in reverse: the lowest page is reused first
    BlockEntry& e = pages_.at(seq, layer, 0, b);
    if (e.slot == BlockTable::kNoSlot) continue;
    for (uint32_t h = 0; h < geo_.n_head_kv[layer]; ++h) {
      for (int kv = 0; kv < 2; ++kv) {
        KVTIER_ASSERT(!engine_->home_pinned(page_offset(layer, h, kv, e.slot), lay_.page_bytes[kv]),
                      "layer {} page {} is released while a transfer uses it", layer, e.slot);
      }
    }
    free_pages_[layer].push_back(e.slot);
    e = BlockEntry{};
  }
  if (kivi_.bits == 0) return;
  for (int64_t b = b1 - 1; b >= b0; --b) {
    BlockEntry& e = qpages_.at(seq, layer, 0, b);
    if (e.slot == BlockTable::kNoSlot) continue;
    for (uint32_t h = 0; h < geo_.n_head_kv[layer]; ++h) {
      KVTIER_ASSERT(!engine_->home_pinned(qpage_offset(layer, h, e.slot), lay_.qpage_bytes),
                    "layer {} quantised page {} is released while a transfer uses it", layer, e.slot);
    }
    free_qpages_[layer].push_back(e.slot);
    e = BlockEntry{};
  }
}

void TieredKv::add_rows(SeqId seq, uint32_t layer, uint32_t head, int kv, uint8_t* buf, int64_t r0,
                        int64_t r1, size_t& n) {
  const int64_t bt = geo_.block_tokens;
  const uint64_t rb = (kv == 0 ? geo_.head_dim_k : geo_.head_dim_v) * esz_;
  const uint64_t a = home_->alignment();
  for (int64_t b = r0 / bt; r1 > r0 && b <= (r1 - 1) / bt; ++b) {
    const BlockEntry& e = pages_.at(seq, layer, 0, b);
    if (e.slot == BlockTable::kNoSlot && streams(layer)) continue;  // dropped by streaming retention
    KVTIER_ASSERT(e.slot != BlockTable::kNoSlot, "seq {} layer {} block {} has no home page", seq, layer, b);
    // The rows of the block, page-rounded for direct I/O inside the page (a page is a whole number of
    // I/O pages): the bytes around the rows are loaded rows or never read as valid.
    const Extent x = block_rows_extent(r0, r1, b, bt, rb, a);
    add_copy(page_offset(layer, head, kv, e.slot) + x.lo, buf + static_cast<uint64_t>(b * bt) * rb + x.lo,
             x.bytes(), n);
  }
}

TieredKv::Layout TieredKv::layout_for(uint32_t group) const {
  const StagingPlanes sp = staging_planes(lay_, geo_, lay_.buffer_bytes, group);
  Layout lay;
  lay.group = group;
  lay.pitch = sp.pitch;
  lay.qpitch = sp.qpitch;
  lay.xpitch = sp.xpitch;
  lay.rows = sp.rows;
  return lay;
}

std::span<const PassPositions> TieredKv::begin_batch(std::span<const PassInfo> seqs) {
  if (locret()) locret_begin(seqs);
  pass_.begin(seqs, length_);
  try {
    KVTIER_ASSERT(pass_.total() <= opt_.max_new_rows, "pass of {} rows, staging for {}", pass_.total(),
                  opt_.max_new_rows);
    const SeqPass& first = pass_.seqs()[0];
    pass_seq_ = first.seq;
    pass_pos0_ = first.pos0;
    pass_n_ = first.n;
    pass_row0_ = 0;
    // One plan for the batch, for its longest sequence (the group choice does not change the bits).
    int64_t s_kv = 0;
    for (const SeqPass& sp : pass_.seqs()) s_kv = std::max(s_kv, sp.pos0 + sp.n);
    if (!pools_.empty()) pool_check(pass_.seqs());
    plan(s_kv);
    if (infinigen()) infinigen_begin();
    plan_mini_batches();
    visit_order_.clear();
    for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
      for (const uint32_t b : seq_order_) {
        for (size_t i = first_unit_[l]; i < plan_.units.size() && plan_.units[i].layer == l; ++i) {
          if (!plan_.units[i].is_static) visit_order_.push_back({b, i});
        }
      }
    }
  } catch (...) {
    pass_.abort();
    throw;
  }
  return pass_.positions();
}

void TieredKv::plan(int64_t s_kv) {
  const policy::RowsForGroup rows = [this](uint32_t g) { return layout_for(g).rows; };
  // Same group as the last pass: the schedule is unchanged, so nothing is re-planned or
  // allocated on the decode path.
  if (!plan_.units.empty() && policy::choose_group(opt_.placement, shape_, s_kv, rows) == layout_.group) {
    pass_first_visit_ = next_visit_;
    ++passes_;
    return;
  }
  policy::PassPlan plan = policy::plan_pass(opt_.placement, shape_, s_kv, rows);
  if (plan.group != layout_.group) {
    engine_->drain();
    inflight_.clear();
    ++epoch_;
    layout_ = layout_for(plan.group);
  }
  KVTIER_ASSERT(layout_.rows >= s_kv, "staging planes of {} rows for {} positions", layout_.rows, s_kv);
  plan_ = std::move(plan);
  first_unit_.assign(geo_.n_layer(), plan_.units.size());
  offloaded_.clear();
  for (size_t i = 0; i < plan_.units.size(); ++i) {
    const auto& u = plan_.units[i];
    if (first_unit_[u.layer] == plan_.units.size()) first_unit_[u.layer] = i;
    if (!u.is_static) offloaded_.push_back(i);
  }
  // kvpr auto: W before a decode visit is timed, this plan's offloaded units being one sequence's
  // visits per step (a prefill's plan stands in for the first decode step's).
  hidden_seed_ =
      policy::kvpr_hidden_estimate(opt_.kvpr_decode_weights_s, static_cast<int64_t>(offloaded_.size()));
  pass_first_visit_ = next_visit_;
  ++passes_;
}

void TieredKv::write(uint32_t layer, const LayerRows& rows) {
  pass_.write(layer);
  q_pre_ = rows.q_pre;
  const int64_t n = pass_.total();
  if (kvpr()) {
    KVTIER_ASSERT(compute_ != nullptr && rows.x != nullptr, "kvpr needs the model's hook and layer inputs");
    compute_->encode_inputs(layer, rows.x, n, new_x_.data());
  }
  for (const SeqPass& sp : pass_.seqs()) {
    // (a pooled layer's rows are its slots: pages for the first C only)
    if (const int64_t r0 = pool_row(layer, sp.pos0), r1 = pool_row(layer, sp.pos0 + sp.n); r1 > r0)
      ensure_pages(sp.seq, layer, r0, r1);
    if (kivi_.bits != 0) {
      ensure_qpages(sp.seq, layer, std::max(quantised_end(sp.seq, sp.pos0), first_row(layer, sp.pos0)),
                    quantised_end(sp.seq, sp.pos0 + sp.n));
      // kivi+kvpr: the new rows' inputs go to their blocks' quantised page indices (xpage_of)
      if (kvpr()) ensure_qpages(sp.seq, layer, sp.pos0, sp.pos0 + sp.n);
    }
  }
  const float* k = rows.k;
  const float* v = rows.v;
  const int64_t hk = geo_.n_head_kv[layer];
  const int64_t dk = geo_.head_dim_k, dv = geo_.head_dim_v;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < hk; ++h) {
      store_kv_row(geo_.dtype, k + (t * hk + h) * dk, dk,
                   new_k_.data() + static_cast<size_t>((t * hk + h) * dk) * esz_);
      store_kv_row(geo_.dtype, v + (t * hk + h) * dv, dv,
                   new_v_.data() + static_cast<size_t>((t * hk + h) * dv) * esz_);
    }
  }
  if (infinigen()) infinigen_write(layer, rows);
  if (quest()) quest_write(layer, rows);
  if (locret()) locret_write(layer, rows);
}

void TieredKv::submit_load(uint64_t visit, SeqId seq, size_t unit_index, int64_t rows, bool this_pass) {
  const policy::Unit& u = plan_.units[unit_index];
  uint8_t* base = buffer(visit);
  rows = pool_row(u.layer, rows);  // a pooled layer: its live slots
  const int64_t first = std::min(first_row(u.layer, rows), rows);
  // KIVI: the quantised pages of [first, qend), f16 rows from qend on.
  const int64_t qend = kivi_.bits == 0 ? 0 : std::max(first, quantised_end(seq, rows));
  // kvpr: the inputs of [first, first + xrows), K/V from there on (kivi+kvpr: whole key groups below
  // qend, their quantised pages from first + xrows on).
  const int64_t xrows = split_rows(seq, u, first, rows, qend);
  // kvpr: the visit stores its new rows' inputs when it recomputes (or always, lazy_inputs() off), and
  // that store writes back the I/O page around row `rows`.
  const bool xcontext = kvpr() && (!lazy_inputs() || xrows > 0);
  size_t n_blocks = 0;
  // Streaming: the blocks between the sinks and the window of the pass's first query are not needed
  // (they are freed when the pass ends).
  policy::BlockRange drop;
  if (streams(u.layer)) {
    drop = policy::streaming_free_blocks(rows, opt_.knobs.sinks, policy::streaming_window(opt_.knobs),
                                         geo_.block_tokens);
  }
  // infinigen: the rows speculated for this visit's layer in this pass, where they are known already.
  const Speculation* spec = this_pass ? speculation(u.layer) : nullptr;
  uint32_t spec_b = 0;
  for (; spec != nullptr && pass_.seqs()[spec_b].seq != seq; ++spec_b) {
  }
  // An evicting decode step on a disk home rewrites each victim's I/O page (pool_store): load it too.
  const bool victims = spec != nullptr && home_->alignment() > 1 &&
                       pool_evicts(u.layer, pass_.seqs()[spec_b].pos0, pass_.seqs()[spec_b].n);
  KVTIER_ASSERT(!victims || pool_ins_pass_[u.layer] == passes_, "layer {}'s victims are not chosen yet",
                u.layer);
  for (uint32_t h = 0; spec != nullptr && h < u.n_heads; ++h) {
    const int32_t victim = victims ? pool_slot(u.layer, pass_.seqs()[spec_b].row0, u.head0 + h) : -1;
    add_chosen_rows(*spec, spec_b, seq, u.layer, u.head0 + h, base + 2ull * h * layout_.pitch,
                    base + (2ull * h + 1) * layout_.pitch, rows, victim, n_blocks);
  }
  if (spec != nullptr) ++(quest() ? qs_.selective_loads : ig_.selective_loads);
  for (uint32_t h = 0; spec == nullptr && h < u.n_heads; ++h) {
    for (int kv = 0; kv < 2; ++kv) {
      uint8_t* plane = base + (2ull * h + kv) * layout_.pitch;
      const int64_t f16_first = std::max(first + xrows, qend);  // kivi: f16 rows from qend on
      if (hybrid()) {  // the K/V of the KV blocks only (hybrid combines with neither streaming nor kivi)
        const int64_t bt = geo_.block_tokens;
        for (int64_t b = first / bt; first < rows && b <= (rows - 1) / bt; ++b)
          if (!act_block(b))
            add_rows(seq, u.layer, u.head0 + h, kv, plane, std::max(first, b * bt),
                     std::min(rows, (b + 1) * bt), n_blocks);
      } else if (drop.first < drop.last) {  // (streaming does not combine with kivi)
        add_rows(seq, u.layer, u.head0 + h, kv, plane, f16_first, drop.first * geo_.block_tokens, n_blocks);
        add_rows(seq, u.layer, u.head0 + h, kv, plane, drop.last * geo_.block_tokens, rows, n_blocks);
      } else {
        add_rows(seq, u.layer, u.head0 + h, kv, plane, f16_first, rows, n_blocks);
      }
    }
    if (qend > first + xrows)
      add_qgroups(seq, u.layer, u.head0 + h, qplane(base, h), first + xrows, qend, n_blocks);
  }
  if (hybrid()) {  // the inputs of the ACT blocks
    const int64_t bt = geo_.block_tokens;
    for (int64_t b = first / bt; first < rows && b <= (rows - 1) / bt; ++b)
      if (act_block(b))
        add_xrows(seq, u.layer, xplane(base), std::max(first, b * bt), std::min(rows, (b + 1) * bt),
                  n_blocks);
  }
  if (kvpr()) {
    add_xrows(seq, u.layer, xplane(base), first, first + xrows, n_blocks);
    if (xcontext) add_xcontext(seq, u.layer, xplane(base), rows, n_blocks);  // around the rows it may store
  }
  Visit vis;
  vis.visit = visit;
  vis.unit = u;
  vis.seq = seq;
  vis.first = first;
  vis.rows = rows;
  vis.qend = qend;
  vis.xrows = xrows;
  vis.xcontext = xcontext;
  vis.epoch = epoch_;
  vis.sel_pass = spec != nullptr ? spec->pass : 0;
  // Submitted even with nothing to load: waiting on it also orders this visit after the store that
  // last read the buffer (a zero-byte job is still a FIFO fence). A selective load is a gather: the
  // visit reads only the chosen rows and the new ones from the buffer (compact_unit), so the engine
  // may read through short gaps between them.
  vis.ticket =
      engine_->prepare(CopyDir::kLoad, std::span(copies_.data(), n_blocks),
                       {staging_.get(), buffer_slot(visit)}, spec != nullptr ? Gaps::kGather : Gaps::kExact);
  inflight_.push_back(vis);
}

void TieredKv::prefetch_ahead(uint64_t visit, bool keep_own_next) {
  const uint64_t n_visits = visit_order_.size();
  const uint64_t last = inflight_.empty() ? visit : std::max(visit, inflight_.back().visit);
  for (uint64_t v = last + 1; v <= visit + opt_.placement.prefetch_depth; ++v) {
    const uint64_t rel = v - pass_first_visit_;
    const uint64_t pass_ahead = rel / n_visits;
    if (pass_ahead > 1) break;  // two passes ahead: their lengths are unknown
    // A unit's next-pass load needs this pass's store of that unit submitted first (the FIFO orders
    // them): only the visits up to this unit's own next one qualify (a depth of at least the units
    // per pass would otherwise load units this pass has not stored yet).
    if (v > visit + n_visits || (keep_own_next && v == visit + n_visits)) break;
    // The next pass is assumed to be the same batch (a decode step); a different one loads anew.
    const VisitSlot slot = visit_order_[rel % n_visits];
    const SeqPass& sp = pass_.seqs()[slot.b];
    const int64_t rows = pass_ahead == 0 ? sp.pos0 : sp.pos0 + sp.n;
    if (pass_ahead == 1 && locret_evicts_after(sp)) break;  // the next pass loads the rows kept
    if (rows + 1 > layout_.rows) break;                     // the next pass will need another layout
    if (quest_waits(plan_.units[slot.unit].layer, sp, pass_ahead == 0)) break;  // its query is not known yet
    submit_load(v, sp.seq, slot.unit, rows, pass_ahead == 0);
  }
}

void TieredKv::scatter_new_rows(uint8_t* base, uint64_t pitch, const policy::Unit& u, int64_t pos0,
                                int64_t n) {
  const int64_t hk = geo_.n_head_kv[u.layer];
  const uint64_t rk = geo_.head_dim_k * esz_, rv = geo_.head_dim_v * esz_;
  for (int64_t t = 0; t < n; ++t) {
    for (uint32_t h = 0; h < u.n_heads; ++h) {
      const int64_t src = t * hk + u.head0 + h;
      const uint64_t row = static_cast<uint64_t>(pass_row0_ * hk + src);  // the pass's rows of this sequence
      std::memcpy(base + 2ull * h * pitch + static_cast<uint64_t>(pos0 + t) * rk, new_k_.data() + row * rk,
                  rk);
      std::memcpy(base + (2ull * h + 1) * pitch + static_cast<uint64_t>(pos0 + t) * rv,
                  new_v_.data() + row * rv, rv);
    }
  }
}

void TieredKv::attend_unit(const uint8_t* base, uint64_t pitch, const policy::Unit& u, int64_t pos0,
                           int64_t n, const float* q, int64_t n_head, const LayerAttention& la, float* o) {
  const int64_t first = first_row(u.layer, pos0);
  cpu::AttnParams ap;
  ap.head_dim_k = geo_.head_dim_k;
  ap.head_dim_v = geo_.head_dim_v;
  ap.q_per_kv = n_head / geo_.n_head_kv[u.layer];
  ap.scale = la.scale;
  ap.softcap = la.softcap;
  ap.window = la.window;
  ap.kv_dtype = geo_.dtype;
  cpu::KvSpan span;
  span.pos0 = first;
  span.n_tokens = pos0 + n - first;
  span.k = base + static_cast<uint64_t>(first) * geo_.head_dim_k * esz_;
  span.v = base + pitch + static_cast<uint64_t>(first) * geo_.head_dim_v * esz_;
  span.k_head_stride = static_cast<int64_t>(2 * pitch / esz_);
  span.v_head_stride = span.k_head_stride;
  if (kivi_.bits != 0) {  // quantised below the pass's quantised end (offloaded units only)
    ap.kivi = kivi_;
    span.n_quant = std::clamp<int64_t>(quantised_end(pass_seq_, pos0) - first, 0, span.n_tokens);
    auto* b = const_cast<uint8_t*>(base);
    span.kq = qplane(b, 0);
    span.vq = span.kq + lay_.qpage_v_offset;
    span.kq_head_stride = static_cast<int64_t>(layout_.qpitch);
    span.vq_head_stride = span.kq_head_stride;
    span.kq_block_stride = static_cast<int64_t>(lay_.qpage_bytes);
    span.vq_block_stride = span.kq_block_stride;
  }
  const int64_t qh = u.n_heads * ap.q_per_kv;
  const int64_t first_q = u.head0 * ap.q_per_kv;
  cpu::AttnQueries aq{q + first_q * ap.head_dim_k, n_head * ap.head_dim_k, n, qh, pos0};
  // A pool's prefill pass weighs the rows it attends (every row of the buffer: no selection at prefill).
  const bool weighs = pool_weighs(u.layer) && base != compact_.data();
  cpu::AttnOutput out{o + first_q * ap.head_dim_v, n_head * ap.head_dim_v,
                      weighs ? pool_lse_.data() : nullptr, weighs ? qh : 0};
  if (streams(u.layer)) {
    const auto spans = stored_spans(u.layer, base, span.k_head_stride, first, pos0 + n);
    attend_streaming(threads_, isa_, ap, opt_.knobs.sinks, policy::streaming_window(opt_.knobs), aq,
                     streaming_.q_sink.data() + first_q * ap.head_dim_k, first_q, spans, out, streaming_,
                     scratch_);
    return;
  }
  cpu::attend(threads_, isa_, ap, aq, std::span(&span, 1), out, scratch_);
  if (weighs) pool_add_mass(ap, aq, span, u);
}

void TieredKv::attend(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o) {
  pass_.attend(layer);
  if (infinigen()) infinigen_observe(layer, q, la);
  if (quest()) quest_select(layer, q, n_head);
  KVTIER_ASSERT(la.window == geo_.window_of(layer) || geo_.window.empty(),
                "layer {}: attention window {} but the cache was sized for {}", layer, la.window,
                geo_.window_of(layer));
  for (const uint32_t b : seq_order_) {  // mini-batch by mini-batch (hybrid), else batch order
    const SeqPass& sp = pass_.seqs()[b];
    pass_seq_ = sp.seq;
    pass_pos0_ = sp.pos0;
    pass_n_ = sp.n;
    pass_row0_ = sp.row0;
    attend_seq(layer, q + sp.row0 * n_head * geo_.head_dim_k, n_head, la,
               o + sp.row0 * n_head * geo_.head_dim_v);
  }
}

void TieredKv::attend_seq(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la,
                          float* o) {
  // Where the pass's rows go in the buffers: its positions, or in a pooled layer its live slots.
  const int64_t pos0 = pool_row(layer, pass_pos0_);
  const bool evicts = pool_evicts(layer, pass_pos0_, pass_n_);  // rows go to victims' slots after attention
  const int64_t n = pass_n_;
  if (streams(layer)) {  // the queries that attend the sinks, rotated to the sink position
    const int64_t sinks = opt_.knobs.sinks;
    const int64_t window = policy::streaming_window(opt_.knobs);
    const int64_t n_plain = policy::streaming_plain_queries(pos0, n, sinks, window);
    if (n_plain < n) {
      KVTIER_ASSERT(compute_ != nullptr && q_pre_ != nullptr,
                    "streaming retention needs the model's compute hook and q before RoPE");
      const int64_t row = n_head * geo_.head_dim_k;
      compute_->rope_q(layer, q_pre_ + (pass_row0_ + n_plain) * row, n - n_plain,
                       policy::streaming_sink_position(sinks, window),
                       streaming_.q_sink.data() + n_plain * row);
    }
  }
  bool inputs_stored = false;
  for (size_t i = first_unit_[layer]; i < plan_.units.size() && plan_.units[i].layer == layer; ++i) {
    const policy::Unit& u = plan_.units[i];
    if (u.is_static) {
      uint8_t* base = static_base(pass_seq_, layer);
      scatter_new_rows(base, lay_.static_pitch, u, pos0, n);
      if (const int64_t c = selects() ? compact_unit(base, lay_.static_pitch, u, pos0, n) : -1; c >= 0) {
        attend_unit(compact_.data(), compact_pitch_, u, c, n, q, n_head, la, o);
      } else {
        attend_unit(base, lay_.static_pitch, u, pos0, n, q, n_head, la, o);
      }
      // the new rows into their slots (victims' among them), now that this pass attended them
      if (evicts) pool_patch(base, lay_.static_pitch, u, pos0, n);
      continue;
    }
    const uint64_t visit = next_visit_++;
    // kvpr auto times decode visits only (a prefill chunk's compute says nothing about a step's).
    const bool timed = time_visits() && n == 1;
    const double t_start = timed ? visit_clock() : 0;
    if (timed) {
      visit_started(t_start);
    } else {
      prev_visit_start_ = -1;
    }
    const bool ready =
        !inflight_.empty() && inflight_.front().visit == visit && inflight_.front().epoch == epoch_ &&
        inflight_.front().seq == pass_seq_ && inflight_.front().unit.layer == u.layer &&
        inflight_.front().unit.head0 == u.head0 && inflight_.front().unit.n_heads == u.n_heads &&
        inflight_.front().rows == pos0 &&
        (inflight_.front().sel_pass == 0 || inflight_.front().sel_pass == passes_) &&
        inflight_.front().first == std::min(first_row(u.layer, pos0), pos0) &&
        (kivi_.bits == 0 ||
         inflight_.front().qend == std::max(inflight_.front().first, quantised_end(pass_seq_, pos0)));
    // (kvpr: any split of the load is right; the visit recomputes what the load did not carry as K/V)
    int64_t xfirst = 0, xrows = 0;  // kvpr: the rows this visit recomputes
    bool xcontext = false;          // kvpr: the load brought the inputs' page around pos0
    if (ready) {
      engine_->wait(inflight_.front().ticket);
      xfirst = inflight_.front().first;
      xrows = inflight_.front().xrows;
      xcontext = inflight_.front().xcontext;
      inflight_.erase(inflight_.begin());
    } else {
      // Not prefetched (first visit, after a truncation or a layout change): load now.
      engine_->drain();
      inflight_.clear();
      submit_load(visit, pass_seq_, i, pos0, true);
      if (pos0 > 0) ++sync_loads_;
      engine_->wait(inflight_.front().ticket);
      xfirst = inflight_.front().first;
      xrows = inflight_.front().xrows;
      xcontext = inflight_.front().xcontext;
      inflight_.clear();
    }
    // The load has completed and FIFO order completed every earlier job on this buffer: nothing in
    // flight may still read or write it when the compute writes into it.
    KVTIER_ASSERT(staging_->pins(buffer_slot(visit)) == 0, "staging buffer {} is pinned by a transfer",
                  buffer_slot(visit));
    uint8_t* base = buffer(visit);
    const int64_t act_n = hybrid() ? act_rows(xfirst, pos0) : 0;  // hybrid: rows of ACT blocks
    if (kvpr()) {
      last_split_ = xrows + act_n;
      payload_x_bytes_ += static_cast<uint64_t>(xrows + act_n) * geo_.act_row_bytes[layer];
    }
    if (kivi_.bits == 0 && !streams(layer)) {  // the K/V rows of past positions the visit loaded
      payload_kv_bytes_ +=
          static_cast<uint64_t>(pos0 - std::min(first_row(layer, pos0), pos0) - xrows - act_n) * u.n_heads *
          (geo_.head_dim_k + geo_.head_dim_v) * esz_;
    }
    // kvpr: the recomputed rows inside the pages the store writes back go first (the store reads them);
    // the rest runs after the next visit's load is submitted, so that the link works meanwhile.
    // kivi+kvpr: whole key groups, and those of the quantised page that the store of this pass's new
    // groups writes back (the block of q0, below) go first too.
    const int64_t xend = xfirst + xrows;
    int64_t x_mid = std::clamp(store_first_row(pos0), xfirst, xend);
    if (kivi_.bits != 0 && xrows > 0) {
      const int64_t q0 = std::max(quantised_end(pass_seq_, pos0), first_row(layer, pos0));
      const int64_t q1 = quantised_end(pass_seq_, pos0 + n);
      if (q1 > q0) x_mid = std::min(x_mid, q0 / geo_.block_tokens * geo_.block_tokens);
      x_mid = std::max(xfirst, x_mid / kivi_.key_group * kivi_.key_group);
    }
    const bool calibrate = time_visits() && !hybrid() && xrows > 0;  // kvpr auto: time the recompute
    double recompute_s = 0;
    if (x_mid < xend) {
      const double t0 = calibrate ? visit_clock() : 0;
      recompute_rows(base, u, x_mid, xend);
      if (calibrate) recompute_s += visit_clock() - t0;
    }
    if (act_n > 0) recompute_act(base, u, xfirst, pos0, store_first_row(pos0), pos0);
    if (timed) prev_blocked_s_ = visit_clock() - t_start;  // waiting for the load, recomputing
    scatter_new_rows(base, layout_.pitch, u, pos0, n);
    // kvpr: the layer's first offloaded unit stores the new rows' inputs too: always at prefill, with
    // forced splits and hybrid; kvpr auto's decode visits only when they recompute (x_end()).
    const bool store_inputs =
        kvpr() && !inputs_stored && x_end(pass_seq_, layer) >= pos0 && (!lazy_inputs() || n > 1 || xrows > 0);
    if (store_inputs) {
      if (!xcontext) {  // a load at l = 0 left out the page around pos0 (a prefill chunk): load it now
        size_t nc = 0;
        add_xcontext(pass_seq_, layer, xplane(base), pos0, nc);
        if (nc > 0) {
          engine_->wait(engine_->prepare(CopyDir::kLoad, std::span(copies_.data(), nc),
                                         {staging_.get(), buffer_slot(visit)}));
        }
      }
      scatter_new_inputs(xplane(base), layer, pos0, n);
      inputs_stored = true;
      x_end(pass_seq_, layer) = pos0 + n;
    }
    // KIVI: the key groups that leave the residual window with this pass, quantised now (this pass
    // still attends their f16 rows; later ones load the quantised pages).
    const int64_t q0 = kivi_.bits == 0 ? 0 : std::max(quantised_end(pass_seq_, pos0), first_row(layer, pos0));
    const int64_t q1 = kivi_.bits == 0 ? 0 : quantised_end(pass_seq_, pos0 + n);
    if (q1 > q0) quantise_unit(base, u, q0, q1);
    // Write back only the new rows (page-aligned around them for direct I/O; the bytes before the
    // first new row in its page are the loaded rows, those after the last are never read as valid),
    // and the quantised pages of new groups (whole pages: the rest of a page is loaded or not valid).
    // (A pooled layer's evicting pass stores after its attention, below.)
    size_t n_blocks = 0;
    for (uint32_t h = 0; h < u.n_heads && !evicts; ++h) {
      for (int kv = 0; kv < 2; ++kv) {
        add_rows(pass_seq_, layer, u.head0 + h, kv, base + (2ull * h + kv) * layout_.pitch, pos0, pos0 + n,
                 n_blocks);
      }
      if (q1 > q0) add_qpages(pass_seq_, layer, u.head0 + h, qplane(base, h), q0, q1, n_blocks);
    }
    if (store_inputs) add_xrows(pass_seq_, layer, xplane(base), pos0, pos0 + n, n_blocks);
    if (!evicts) {
      engine_->prepare(CopyDir::kStore, std::span(copies_.data(), n_blocks),
                       {staging_.get(), buffer_slot(visit)});
    }
    // kvpr auto's first measurement of the recompute goes before the next load is planned, so that
    // its split already uses the measured rate (the link idles during this one recompute).
    const bool first_measurement = calibrate && recompute_s_per_row_ == 0;
    auto recompute_rest = [&] {
      if (xfirst < x_mid) {
        const double t0 = timed || calibrate ? visit_clock() : 0;
        recompute_rows(base, u, xfirst, x_mid);
        const double dt = timed || calibrate ? visit_clock() - t0 : 0;
        if (timed) prev_blocked_s_ += dt;
        recompute_s += dt;
      }
      if (calibrate) calibrate_recompute(u, xrows, recompute_s);
    };
    if (first_measurement) recompute_rest();
    prefetch_ahead(visit, evicts);  // (evicting: this unit's next load must follow its store)
    if (!first_measurement) recompute_rest();
    if (act_n > 0) {  // hybrid: the ACT rows the store did not need, while the next load runs
      const double t0 = timed ? visit_clock() : 0;
      recompute_act(base, u, xfirst, pos0, xfirst, store_first_row(pos0));
      if (timed) prev_blocked_s_ += visit_clock() - t0;
    }
    // infinigen: attention over the chosen rows (a load of this pass's speculation holds only those).
    if (const int64_t c = selects() ? compact_unit(base, layout_.pitch, u, pos0, n) : -1; c >= 0) {
      attend_unit(compact_.data(), compact_pitch_, u, c, n, q, n_head, la, o);
    } else {
      attend_unit(base, layout_.pitch, u, pos0, n, q, n_head, la, o);
    }
    if (evicts) {  // the staged rows into their slots (victims' among them), then their store
      KVTIER_ASSERT(staging_->pins(buffer_slot(visit)) == 0, "staging buffer {} is pinned by a transfer",
                    buffer_slot(visit));
      pool_patch(base, layout_.pitch, u, pos0, n);
      pool_store(base, u, n, n_blocks);
      engine_->prepare(CopyDir::kStore, std::span(copies_.data(), n_blocks),
                       {staging_.get(), buffer_slot(visit)});
    }
  }
}

void TieredKv::end_pass() {
  pass_.end();
  if (kvpr()) pass_splits_.push_back(last_split_);
  for (const SeqPass& sp : pass_.seqs()) {
    const SeqId seq = sp.seq;
    const int64_t end = sp.pos0 + sp.n;
    length_[seq] = end;
    if (kivi_.bits != 0) {
      qend_[seq] = quantised_end(seq, end);
      release_f16_pages(seq, qend_[seq]);
    }
    if (opt_.retention == policy::Retention::kStreaming) {
      // StreamingLLM: pages between the sinks and the next query's window go back to the free list
      // (the next pass's loads skip them); layers with a window of their own keep it as sliding does.
      for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
        if (!streams(l)) continue;
        const policy::BlockRange r = policy::streaming_free_blocks(
            end, opt_.knobs.sinks, policy::streaming_window(opt_.knobs), geo_.block_tokens);
        if (r.first < r.last) release_pages(seq, l, r.first, r.last);
      }
    } else if (opt_.retention != policy::Retention::kSliding) {
      continue;
    }
    // Retention: a sliding-window layer's pages wholly below what the next query can see go back to
    // the free list. No transfer uses them: this pass's loads completed, its stores hold new rows, and
    // the next pass's prefetches start at the same first row.
    for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
      const int64_t keep = first_row(l, end) / geo_.block_tokens;
      const int64_t first = pages_.first_block(seq, l);
      if (keep > first) {
        release_pages(seq, l, first, keep);
        pages_.set_first_block(seq, l, keep);
      }
    }
  }
  if (locret()) locret_end_pass();
}

void TieredKv::abort_pass() {
  if (!pass_.open()) return;
  pass_.abort();
  // Rows of the aborted pass may have reached the home tier; they lie past the sequences' lengths and
  // are rewritten by their next passes. Loads prefetched for it are void; pages of blocks it opened go
  // back.
  engine_->drain();
  inflight_.clear();
  ++epoch_;
  for (const SeqPass& sp : pass_.seqs()) {
    if (!pools_.empty() && sp.pos0 + sp.n > lay_.ig_pool_slots) {
      pool_broken_[sp.seq] = 1;  // its pools may have replaced rows: no way back
    } else if (!pools_.empty()) {
      pool_reset(sp.seq, length_[sp.seq]);
    }
    const int64_t keep = (length_[sp.seq] + geo_.block_tokens - 1) / geo_.block_tokens;
    for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
      release_pages(sp.seq, l, std::max(keep, pages_.first_block(sp.seq, l)), pages_.max_blocks());
      if (kvpr()) x_end(sp.seq, l) = std::min(x_end(sp.seq, l), length_[sp.seq]);
    }
  }
  pass_pos0_ = -1;
}

void TieredKv::truncate(SeqId seq, int64_t n_tokens) {
  if (locret()) n_tokens = locret_truncate(seq, n_tokens);  // the rows held at compact positions
  pass_.check_truncate(seq, n_tokens, length_[seq]);
  const int64_t bt = geo_.block_tokens;
  if (opt_.retention == policy::Retention::kStreaming && n_tokens > 0) {
    // A query at n attends the sinks and its window, or everything while its window reaches the sinks.
    const policy::BlockRange r =
        policy::streaming_free_blocks(n_tokens, opt_.knobs.sinks, policy::streaming_window(opt_.knobs), bt);
    for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
      for (int64_t b = r.first < r.last ? r.last : 0; streams(l) && b < (n_tokens + bt - 1) / bt; ++b) {
        if (pages_.at(seq, l, 0, b).slot != BlockTable::kNoSlot) continue;
        fail(ErrorKind::kInvalidArgument,
             "cannot truncate sequence {} to {} tokens: streaming retention already dropped positions "
             "{}..{} of layer {}, which position {} attends; prefill again",
             seq, n_tokens, b * bt, (b + 1) * bt - 1, l, n_tokens);
      }
    }
  }
  for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
    const int64_t freed = pages_.first_block(seq, l) * bt;
    if (n_tokens > 0 && first_row(l, n_tokens) < freed) {
      fail(ErrorKind::kInvalidArgument,
           "cannot truncate sequence {} to {} tokens: sliding retention already freed positions below {} of "
           "layer {}, which position {} attends; prefill again, or use a policy without +sliding",
           seq, n_tokens, freed, l, n_tokens);
    }
  }
  if (kivi_.bits != 0 && n_tokens > 0 && n_tokens < qend_[seq]) {
    fail(
        ErrorKind::kInvalidArgument,
        "cannot truncate sequence {} to {} tokens: KIVI already quantised positions below {} (their f16 rows "
        "are gone); truncate to at least {}, prefill again, or raise --kivi-residual",
        seq, n_tokens, qend_[seq], qend_[seq]);
  }
  if (n_tokens == 0) qend_[seq] = 0;
  for (uint32_t l = 0; quest() && l < geo_.n_layer(); ++l) quest_.truncate(seq, l, n_tokens);
  if (infinigen() && n_tokens == 0) {  // the next prompt chooses its own columns
    cols_chosen_[seq] = 0;
    pk_->reset(seq);
  }
  if (!pools_.empty()) pool_reset(seq, n_tokens);  // refuses to bring back evicted rows
  // Waits for every transfer in flight: their pins drop before rows are forgotten (a store of rows
  // being truncated lands first; prefetched loads of the old length are void after the epoch bump).
  engine_->drain();
  KVTIER_ASSERT(engine_->home_pins().pinned_blocks() == 0 && staging_->pinned_blocks() == 0,
                "KV blocks pinned after the transfers drained");
  inflight_.clear();
  ++epoch_;
  const int64_t keep = (n_tokens + bt - 1) / bt;
  for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
    release_pages(seq, l, std::max(keep, pages_.first_block(seq, l)), pages_.max_blocks());
    if (n_tokens == 0) pages_.set_first_block(seq, l, 0);
  }
  length_[seq] = n_tokens;
  for (uint32_t l = 0; kvpr() && l < geo_.n_layer(); ++l) x_end(seq, l) = std::min(x_end(seq, l), n_tokens);
  pass_pos0_ = -1;
}

void TieredKv::add_copy(uint64_t home_offset, uint8_t* buf, uint64_t bytes, size_t& n) {
  if (bytes == 0) return;
  KVTIER_ASSERT(n < copies_.size(), "{} extents in one job", n + 1);
  copies_[n++] = {home_offset, buf, bytes};
}

size_t TieredKv::pinned_blocks() const {
  return engine_->home_pins().pinned_blocks() + staging_->pinned_blocks();
}

TieredStats TieredKv::stats() const {
  TieredStats s;
  s.transfer = engine_->stats();
  s.group = layout_.group;
  s.passes = passes_;
  s.sync_loads = sync_loads_;
  s.recomputed_rows = recomputed_rows_;
  s.last_split = last_split_;
  s.pass_splits = pass_splits_;
  s.payload_x_bytes = payload_x_bytes_;
  s.payload_kv_bytes = payload_kv_bytes_;
  s.act_ratio = act_ratio_;
  s.mb_passes = mb_passes_;
  s.mb_formed = mb_formed_;
  s.mb_last = mb_last_;
  s.mb_last_seqs = mb_last_seqs_;
  s.mb_reordered = mb_reordered_;
  s.mb_balanced = mb_balanced_;
  s.home = home_->describe();
  s.infinigen = ig_;
  if (infinigen()) pool_stats(s.infinigen);
  s.quest = qs_;
  return s;
}

}  // namespace kvtier::kv
