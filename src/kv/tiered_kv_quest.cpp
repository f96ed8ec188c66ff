// Selection quest on the offloaded placements (layer, headinfer; host or disk home):
//   write(l)       the new keys widen their pages' per-channel bounds (QuestIndex, compute-local);
//   attend(l)      on a decode step of a layer without a window of its own, each KV head ranks its pages
//                  by the bound on q.k for the layer's real queries and keeps the best --kv-budget
//                  positions (the newest page always), as on the resident placement; the choice becomes
//                  the layer's Speculation, so the unit's load moves those rows only (add_chosen_rows,
//                  the infinigen path) and attention runs over them gathered in compact planes
//                  (compact_unit).
// The query exists only once the layer attends, so such a load cannot be prefetched: prefetch_ahead stops
// before it and the visit loads synchronously (what the load saves is bytes, not latency). Later units of
// the same layer (headinfer, batches) prefetch their chosen rows. When the budget covers the context no
// layer selects and every load and attention is the placement's own: bit-identical to it.
#include <algorithm>

#include "core/error.h"
#include "kv/tiered_kv.h"

namespace kvtier::kv {

void TieredKv::quest_init(MemoryLedger& ledger) {
  const std::vector<uint32_t> heads(geo_.n_head_kv.begin(), geo_.n_head_kv.end());
  const uint32_t n_seqs = pages_.n_seqs();
  quest_reservation_ = Reservation(ledger, Tier::kDevice, Category::kKv, lay_.quest_bytes);
  quest_ = QuestIndex(n_seqs, heads, capacity_, opt_.knobs.quest_page, geo_.head_dim_k);
  // The scratch tiered_layout() sized (ig_scratch_bytes): compact planes, chosen rows, selection.
  ig_reservation_ = Reservation(ledger, Tier::kDevice, Category::kScratch, lay_.ig_scratch_bytes);
  compact_pitch_ = (static_cast<uint64_t>(lay_.ig_rows) * row_max_ + 63) / 64 * 64;
  compact_.resize(2ull * lay_.h_max * compact_pitch_);
  const auto pages = static_cast<size_t>(quest_.pages(capacity_));
  quest_ranges_.resize(pages);
  quest_order_.resize(pages);
  quest_bound_.resize(pages);
  for (Speculation& s : spec_) {
    s.n_past.reserve(n_seqs);
    s.r.chosen.reserve(n_seqs);
    s.r.offset.reserve(size_t{n_seqs} * lay_.h_max + 1);
    s.r.idx.reserve(size_t{n_seqs} * lay_.h_max * static_cast<size_t>(lay_.ig_rows));
  }
}

bool TieredKv::quest_selects(uint32_t layer, int64_t end) const {
  return quest() && geo_.window_of(layer) == 0 && quest_.pages(end) * quest_.page() > opt_.knobs.budget;
}

bool TieredKv::quest_waits(uint32_t layer, const SeqPass& sp, bool this_pass) const {
  if (!quest()) return false;
  if (!this_pass) return quest_selects(layer, sp.pos0 + sp.n + 1);
  return sp.n == 1 && quest_selects(layer, sp.pos0 + 1) && speculation(layer) == nullptr;
}

void TieredKv::quest_write(uint32_t layer, const LayerRows& rows) {
  const int64_t hk = geo_.n_head_kv[layer];
  for (const SeqPass& sp : pass_.seqs())
    quest_.update(sp.seq, layer, sp.pos0, sp.n, rows.k + sp.row0 * hk * geo_.head_dim_k);
}

void TieredKv::quest_select(uint32_t layer, const float* q, int64_t n_head) {
  Speculation& s = spec_[layer % 2];
  s.pass = 0;
  const auto& seqs = pass_.seqs();
  const auto selects = [&](const SeqPass& sp) { return sp.n == 1 && quest_selects(layer, sp.pos0 + 1); };
  if (std::none_of(seqs.begin(), seqs.end(), selects)) return;
  const int64_t hk = geo_.n_head_kv[layer];
  const int64_t G = n_head / hk;
  const int64_t dk = geo_.head_dim_k;
  s.layer = layer;
  s.pass = passes_;
  s.n_past.clear();
  s.r.chosen.clear();
  s.r.offset.assign(1, 0);
  s.r.idx.clear();
  for (const SeqPass& sp : seqs) {
    s.n_past.push_back(sp.pos0);
    const bool sel = selects(sp);
    for (int64_t g = 0; g < hk; ++g) {
      if (sel) {  // the selected pages' rows before the current token (compact_unit appends that one)
        const auto ranges =
            quest_.select(sp.seq, layer, static_cast<uint32_t>(g), q + (sp.row0 * n_head + g * G) * dk, G,
                          sp.pos0 + 1, opt_.knobs.budget, quest_ranges_, quest_order_, quest_bound_);
        for (const PosRange& r : ranges) {
          for (int64_t p = r.pos0; p < std::min(r.pos0 + r.n, sp.pos0); ++p)
            s.r.idx.push_back(static_cast<int32_t>(p));
        }
      } else {  // a prefill chunk in the batch: every row (the unit is attended as it is)
        for (int64_t p = 0; p < sp.pos0; ++p) s.r.idx.push_back(static_cast<int32_t>(p));
      }
      s.r.offset.push_back(static_cast<int64_t>(s.r.idx.size()));
    }
    const size_t last = s.r.offset.size() - 1;
    const int64_t chosen = s.r.offset[last] - s.r.offset[last - 1];
    s.r.chosen.push_back(chosen);
    if (sel) {
      ++qs_.layer_steps;
      qs_.rows_total += static_cast<uint64_t>(sp.pos0 * hk);
      qs_.rows_fetched += static_cast<uint64_t>(chosen * hk);
    }
  }
}

}  // namespace kvtier::kv
