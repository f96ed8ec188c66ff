// Selection infinigen on the offloaded placements (spec infinigen.md §6–7; docs/infinigen.md):
//   prefill passes      attend densely; each layer >= 2 without a window of its own shows its queries
//                       and keys to the partial key cache (column scores);
//   first decode pass   of a sequence: its columns are chosen and the partial keys of its prompt built
//                       from the home tier's keys (begin_batch);
//   decode, write(l-1)  the look-ahead: layer l's queries from layer l-1's normed input (the model's
//                       project_q), their partial rows, policy::speculate -> the rows of layer l per
//                       KV head; attend(l - 1) then submits layer l's load of those rows only, which
//                       overlaps layer l-1's attention and FFN (the prefetch of the placement);
//   decode, attend(l)   the chosen rows and the current token, copied into compact planes, are
//                       attended at positions counting back from the current token (all visible).
// When every row is chosen (alpha = +inf, budget 1: the degenerate case A5) the unit's buffer is
// attended as it is, with the same spans as `layer`: bit-identical.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/attention_mass.h"
#include "backend/cpu/spec_scores.h"
#include "core/align.h"
#include "core/error.h"
#include "core/half.h"
#include "kv/page_extents.h"
#include "kv/speculation_observer.h"
#include "kv/tiered_kv.h"

namespace kvtier::kv {
namespace {

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

void TieredKv::infinigen_init(uint32_t n_head, MemoryLedger& ledger) {
  if (!opt_.skew) {
    fail(ErrorKind::kInvalidArgument,
         "selection infinigen needs the model's skew file (make one with `kvtier skew -m MODEL -o FILE`)");
  }
  const skew::SkewSet& sk = *opt_.skew;
  const uint32_t L = geo_.n_layer();
  check_skew_geometry(sk, geo_);
  KVTIER_ASSERT(lay_.ig_cols == int64_t{sk.partial_columns}, "layout for {} columns, skew file {}",
                lay_.ig_cols, sk.partial_columns);
  ig_n_head_ = n_head;
  const uint32_t n_seqs = pages_.n_seqs();
  PartialKeysShape ps;
  ps.n_head = n_head;
  ps.slots = ig_pk_slots(lay_, capacity_);  // a pooled layer's rows are its slots
  ps.max_seqs = n_seqs;
  pk_ = std::make_unique<PartialKeys>(sk, ps, ledger);
  // The scratch tiered_layout() sized (ig_scratch_bytes): reserved as one, allocated below.
  ig_reservation_ = Reservation(ledger, Tier::kDevice, Category::kScratch, lay_.ig_scratch_bytes);
  compact_pitch_ = round_up(static_cast<uint64_t>(lay_.ig_rows) * row_max_, 64);
  compact_.resize(2ull * lay_.h_max * compact_pitch_);
  const size_t heads = size_t{n_seqs} * n_head;
  la_q_.resize(heads * geo_.head_dim_k);
  la_qp_.resize(heads * static_cast<size_t>(lay_.ig_cols));
  la_pos_.resize(n_seqs);
  la_cap_.resize(n_seqs);
  la_pk_.resize(size_t{n_seqs} * lay_.h_max);
  for (Speculation& s : spec_) {
    s.n_past.reserve(n_seqs);
    s.r.idx.reserve(size_t{n_seqs} * lay_.h_max * static_cast<size_t>(lay_.ig_rows));
    s.r.scores.reserve(static_cast<size_t>(capacity_) * n_seqs * lay_.h_max);
    s.r.order.reserve(static_cast<size_t>(capacity_) + 1);
    s.r.values.reserve(static_cast<size_t>(capacity_));
  }
  const uint64_t page = lay_.page_bytes[0];
  void* p = std::aligned_alloc(kPageAlign, round_up(lay_.h_max * page, kPageAlign));
  if (p == nullptr)
    fail(ErrorKind::kBudget, "cannot allocate {} bytes for a page of keys", lay_.h_max * page);
  key_page_.reset(static_cast<uint8_t*>(p));
  key_f32_.resize(static_cast<size_t>(geo_.block_tokens) * lay_.h_max * geo_.head_dim_k);
  cols_chosen_.assign(n_seqs, 0);
  layer_scale_.assign(L, 0.0f);
  ig_.layer_rows_total.assign(L, 0);
  ig_.layer_rows_fetched.assign(L, 0);
  ig_.layer_n_sel_sum.assign(L, 0);
  ig_.layer_steps_of.assign(L, 0);
  ig_.layer_pool_evictions.assign(L, 0);
  if (lay_.ig_pool_slots >
      0) {  // retention pool with a limit: one PoolSlots per (seq, pooled layer, KV head)
    pool_head0_.assign(L, 0);
    for (uint32_t l = 0; l < L; ++l) {
      pool_head0_[l] = pool_heads_;
      if (pooled(l)) pool_heads_ += geo_.n_head_kv[l];
    }
    pools_.reserve(size_t{n_seqs} * pool_heads_);
    for (size_t i = 0; i < size_t{n_seqs} * pool_heads_; ++i)
      pools_.emplace_back(lay_.ig_pool_slots, opt_.knobs.pool_eviction, opt_.knobs.pool_prefill);
    pool_slot_.assign(2 * static_cast<size_t>(opt_.max_new_rows) * lay_.h_max, 0);
    if (pools_.front().uses_mass()) {  // a prefill's victims by attention weight (§15.13)
      pool_lse_.resize(static_cast<size_t>(opt_.max_new_rows) * n_head);
      pool_mass_.resize(lay_.h_max * static_cast<size_t>(lay_.ig_pool_slots + opt_.max_new_rows));
    }
    pool_ins_pass_.assign(L, 0);
    pool_dirty_.resize(2 *
                       static_cast<size_t>((lay_.ig_pool_slots + geo_.block_tokens - 1) / geo_.block_tokens));
    pool_broken_.assign(n_seqs, 0);
  }
}

void TieredKv::pool_check(std::span<const SeqPass> seqs) const {
  // A pass larger than the free slots evicts (prefill too, see pool_insert), so only a sequence whose
  // failed pass may have replaced rows is refused.
  for (const SeqPass& sp : seqs) {
    if (pool_broken_[sp.seq]) {
      fail(ErrorKind::kInvalidArgument,
           "sequence {}: a failed pass had already replaced rows of its KV pool; truncate it to 0 and "
           "prefill again",
           sp.seq);
    }
  }
}

// Prefill (spec §15.13: a prompt larger than the pool). A prefill pass evicts between passes: every
// query of a pass attends the slots live before it and the pass's own rows (causally), and the pass's
// rows then take their slots in position order, each one a victim from the older half. A prompt is thus
// prefilled in its usual chunks (--chunk), and with FIFO a query at position p of a chunk starting at
// p0 attends exactly positions max(0, p0 - C) .. p, as locret's chunked prefill evicts between chunks.
// At prefill no row has been fetched yet (Counter's counters are 0, LRU's last uses say only when a row
// came). --kv-pool-prefill order (the default): Counter and LRU take the lowest slot of the older half
// (the oldest rows while slots follow positions); weight (§15.13's [D]): the slot whose row has the
// smallest cumulative prefill attention weight so far (pool_add_mass, from the earlier passes' queries).
void TieredKv::pool_insert(uint32_t layer) {
  pool_ins_pass_[layer] = passes_;
  const int64_t hk = geo_.n_head_kv[layer];
  for (const SeqPass& sp : pass_.seqs()) {
    for (int64_t t = 0; t < sp.n; ++t) {
      const int64_t pos = sp.pos0 + t;
      for (int64_t g = 0; g < hk; ++g) {
        const policy::PoolSlots::Insert ins =
            pool(sp.seq, layer, static_cast<uint32_t>(g)).insert(pos, passes_, sp.n > 1);
        if (ins.evicted >= 0) {
          ++ig_.pool_evictions;
          if (sp.n > 1) ++ig_.pool_prefill_evictions;
          ++ig_.layer_pool_evictions[layer];
          if (ins.evicted >= pos / 2) ++ig_.pool_young_victims;
          ig_.pool_max_evicted_pos = std::max(ig_.pool_max_evicted_pos, ins.evicted);
        } else {
          KVTIER_ASSERT(ins.slot == pos, "pool slot {} for position {} before the pool is full", ins.slot,
                        pos);
        }
        pool_slot(layer, sp.row0 + t, static_cast<uint32_t>(g)) = ins.slot;
      }
    }
  }
}

void TieredKv::pool_add_mass(const cpu::AttnParams& ap, const cpu::AttnQueries& aq, const cpu::KvSpan& span,
                             const policy::Unit& u) {
  // Staged row j: slot j for j < live (the slots as they were before the pass), then the pass's rows.
  const int64_t live = pool_row(u.layer, pass_pos0_);
  const int64_t stride = lay_.ig_pool_slots + opt_.max_new_rows;
  KVTIER_ASSERT(span.pos0 == 0 && span.n_tokens == live + pass_n_, "a pooled visit of {} rows for {} + {}",
                span.n_tokens, live, pass_n_);
  std::fill_n(pool_mass_.begin(), u.n_heads * stride, 0.0f);
  cpu::accumulate_key_mass(threads_, isa_, ap, aq, span, pool_lse_.data(), aq.n_heads, pool_mass_.data(),
                           stride);
  for (uint32_t h = 0; h < u.n_heads; ++h) {
    policy::PoolSlots& p = pool(pass_seq_, u.layer, u.head0 + h);
    const float* m = pool_mass_.data() + h * stride;
    // Rows kept through the pass (a slot a pass row took now holds that row: it gets its own mass).
    for (int64_t j = 0; j < live; ++j)
      if (p.position(static_cast<int32_t>(j)) < pass_pos0_) p.add_mass(static_cast<int32_t>(j), m[j]);
    for (int64_t t = 0; t < pass_n_; ++t) {
      const int32_t slot = pool_slot(u.layer, pass_row0_ + t, u.head0 + h);
      if (p.position(slot) == pass_pos0_ + t)
        p.add_mass(slot, m[live + t]);  // (a slot taken twice: the later)
    }
  }
}

void TieredKv::pool_reset(SeqId seq, int64_t n) {
  const int64_t C = lay_.ig_pool_slots;
  if (n > 0 && n < length_[seq] && length_[seq] > C) {
    fail(ErrorKind::kInvalidArgument,
         "cannot truncate sequence {} to {} tokens: its KV pool already replaced rows (it holds {} slots of "
         "{} positions); truncate to 0 and prefill again",
         seq, n, C, length_[seq]);
  }
  if (n > C) return;  // nothing to roll back
  for (size_t i = 0; i < pool_heads_; ++i) {
    policy::PoolSlots& p = pools_[seq * pool_heads_ + i];
    p = policy::PoolSlots(C, opt_.knobs.pool_eviction, opt_.knobs.pool_prefill);
    for (int64_t t = 0; t < n; ++t) p.insert(t, 0);  // slot = position while the pool is not full
  }
  pool_broken_[seq] = 0;
}

void TieredKv::pool_patch(uint8_t* base, uint64_t pitch, const policy::Unit& u, int64_t row0, int64_t n) {
  for (uint32_t h = 0; h < u.n_heads; ++h) {
    for (int64_t t = 0; t < n; ++t) {
      const int32_t slot = pool_slot(u.layer, pass_row0_ + t, u.head0 + h);
      if (slot == row0 + t) continue;  // a free slot: the row is staged there already
      KVTIER_ASSERT(slot < row0 + t, "pool slot {} for the row staged at {}", slot, row0 + t);
      for (int kv = 0; kv < 2; ++kv) {
        const uint64_t rb = (kv == 0 ? geo_.head_dim_k : geo_.head_dim_v) * esz_;
        uint8_t* plane = base + (2ull * h + kv) * pitch;
        std::memcpy(plane + static_cast<uint64_t>(slot) * rb, plane + static_cast<uint64_t>(row0 + t) * rb,
                    rb);
      }
    }
  }
}

void TieredKv::pool_store(uint8_t* base, const policy::Unit& u, int64_t n, size_t& n_blocks) {
  const int64_t bt = geo_.block_tokens;
  const size_t pages = pool_dirty_.size() / 2;
  for (uint32_t h = 0; h < u.n_heads; ++h) {
    std::fill(pool_dirty_.begin(), pool_dirty_.begin() + static_cast<ptrdiff_t>(pages), lay_.ig_pool_slots);
    std::fill(pool_dirty_.begin() + static_cast<ptrdiff_t>(pages), pool_dirty_.end(), -1);
    for (int64_t t = 0; t < n; ++t) {
      const int32_t slot = pool_slot(u.layer, pass_row0_ + t, u.head0 + h);
      const auto p = static_cast<size_t>(slot / bt);
      KVTIER_ASSERT(p < pages, "pool slot {} past the pool's {} pages", slot, pages);
      pool_dirty_[p] = std::min<int64_t>(pool_dirty_[p], slot);
      pool_dirty_[pages + p] = std::max<int64_t>(pool_dirty_[pages + p], slot);
    }
    for (size_t p = 0; p < pages; ++p) {
      if (pool_dirty_[pages + p] < 0) continue;
      for (int kv = 0; kv < 2; ++kv) {
        add_rows(pass_seq_, u.layer, u.head0 + h, kv, base + (2ull * h + kv) * layout_.pitch, pool_dirty_[p],
                 pool_dirty_[pages + p] + 1, n_blocks);
      }
    }
  }
}

void TieredKv::pool_stats(InfinigenStats& s) const {
  s.pool_slots = lay_.ig_pool_slots;
  s.layer_pool_min_live.assign(geo_.n_layer(), -1);
  for (uint32_t seq = 0; seq < pages_.n_seqs() && !pools_.empty(); ++seq) {
    for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
      if (!pooled(l)) continue;
      for (uint32_t g = 0; g < geo_.n_head_kv[l]; ++g) {
        const policy::PoolSlots& p = pools_[seq * pool_heads_ + pool_head0_[l] + g];
        s.pool_live_max = std::max(s.pool_live_max, p.live());
        s.pool_live_rows += static_cast<uint64_t>(p.live());
        for (int32_t i = 0; i < p.live(); ++i) {
          int64_t& m = s.layer_pool_min_live[l];
          m = m < 0 ? p.position(i) : std::min(m, p.position(i));
        }
      }
    }
  }
}

void TieredKv::infinigen_begin() {
  spec_[0].pass = spec_[1].pass = 0;
  for (const SeqPass& sp : pass_.seqs()) {
    // A pass of one token after a prompt: the prompt has ended (§15.2: columns per sequence at the end of
    // its prefill; a prompt shorter than the partial key cache's minimum uses the offline columns).
    if (sp.n == 1 && !cols_chosen_[sp.seq]) build_partial_keys(sp.seq, sp.pos0);
  }
}

void TieredKv::build_partial_keys(SeqId seq, int64_t rows) {
  const double t0 = seconds_now();
  pk_->choose_columns(seq);
  cols_chosen_[seq] = 1;
  if (rows > 0) {
    // The prompt's stores have landed once every job in flight has; nothing else touches the home
    // tier's pages then (the copy thread waits for work), so the compute thread reads them directly.
    engine_->drain();
    const int64_t bt = geo_.block_tokens;
    const int64_t dk = geo_.head_dim_k;
    const uint64_t page = lay_.page_bytes[0];
    for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
      if (!speculates(l)) continue;
      const int64_t hk = geo_.n_head_kv[l];
      const int64_t live = pool_row(l, rows);  // a pooled layer: its live slots (the prompt may have evicted)
      for (int64_t b = 0; b * bt < live; ++b) {
        const BlockEntry& e = pages_.at(seq, l, 0, b);
        KVTIER_ASSERT(e.slot != BlockTable::kNoSlot, "seq {} layer {} block {} has no home page", seq, l, b);
        const int64_t n = std::min(live, (b + 1) * bt) - b * bt;
        for (int64_t g = 0; g < hk; ++g) {
          uint8_t* dst = key_page_.get() + static_cast<uint64_t>(g) * page;
          home_->read(page_offset(l, static_cast<uint32_t>(g), 0, e.slot), dst, page);
          ig_.pk_build_bytes += page;
          for (int64_t t = 0; t < n; ++t) {
            float* k = key_f32_.data() + (t * hk + g) * dk;
            const uint8_t* row = dst + static_cast<uint64_t>(t * dk) * esz_;
            if (geo_.dtype == cpu::KvDtype::kF32) {
              std::memcpy(k, row, static_cast<size_t>(dk) * sizeof(float));
            } else {
              const auto* h = reinterpret_cast<const uint16_t*>(row);
              for (int64_t i = 0; i < dk; ++i) k[i] = f16_to_f32(h[i]);
            }
          }
        }
        pk_->write(seq, l, b * bt, key_f32_.data(), n);
      }
    }
  }
  ig_.pk_build_seconds += seconds_now() - t0;
}

void TieredKv::infinigen_write(uint32_t layer, const LayerRows& rows) {
  new_k_f32_ = rows.k;
  const int64_t dk = geo_.head_dim_k;
  // The slots the new rows take, unless the look-ahead chose them (after this layer's speculation).
  if (pooled(layer) && pool_ins_pass_[layer] != passes_) pool_insert(layer);
  if (speculates(layer)) {  // the new keys' partial rows, for sequences past their prompt
    const int64_t hk = geo_.n_head_kv[layer];
    const auto& seqs = pass_.seqs();
    for (size_t b = 0; b < seqs.size(); ++b) {
      const SeqPass& sp = seqs[b];
      if (!cols_chosen_[sp.seq]) continue;
      // An evicting pass: each head's row at its slot (a victim's, past the free ones).
      if (pool_evicts(layer, sp.pos0, sp.n)) {
        for (int64_t t = 0; t < sp.n; ++t) {
          for (int64_t g = 0; g < hk; ++g)
            pk_->write_row(sp.seq, layer, static_cast<uint32_t>(g),
                           pool_slot(layer, sp.row0 + t, static_cast<uint32_t>(g)),
                           rows.k + ((sp.row0 + t) * hk + g) * dk);
        }
      } else {
        pk_->write(sp.seq, layer, sp.pos0, rows.k + sp.row0 * hk * dk, sp.n);
      }
    }
  }
  // The look-ahead for the next layer, on decode passes of sequences with partial keys.
  const uint32_t t = layer + 1;
  if (t >= geo_.n_layer() || !speculates(t) || layer_scale_[t] == 0.0f) return;
  for (const SeqPass& sp : pass_.seqs()) {
    if (sp.n != 1 || !cols_chosen_[sp.seq] || sp.pos0 < 1) return;
  }
  KVTIER_ASSERT(compute_ != nullptr && rows.x != nullptr,
                "infinigen needs the model's hook and layer inputs");
  const double t0 = seconds_now();
  const auto& seqs = pass_.seqs();
  const auto B = static_cast<int64_t>(seqs.size());
  const int64_t H = ig_n_head_;
  const int64_t hk = geo_.n_head_kv[t];
  const int64_t G = H / hk;
  const int64_t kc = lay_.ig_cols;
  Speculation& s = spec_[t % 2];
  s.n_past.clear();
  for (int64_t b = 0; b < B; ++b) {
    const SeqPass& sp = seqs[static_cast<size_t>(b)];
    la_pos_[static_cast<size_t>(b)] = sp.pos0;
    const int64_t T = pool_row(t, sp.pos0);  // the rows layer t holds (a pooled layer: its live slots)
    la_cap_[static_cast<size_t>(b)] = policy::speculation_cap(opt_.knobs.infinigen_budget, T);
    s.n_past.push_back(T);
  }
  // Layer t's queries of this pass's tokens from layer t-1's normed input (§6.2; the pass's own q code).
  compute_->project_q(t, rows.x, std::span<const int64_t>(la_pos_.data(), static_cast<size_t>(B)),
                      la_q_.data());
  for (int64_t b = 0; b < B; ++b) {
    const SeqId seq = seqs[static_cast<size_t>(b)].seq;
    for (int64_t h = 0; h < H; ++h) {
      policy::partial_rows(la_q_.data() + (b * H + h) * dk, 1, dk,
                           pk_->projection(seq, t, static_cast<uint32_t>(h / G)), kc,
                           la_qp_.data() + (b * H + h) * kc);
    }
    for (int64_t g = 0; g < hk; ++g)
      la_pk_[static_cast<size_t>(b * hk + g)] = pk_->rows(seq, t, static_cast<uint32_t>(g));
  }
  policy::SpecInput in;
  in.n_seq = B;
  in.n_head = H;
  in.n_head_kv = hk;
  in.k_cols = kc;
  in.scale = layer_scale_[t];
  in.qp = la_qp_.data();
  in.pk = std::span<const uint16_t* const>(la_pk_.data(), static_cast<size_t>(B * hk));
  in.n_tokens = s.n_past;
  in.cap = std::span<const int64_t>(la_cap_.data(), static_cast<size_t>(B));
  in.group_scores = cpu::spec_scores_kernel(isa_);
  in.group = opt_.knobs.infinigen_group;
  in.head_scores = cpu::spec_head_scores_kernel(isa_);
  in.pool = &threads_;
  policy::speculate(in, static_cast<float>(opt_.knobs.infinigen_alpha), s.r);
  s.pass = passes_;
  s.layer = t;
  if (SpeculationObserver* obs = opt_.speculation_observer) {
    for (int64_t b = 0; b < B; ++b)
      obs->on_speculation(seqs[static_cast<size_t>(b)].seq, t, la_pos_[static_cast<size_t>(b)],
                          s.n_past[static_cast<size_t>(b)], s.r, b, hk);
  }
  for (int64_t b = 0; pooled(t) && b < B; ++b) {  // the pools count this step's fetches (§8)
    for (int64_t g = 0; g < hk; ++g)
      pool(seqs[static_cast<size_t>(b)].seq, t, static_cast<uint32_t>(g)).touch(s.r.rows(b, g, hk), passes_);
  }
  // ... and then take this step's token (what write(t) would do next, nothing touches the pools between):
  // the victims are known before layer t's load is submitted, which on a disk home brings their I/O pages.
  if (pooled(t)) pool_insert(t);
  // Figures.
  ig_.n_sel_min = ig_.layer_steps == 0 ? s.r.n_sel : std::min(ig_.n_sel_min, s.r.n_sel);
  ig_.n_sel_max = std::max(ig_.n_sel_max, s.r.n_sel);
  ig_.n_sel_sum += static_cast<uint64_t>(s.r.n_sel);
  ++ig_.layer_steps;
  ++ig_.layer_steps_of[t];
  ig_.layer_n_sel_sum[t] += static_cast<uint64_t>(s.r.n_sel);
  for (int64_t b = 0; b < B; ++b) {
    const auto total = static_cast<uint64_t>(s.n_past[static_cast<size_t>(b)] * hk);
    const auto fetched = static_cast<uint64_t>(s.r.chosen[static_cast<size_t>(b)] * hk);
    ig_.rows_total += total;
    ig_.rows_fetched += fetched;
    ig_.layer_rows_total[t] += total;
    ig_.layer_rows_fetched[t] += fetched;
  }
  ig_.spec_seconds += seconds_now() - t0;
}

void TieredKv::infinigen_observe(uint32_t layer, const float* q, const LayerAttention& la) {
  layer_scale_[layer] = la.scale;
  if (!speculates(layer)) return;
  const int64_t dk = geo_.head_dim_k;
  const int64_t hk = geo_.n_head_kv[layer];
  for (const SeqPass& sp : pass_.seqs()) {
    if (cols_chosen_[sp.seq]) continue;
    pk_->observe(sp.seq, layer, q + sp.row0 * ig_n_head_ * dk, new_k_f32_ + sp.row0 * hk * dk, sp.n);
  }
}

const TieredKv::Speculation* TieredKv::speculation(uint32_t layer) const {
  if (!selects()) return nullptr;
  const Speculation& s = spec_[layer % 2];
  return s.pass != 0 && s.pass == passes_ && s.layer == layer ? &s : nullptr;
}

void TieredKv::add_chosen_rows(const Speculation& s, uint32_t b, SeqId seq, uint32_t layer, uint32_t head,
                               uint8_t* base_k, uint8_t* base_v, int64_t rows, int32_t victim, size_t& n) {
  const std::span<const int32_t> idx = s.r.rows(b, head, geo_.n_head_kv[layer]);
  for (int kv = 0; kv < 2; ++kv) {
    uint8_t* plane = kv == 0 ? base_k : base_v;
    const size_t plane_first = n;
    for (const int32_t r : idx) {
      const size_t before = n;
      add_rows(seq, layer, head, kv, plane, r, r + 1, n);
      // Rows in one I/O page (direct disk I/O), or next to each other: one extent.
      if (n == before + 1 && before > 0) {
        BlockCopy& a = copies_[before - 1];
        const BlockCopy& c = copies_[before];
        const uint64_t a_end = a.home_offset + a.bytes;
        if (c.home_offset >= a.home_offset && c.home_offset <= a_end &&
            c.buf - a.buf == static_cast<ptrdiff_t>(c.home_offset - a.home_offset)) {
          a.bytes = std::max(a_end, c.home_offset + c.bytes) - a.home_offset;
          n = before;
        }
      }
    }
    // The rows around the new ones that the visit's store writes back (whole I/O pages on disk).
    add_rows(seq, layer, head, kv, plane, std::min(store_first_row(rows), rows), rows, n);
    if (victim >= 0) {  // the victim's I/O page, unless a chosen row's extent brought it
      size_t m = n;
      add_rows(seq, layer, head, kv, plane, victim, victim + 1, m);
      const BlockCopy& c = copies_[n];
      bool covered = false;
      for (size_t i = plane_first; i < n && !covered; ++i)
        covered = copies_[i].home_offset <= c.home_offset &&
                  c.home_offset + c.bytes <= copies_[i].home_offset + copies_[i].bytes;
      if (!covered) n = m;
    }
  }
}

int64_t TieredKv::compact_unit(const uint8_t* base, uint64_t pitch, const policy::Unit& u, int64_t pos0,
                               int64_t n) {
  const Speculation* s = speculation(u.layer);
  if (s == nullptr) return -1;
  size_t b = 0;
  while (pass_.seqs()[b].seq != pass_seq_) ++b;
  const int64_t chosen = s->r.chosen[b];
  if (chosen >= s->n_past[b]) return -1;  // every row: the buffer as it is
  KVTIER_ASSERT(chosen + n <= lay_.ig_rows, "{} chosen rows and {} new ones in compact planes of {} rows",
                chosen, n, lay_.ig_rows);
  const uint32_t hk = geo_.n_head_kv[u.layer];
  for (uint32_t h = 0; h < u.n_heads; ++h) {
    const std::span<const int32_t> idx = s->r.rows(static_cast<int64_t>(b), u.head0 + h, hk);
    KVTIER_ASSERT(static_cast<int64_t>(idx.size()) == chosen);
    for (int kv = 0; kv < 2; ++kv) {
      const uint64_t rb = (kv == 0 ? geo_.head_dim_k : geo_.head_dim_v) * esz_;
      const uint8_t* src = base + (2ull * h + kv) * pitch;
      uint8_t* dst = compact_.data() + (2ull * h + kv) * compact_pitch_;
      for (size_t i = 0; i < idx.size(); ++i)
        std::memcpy(dst + i * rb, src + static_cast<uint64_t>(idx[i]) * rb, rb);
      std::memcpy(dst + static_cast<uint64_t>(chosen) * rb, src + static_cast<uint64_t>(pos0) * rb,
                  static_cast<size_t>(n) * rb);
    }
  }
  return chosen;
}

}  // namespace kvtier::kv
