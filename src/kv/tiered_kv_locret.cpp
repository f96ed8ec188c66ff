// Locret's retention on the offloaded placements (layer, headinfer; host or disk home): the decisions
// of LocretKv (locret_kv.h) over rows that live in the home tier and move through the executor.
#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/half.h"
#include "kv/kv_row.h"
#include "kv/locret_kv.h"
#include "kv/tiered_kv.h"
#include "kv/token_spans.h"
#include "policy/kv_policy.h"

namespace kvtier::kv {

void TieredKv::locret_init(MemoryLedger& ledger) {
  lr_scorer_ = opt_.scorer;
  if (!lr_scorer_) {
    fail(ErrorKind::kInvalidArgument,
         "locret needs retaining heads to score KV units: give --locret-heads FILE (built by "
         "scripts/train_locret_heads.sh MODEL OUT_DIR)");
  }
  lr_protect_ = policy::locret_stabilizers(opt_.knobs);
  if (lr_protect_ >= opt_.knobs.budget) {
    fail(ErrorKind::kInvalidArgument, "--stabilizers {} must be smaller than --kv-budget {}", lr_protect_,
         opt_.knobs.budget);
  }
  policy::check_locret_sinks(opt_.knobs);
  lr_cap_ = locret_rows(capacity_, opt_);
  lr_reservation_ = Reservation(ledger, Tier::kHost, Category::kKv, locret_side_bytes(geo_, capacity_, opt_));
  const size_t cells = static_cast<size_t>(pages_.n_seqs()) * geo_.n_layer() * lay_.h_max * lr_cap_;
  lr_score_.assign(cells, 0.0f);
  if (locret_pre_rope(opt_)) lr_kpre_.assign(cells * geo_.head_dim_k * esz_, 0);
  lr_len_.assign(pages_.n_seqs(), 0);
  lr_plan_end_.assign(pages_.n_seqs(), 0);
  lr_evicted_at_.assign(pages_.n_seqs(), 0);
  lr_pass_scores_.resize(static_cast<size_t>(opt_.max_new_rows) * lay_.h_max);
  lr_keep_.resize(static_cast<size_t>(lr_cap_));
  lr_order_.resize(static_cast<size_t>(lr_cap_));
  if (locret_spans(opt_)) {
    if (!opt_.token_edges) {
      fail(ErrorKind::kInvalidArgument, "locret --locret-span {} needs the tokenizer's token edges",
           policy::locret_span_name(opt_.knobs.locret_span));
    }
    lr_link_.assign(cells, 0);
    lr_span_best_.resize(static_cast<size_t>(lr_cap_));
    lr_pass_link_.resize(static_cast<size_t>(opt_.max_new_rows));
  }
  lr_last_edges_.assign(pages_.n_seqs(), kEdgeNone);
  lr_pass_edges_.assign(pages_.n_seqs(), kEdgeNone);
  lr_rot_in_.resize(static_cast<size_t>(lr_cap_ * geo_.head_dim_k));
  lr_rot_out_.resize(lr_rot_in_.size());
  lr_rot_pos_.resize(static_cast<size_t>(lr_cap_));
  lr_rot_row_.resize(static_cast<size_t>(lr_cap_));
}

std::vector<int64_t> TieredKv::plan_prefill(SeqId seq, int64_t n, int64_t chunk) {
  if (!locret()) return KvCache::plan_prefill(seq, n, chunk);
  pass_.check_seq(seq, "plan_prefill");
  KVTIER_ASSERT(n >= 0 && chunk > 0, "plan of {} tokens in chunks of {}", n, chunk);
  int64_t n_pref = 0;
  std::vector<int64_t> out =
      locret_prefill_passes(n, chunk, opt_.max_new_rows, opt_.knobs.local_tail, &n_pref);
  lr_plan_end_[seq] = n_pref > 0 ? lr_len_[seq] + n_pref : 0;
  return out;
}

void TieredKv::locret_begin(std::span<const PassInfo> seqs) {
  // A pass outside the prefill plan that would overflow the rows first evicts as a non-final chunk
  // (LocretKv::begin_batch).
  for (const PassInfo& p : seqs) {
    pass_.check_seq(p.seq, "begin_batch");
    if (p.n > opt_.max_new_rows) break;  // refused by begin_batch
    if (length_[p.seq] + p.n > lr_cap_) {
      const int64_t keep = std::min(opt_.knobs.budget, lr_cap_ - p.n);
      locret_evict(p.seq, keep, std::min(lr_protect_, keep));
      lr_evicted_at_[p.seq] = lr_len_[p.seq];
    }
  }
  if (!locret_spans(opt_)) return;
  int64_t row = 0;  // the pass's links, in batch order (the rows' order in write)
  for (const PassInfo& p : seqs) {
    if (p.n > opt_.max_new_rows - row) break;  // refused by begin_batch
    lr_pass_edges_[p.seq] =
        locret_pass_links(opt_, p.tokens, p.n, lr_last_edges_[p.seq], lr_pass_link_.data() + row);
    row += p.n;
  }
}

void TieredKv::locret_write(uint32_t layer, const LayerRows& rows) {
  KVTIER_ASSERT(rows.q_pre != nullptr && rows.k_pre != nullptr,
                "locret: layer {} written without pre-RoPE rows", layer);
  const int64_t hk = geo_.n_head_kv[layer];
  const int64_t dk = geo_.head_dim_k, dv = geo_.head_dim_v;
  const uint64_t rk = dk * esz_;
  for (const SeqPass& sp : pass_.seqs()) {
    KVTIER_ASSERT(sp.pos0 + sp.n <= lr_cap_, "layer {}: {} + {} rows in {}", layer, sp.pos0, sp.n, lr_cap_);
    const float* kpre = rows.k_pre + sp.row0 * hk * dk;
    float* sc = lr_pass_scores_.data();
    lr_scorer_->score(threads_, isa_, layer, lr_len_[sp.seq], rows.q_pre + sp.row0 * lr_n_head_ * dk, kpre,
                      rows.v + sp.row0 * hk * dv, sp.n, sc);
    for (int64_t h = 0; h < hk; ++h) {
      const size_t c = lr_cell(sp.seq, layer, h) + static_cast<size_t>(sp.pos0);
      for (int64_t t = 0; t < sp.n; ++t) {
        lr_score_[c + t] = sc[t * hk + h];
        if (!lr_link_.empty()) lr_link_[c + t] = lr_pass_link_[static_cast<size_t>(sp.row0 + t)];
        if (!lr_kpre_.empty())
          store_kv_row(geo_.dtype, kpre + (t * hk + h) * dk, dk, lr_kpre_.data() + (c + t) * rk);
      }
    }
  }
}

bool TieredKv::locret_evicts_after(const SeqPass& sp) const {
  if (!locret()) return false;
  const int64_t end = lr_len_[sp.seq] + sp.n;
  return end <= lr_plan_end_[sp.seq] && sp.pos0 + sp.n > opt_.knobs.budget;
}

void TieredKv::locret_end_pass() {
  for (const SeqPass& sp : pass_.seqs()) {
    const SeqId seq = sp.seq;
    const int64_t end = lr_len_[seq] + sp.n;
    lr_len_[seq] = end;
    lr_last_edges_[seq] = lr_pass_edges_[seq];
    // A chunk of the planned prefill: evict to b, the last n_s protected unless it is the final one.
    if (end <= lr_plan_end_[seq]) {
      const bool final_chunk = end == lr_plan_end_[seq];
      if (length_[seq] > opt_.knobs.budget) {
        locret_evict(seq, opt_.knobs.budget, final_chunk ? 0 : lr_protect_);
        lr_evicted_at_[seq] = end;
      }
      if (final_chunk) lr_plan_end_[seq] = 0;
    }
  }
}

int64_t TieredKv::locret_compact_unit(uint8_t* base, uint64_t pitch, const policy::Unit& u, SeqId seq,
                                      int64_t n, int64_t keep, int64_t n_protect) {
  const int64_t dk = geo_.head_dim_k;
  const uint64_t rk = dk * esz_, rv = geo_.head_dim_v * esz_;
  const int64_t batch = std::min<int64_t>(compute_ != nullptr ? compute_->max_rows() : lr_cap_, lr_cap_);
  const bool pre_rope = locret_pre_rope(opt_);
  int64_t first_changed = keep;
  for (uint32_t h = 0; h < u.n_heads; ++h) {
    const size_t c = lr_cell(seq, u.layer, u.head0 + h);
    float* sc = lr_score_.data() + c;
    uint8_t* link = lr_link_.empty() ? nullptr : lr_link_.data() + c;
    uint8_t* kpre = pre_rope ? lr_kpre_.data() + c * rk : nullptr;
    uint8_t* kplane = base + 2ull * h * pitch;
    uint8_t* vplane = base + (2ull * h + 1) * pitch;
    const LocretProtected prot = locret_protected(geo_, opt_.knobs, u.layer, keep, n_protect);
    locret_mark_keep({sc, link, n, keep, prot.last, prot.first, opt_.knobs.locret_pool}, lr_span_best_,
                     lr_order_, lr_keep_);
    int64_t n_rot = 0;
    auto flush = [&]() {
      if (n_rot == 0) return;
      KVTIER_ASSERT(compute_ != nullptr, "locret: an eviction moved keys but the model hook is not set");
      compute_->rope_k_rows(u.layer, lr_rot_in_.data(),
                            std::span(lr_rot_pos_.data(), static_cast<size_t>(n_rot)), lr_rot_out_.data());
      for (int64_t i = 0; i < n_rot; ++i) {
        store_kv_row(geo_.dtype, lr_rot_out_.data() + i * dk, dk,
                     kplane + static_cast<uint64_t>(lr_rot_row_[static_cast<size_t>(i)]) * rk);
      }
      n_rot = 0;
    };
    // Kept rows move down in position order: V, the pre-RoPE key and the score move; the key after
    // RoPE is re-rotated to its new row from the pre-RoPE key, or (rerotate) the key of row r, not yet
    // overwritten (rows are written at w <= r only), is turned by w - r (LocretKv's bits either way).
    int64_t w = 0;
    for (int64_t r = 0; r < n; ++r) {
      if (!lr_keep_[static_cast<size_t>(r)]) continue;
      if (w != r) {
        first_changed = std::min(first_changed, w);
        std::memmove(vplane + static_cast<uint64_t>(w) * rv, vplane + static_cast<uint64_t>(r) * rv, rv);
        sc[w] = sc[r];
        if (link != nullptr) link[w] = link[r] != 0 && lr_keep_[static_cast<size_t>(r - 1)] != 0 ? 1 : 0;
        if (pre_rope) {
          std::memmove(kpre + static_cast<uint64_t>(w) * rk, kpre + static_cast<uint64_t>(r) * rk, rk);
          load_kv_row(geo_.dtype, kpre + static_cast<uint64_t>(w) * rk, dk, lr_rot_in_.data() + n_rot * dk);
        } else {
          load_kv_row(geo_.dtype, kplane + static_cast<uint64_t>(r) * rk, dk, lr_rot_in_.data() + n_rot * dk);
        }
        lr_rot_pos_[static_cast<size_t>(n_rot)] = pre_rope ? w : w - r;
        lr_rot_row_[static_cast<size_t>(n_rot)] = w;
        if (++n_rot == batch) flush();
      }
      ++w;
    }
    flush();
    KVTIER_ASSERT(w == keep, "layer {} head {}: kept {} rows of {}", u.layer, u.head0 + h, w, keep);
  }
  return first_changed;
}

void TieredKv::locret_evict(SeqId seq, int64_t keep, int64_t n_protect) {
  const int64_t n = length_[seq];
  if (n <= keep) return;
  KVTIER_ASSERT(!plan_.units.empty() && layout_.rows >= n, "locret eviction of {} rows without a layout", n);
  // Nothing may be in flight: prefetched loads of the old rows are void, stores of this pass land first.
  engine_->drain();
  inflight_.clear();
  ++epoch_;
  const uint32_t slot = buffer_slot(0);
  uint8_t* base = staging_->data(slot);
  for (const policy::Unit& u : plan_.units) {
    if (u.is_static) {
      locret_compact_unit(static_base(seq, u.layer), lay_.static_pitch, u, seq, n, keep, n_protect);
      continue;
    }
    // The unit's rows from the home tier, compacted in a staging buffer; the rows that changed go back.
    size_t nb = 0;
    for (uint32_t h = 0; h < u.n_heads; ++h) {
      for (int kv = 0; kv < 2; ++kv)
        add_rows(seq, u.layer, u.head0 + h, kv, base + (2ull * h + kv) * layout_.pitch, 0, n, nb);
    }
    engine_->wait(engine_->prepare(CopyDir::kLoad, std::span(copies_.data(), nb), {staging_.get(), slot}));
    const int64_t first = locret_compact_unit(base, layout_.pitch, u, seq, n, keep, n_protect);
    nb = 0;
    for (uint32_t h = 0; h < u.n_heads; ++h) {
      for (int kv = 0; kv < 2; ++kv)
        add_rows(seq, u.layer, u.head0 + h, kv, base + (2ull * h + kv) * layout_.pitch, first, keep, nb);
    }
    engine_->wait(engine_->prepare(CopyDir::kStore, std::span(copies_.data(), nb), {staging_.get(), slot}));
  }
  // Pages wholly past the kept rows go back to the free lists.
  const int64_t bt = geo_.block_tokens;
  for (uint32_t l = 0; l < geo_.n_layer(); ++l)
    release_pages(seq, l, (keep + bt - 1) / bt, pages_.max_blocks());
  length_[seq] = keep;
  ++lr_evictions_;
}

int64_t TieredKv::locret_truncate(SeqId seq, int64_t n) {
  pass_.check_truncate(seq, n, lr_len_[seq]);
  lr_plan_end_[seq] = 0;
  lr_last_edges_[seq] = kEdgeNone;  // the next token starts a span (LocretKv::truncate)
  if (n == 0) {
    lr_len_[seq] = lr_evicted_at_[seq] = 0;
    return 0;
  }
  // What stays must be a state locret reaches for the shorter sequence (LocretKv::truncate).
  if (n < lr_evicted_at_[seq]) {
    fail(ErrorKind::kInvalidArgument,
         "cannot truncate sequence {} to {} tokens: locret evicted rows after position {} by scores that "
         "included the positions dropped; prefill again",
         seq, n, lr_evicted_at_[seq]);
  }
  const int64_t drop = lr_len_[seq] - n;  // rows after the last eviction are all held, in order
  KVTIER_ASSERT(drop <= length_[seq], "truncate drops {} of {} rows", drop, length_[seq]);
  lr_len_[seq] = n;
  return length_[seq] - drop;
}

}  // namespace kvtier::kv
