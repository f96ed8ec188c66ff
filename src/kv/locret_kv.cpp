#include "kv/locret_kv.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "core/half.h"
#include "kv/kv_row.h"
#include "kv/token_spans.h"

namespace kvtier::kv {

int64_t locret_rows(int64_t capacity, const KvOptions& o) {
  return std::min(capacity, o.knobs.budget + o.knobs.local_tail + max_new_rows(capacity, o));
}

BoundedLayout locret_layout(const KvGeometry& geo, int64_t capacity, uint32_t n_head, int threads,
                            const KvOptions& o) {
  geo.validate();
  if (capacity <= 0) fail(ErrorKind::kInvalidArgument, "KV capacity of {} positions", capacity);
  if (o.knobs.budget <= 0)
    fail(ErrorKind::kInvalidArgument, "locret needs --kv-budget N (KV units kept per layer and KV head)");
  const auto rows = static_cast<uint64_t>(locret_rows(capacity, o));
  BoundedLayout r;
  const uint64_t link = locret_spans(o) ? 1 : 0;  // BoundedRows::link
  for (uint32_t l = 0; l < geo.n_layer(); ++l)
    r.kv_bytes += uint64_t{o.max_seqs} * geo.n_head_kv[l] * rows *
                  (bounded_row_bytes(geo, locret_pre_rope(o), 1) + link);
  const uint64_t moved = locret_compact(o) ? rows : 0;  // keys re-rotated at once (none: original)
  r.scratch_bytes = geo.attention_scratch_bytes(n_head, threads) +
                    static_cast<uint64_t>(max_new_rows(capacity, o) * geo.max_head_kv()) * sizeof(float) +
                    rows * (1 + sizeof(int64_t)) + (link != 0 ? rows * sizeof(float) : 0) +
                    static_cast<uint64_t>(link != 0 ? max_new_rows(capacity, o) : 0) +
                    moved * (2 * static_cast<uint64_t>(geo.head_dim_k) * sizeof(float) + 2 * sizeof(int64_t));
  return r;
}

std::vector<int64_t> locret_prefill_passes(int64_t n, int64_t chunk, int64_t max_new, int64_t local_tail,
                                           int64_t* evicting_tokens) {
  const int64_t b = std::min(chunk, max_new);
  // The first n - n_loc tokens in chunks of B (evicting), then the n_loc tail (appended), spec §3.4.
  const int64_t n_pref = std::max<int64_t>(0, n - local_tail);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n_pref; i += b) out.push_back(std::min(b, n_pref - i));
  for (int64_t i = n_pref; i < n; i += b) out.push_back(std::min(b, n - i));
  *evicting_tokens = n_pref;
  return out;
}

uint8_t locret_pass_links(const KvOptions& o, std::span<const int32_t> tokens, int64_t n, uint8_t prev_edges,
                          uint8_t* link) {
  if (static_cast<int64_t>(tokens.size()) != n) {
    fail(ErrorKind::kInternal, "locret --locret-span {} needs the pass's token ids ({} given for {} tokens)",
         policy::locret_span_name(o.knobs.locret_span), tokens.size(), n);
  }
  KVTIER_ASSERT(o.token_edges != nullptr, "locret --locret-span {} without the tokenizer's token edges",
                policy::locret_span_name(o.knobs.locret_span));
  const std::vector<uint8_t>& edges = *o.token_edges;
  uint8_t prev = prev_edges;
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = tokens[static_cast<size_t>(t)];
    if (id < 0 || static_cast<size_t>(id) >= edges.size())
      fail(ErrorKind::kInvalidArgument, "token id {} is outside the vocabulary of {}", id, edges.size());
    const uint8_t cur = edges[static_cast<size_t>(id)];
    link[t] = continues_span(o.knobs.locret_span, prev, cur) ? 1 : 0;
    prev = cur;
  }
  return prev;
}

void locret_mark_keep(const LocretMark& m, std::span<float> span_best, std::span<int64_t> order,
                      std::span<uint8_t> keep_mask) {
  // Candidates by (span score, protected first, later row first: rows are in position order); the
  // stabilizers' +INF and the pooled maxima live only in this ordering, the stored scores stay the real
  // ones (a pooled key is recomputed per comparison: pool is a few rows).
  const int64_t n = m.n, keep = m.keep, n_sink = m.n_sink;
  const float* sc = m.score;
  if (m.link != nullptr) {  // each run of linked rows [a, b) takes its best score
    KVTIER_ASSERT(static_cast<size_t>(n) <= span_best.size(), "span scores of {} rows in {}", n,
                  span_best.size());
    for (int64_t a = 0, b = 0; a < n; a = b) {
      float best = sc[a];
      for (b = a + 1; b < n && m.link[b] != 0; ++b) best = std::max(best, sc[b]);
      std::fill(span_best.begin() + a, span_best.begin() + b, best);
    }
    sc = span_best.data();
  }
  const int64_t first_protected = n - m.n_protect;
  const int64_t half = m.pool / 2;
  auto key = [&](int64_t r) {
    if (r >= first_protected || r < n_sink) return std::numeric_limits<float>::infinity();
    float best = sc[r];
    for (int64_t j = std::max<int64_t>(0, r - half); j <= std::min(first_protected - 1, r + half); ++j)
      best = std::max(best, sc[j]);
    return best;
  };
  mark_best(n, keep, order, keep_mask, [&](int64_t a, int64_t b) {
    const float ka = key(a), kb = key(b);
    return ka != kb ? ka > kb : a > b;
  });
}

LocretProtected locret_protected(const KvGeometry& geo, const policy::PolicyKnobs& k, uint32_t layer,
                                 int64_t keep, int64_t n_protect) {
  if (geo.window_of(layer) > 0 && k.locret_sliding == policy::LocretSliding::kRecent) return {keep, 0};
  return {n_protect, k.locret_sinks};
}

uint64_t locret_side_bytes(const KvGeometry& geo, int64_t capacity, const KvOptions& o) {
  const auto rows = static_cast<uint64_t>(locret_rows(capacity, o));
  const uint64_t rk =
      locret_pre_rope(o) ? static_cast<uint64_t>(geo.head_dim_k) * cpu::kv_dtype_bytes(geo.dtype) : 0;
  const uint64_t heads = uint64_t{geo.n_layer()} * geo.max_head_kv();  // [n_layer][h_max] cells
  const uint64_t link = locret_spans(o) ? 1 : 0;  // a link per row, span scores, the pass's links
  return uint64_t{std::max<uint32_t>(o.max_seqs, 1)} * heads * rows * (sizeof(float) + rk + link) +
         static_cast<uint64_t>(max_new_rows(capacity, o)) * (geo.max_head_kv() * sizeof(float) + link) +
         rows * (1 + sizeof(int64_t) + link * sizeof(float)) +
         rows * (2 * static_cast<uint64_t>(geo.head_dim_k) * sizeof(float) + 2 * sizeof(int64_t));
}

LocretKv::LocretKv(const KvGeometry& geometry, int64_t capacity, uint32_t n_head, MemoryLedger& ledger,
                   ThreadPool& pool, cpu::Isa isa, const KvOptions& options)
    : geo_(geometry),
      capacity_(capacity),
      n_seqs_(std::max<uint32_t>(options.max_seqs, 1)),
      opt_(options),
      threads_(pool),
      isa_(isa),
      n_head_(n_head),
      cap_(locret_rows(capacity, options)),
      n_protect_(policy::locret_stabilizers(options.knobs)),
      scorer_(options.scorer),
      pass_(geometry.n_layer(), std::max<uint32_t>(options.max_seqs, 1), capacity) {
  opt_.max_seqs = n_seqs_;
  if (!scorer_) {
    fail(ErrorKind::kInvalidArgument,
         "locret needs retaining heads to score KV units: give --locret-heads FILE (built by "
         "scripts/train_locret_heads.sh MODEL OUT_DIR)");
  }
  if (n_protect_ >= opt_.knobs.budget) {
    fail(ErrorKind::kInvalidArgument, "--stabilizers {} must be smaller than --kv-budget {}", n_protect_,
         opt_.knobs.budget);
  }
  policy::check_locret_sinks(opt_.knobs);
  const BoundedLayout lay = locret_layout(geo_, capacity_, n_head, pool.size(), opt_);
  check_bounded_budget("locret", lay, opt_, "--kv-budget, --local-tail or --chunk");
  reservation_ = Reservation(ledger, Tier::kDevice, Category::kKv, lay.kv_bytes);
  scratch_reservation_ = Reservation(ledger, Tier::kDevice, Category::kScratch, lay.scratch_bytes);
  stores_.reserve(static_cast<size_t>(n_seqs_) * geo_.n_layer());
  for (uint32_t s = 0; s < n_seqs_; ++s) {
    for (uint32_t l = 0; l < geo_.n_layer(); ++l)
      stores_.emplace_back(geo_, l, cap_, locret_pre_rope(opt_), locret_spans(opt_));
  }
  length_.assign(n_seqs_, 0);
  held_.assign(n_seqs_, 0);
  plan_end_.assign(n_seqs_, 0);
  evicted_at_.assign(n_seqs_, 0);
  pass_scores_.resize(static_cast<size_t>(max_new_rows(capacity_, opt_) * geo_.max_head_kv()));
  scratch_.resize(geo_.attention_scratch_bytes(n_head, pool.size()));
  keep_.resize(static_cast<size_t>(cap_));
  order_.resize(static_cast<size_t>(cap_));
  if (locret_spans(opt_)) {
    if (!opt_.token_edges) {
      fail(ErrorKind::kInvalidArgument, "locret --locret-span {} needs the tokenizer's token edges",
           policy::locret_span_name(opt_.knobs.locret_span));
    }
    span_best_.resize(static_cast<size_t>(cap_));
    pass_link_.resize(static_cast<size_t>(max_new_rows(capacity_, opt_)));
  }
  last_edges_.assign(n_seqs_, kEdgeNone);
  pass_edges_.assign(n_seqs_, kEdgeNone);
  if (locret_compact(opt_)) {  // with original positions no key is re-rotated
    rot_in_.resize(static_cast<size_t>(cap_ * geo_.head_dim_k));
    rot_out_.resize(rot_in_.size());
    rot_pos_.resize(static_cast<size_t>(cap_));
    rot_row_.resize(static_cast<size_t>(cap_));
  }
}

int64_t LocretKv::positions(SeqId seq) const {
  pass_.check_seq(seq, "positions");
  return length_[seq];
}

int64_t LocretKv::position(SeqId seq, uint32_t layer, uint32_t head, int64_t r) const {
  KVTIER_ASSERT(r < held_[seq], "row {} of {}", r, held_[seq]);
  return store(seq, layer).pos[store(seq, layer).cell(head, r)];
}

float LocretKv::score(SeqId seq, uint32_t layer, uint32_t head, int64_t r) const {
  KVTIER_ASSERT(r < held_[seq], "row {} of {}", r, held_[seq]);
  return store(seq, layer).score[store(seq, layer).cell(head, r)];
}

std::vector<int64_t> LocretKv::plan_prefill(SeqId seq, int64_t n, int64_t chunk) {
  pass_.check_seq(seq, "plan_prefill");
  KVTIER_ASSERT(n >= 0 && chunk > 0, "plan of {} tokens in chunks of {}", n, chunk);
  int64_t n_pref = 0;
  std::vector<int64_t> out =
      locret_prefill_passes(n, chunk, max_new_rows(capacity_, opt_), opt_.knobs.local_tail, &n_pref);
  plan_end_[seq] = n_pref > 0 ? length_[seq] + n_pref : 0;
  return out;
}

std::span<const PassPositions> LocretKv::begin_batch(std::span<const PassInfo> seqs) {
  // A pass outside the prefill plan that would overflow the rows first evicts as a non-final chunk.
  for (const PassInfo& p : seqs) {
    pass_.check_seq(p.seq, "begin_batch");
    if (p.n > max_new_rows(capacity_, opt_)) break;  // refused below
    if (held_[p.seq] + p.n > cap_) {
      const int64_t keep = std::min(opt_.knobs.budget, cap_ - p.n);
      evict_seq(p.seq, keep, std::min(n_protect_, keep));
      evicted_at_[p.seq] = length_[p.seq];
    }
  }
  // Compact: the pass's tokens continue from the rows held; original: from the tokens seen.
  pass_.begin(seqs, locret_compact(opt_) ? held_ : length_);
  if (pass_.total() > max_new_rows(capacity_, opt_)) {
    pass_.abort();
    fail(ErrorKind::kInternal, "locret pass of {} tokens; the cache was sized for {}", pass_.total(),
         max_new_rows(capacity_, opt_));
  }
  if (locret_spans(opt_)) {  // the pass's links, in batch order (the rows' order in write)
    try {
      int64_t row = 0;
      for (const PassInfo& p : seqs) {
        pass_edges_[p.seq] =
            locret_pass_links(opt_, p.tokens, p.n, last_edges_[p.seq], pass_link_.data() + row);
        row += p.n;
      }
    } catch (...) {
      pass_.abort();
      throw;
    }
  }
  return pass_.positions();
}

void LocretKv::write(uint32_t layer, const LayerRows& rows) {
  pass_.write(layer);
  KVTIER_ASSERT(rows.q_pre != nullptr && rows.k_pre != nullptr,
                "locret: layer {} written without pre-RoPE rows", layer);
  for (const SeqPass& sp : pass_.seqs()) write_seq(layer, rows, sp);
}

void LocretKv::write_seq(uint32_t layer, const LayerRows& all, const SeqPass& sp) {
  Store& s = store(sp.seq, layer);
  const int64_t n = sp.n;
  const int64_t held = held_[sp.seq];
  const int64_t hk = geo_.n_head_kv[layer];
  const int64_t dk = geo_.head_dim_k, dv = geo_.head_dim_v;
  KVTIER_ASSERT(held + n <= cap_, "layer {}: {} + {} rows in {}", layer, held, n, cap_);
  // This sequence's rows start at sp.row0 in every buffer of the pass.
  const float* k = all.k + sp.row0 * hk * dk;
  const float* kpre = all.k_pre + sp.row0 * hk * dk;
  const float* v = all.v + sp.row0 * hk * dv;
  const int64_t true0 = length_[sp.seq];
  float* sc = pass_scores_.data();
  scorer_->score(threads_, isa_, layer, true0, all.q_pre + sp.row0 * n_head_ * dk, kpre, v, n, sc);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < hk; ++h) {
      s.put(h, held + t, k + (t * hk + h) * dk, kpre + (t * hk + h) * dk, v + (t * hk + h) * dv, true0 + t,
            sc[t * hk + h]);
      if (!s.link.empty()) s.link[s.cell(h, held + t)] = pass_link_[static_cast<size_t>(sp.row0 + t)];
    }
  }
}

void LocretKv::attend(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o) {
  pass_.attend(layer);
  for (const SeqPass& sp : pass_.seqs()) {
    attend_seq(layer, q + sp.row0 * n_head * geo_.head_dim_k, n_head, la,
               o + sp.row0 * n_head * geo_.head_dim_v, sp);
  }
}

void LocretKv::attend_seq(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o,
                          const SeqPass& sp) {
  Store& s = store(sp.seq, layer);
  const cpu::AttnParams ap = layer_attn_params(geo_, layer, n_head, la);
  // Compact positions: row i at position i; the pass's queries at held, held + 1, ... (= sp.pos0).
  // Original: the queries at their true positions sp.pos0 + t, and the rows, in position order with the
  // pass's own last, numbered up to them (row held + t at sp.pos0 + t), which is all the causal mask
  // and a window need (the keys carry their true rotations).
  const int64_t held = held_[sp.seq];
  const cpu::KvSpan span = s.span(geo_, sp.pos0 - held, held + sp.n);
  const cpu::AttnQueries aq{q, n_head * ap.head_dim_k, sp.n, n_head, sp.pos0};
  const cpu::AttnOutput out{o, n_head * ap.head_dim_v, nullptr, n_head};
  cpu::attend(threads_, isa_, ap, aq, std::span(&span, 1), out, scratch_);
}

void LocretKv::evict_head(Store& s, uint32_t layer, int64_t h, int64_t n, int64_t keep, int64_t n_protect) {
  const LocretProtected prot = locret_protected(geo_, opt_.knobs, layer, keep, n_protect);
  const LocretMark m{s.score.data() + s.cell(h, 0),
                     s.link.empty() ? nullptr : s.link.data() + s.cell(h, 0),
                     n,
                     keep,
                     prot.last,
                     prot.first,
                     opt_.knobs.locret_pool};
  locret_mark_keep(m, span_best_, order_, keep_);
  if (!locret_compact(opt_)) {  // original positions: the kept rows keep their keys as they are
    const int64_t kept = s.compact(h, n, keep_);
    KVTIER_ASSERT(kept == keep, "layer {} head {}: kept {} rows of {}", layer, h, kept, keep);
    return;
  }
  // Compact in place (kept rows in position order) and re-rotate every moved key to its new row: from
  // its pre-RoPE copy to the new row's position, or (rerotate) the moved key by new row - old row.
  const int64_t dk = geo_.head_dim_k;
  int64_t n_rot = 0;
  const int64_t batch = compute_ != nullptr ? std::min<int64_t>(compute_->max_rows(), cap_) : cap_;
  auto flush = [&]() {
    if (n_rot == 0) return;
    KVTIER_ASSERT(compute_ != nullptr, "locret: an eviction moved keys but the model hook is not set");
    compute_->rope_k_rows(layer, rot_in_.data(), std::span(rot_pos_.data(), static_cast<size_t>(n_rot)),
                          rot_out_.data());
    for (int64_t i = 0; i < n_rot; ++i) {
      const size_t dst = s.cell(h, rot_row_[static_cast<size_t>(i)]);
      store_kv_row(geo_.dtype, rot_out_.data() + i * dk, dk, s.k.data() + dst * s.rk);
    }
    n_rot = 0;
  };
  const bool pre_rope = locret_pre_rope(opt_);
  const int64_t kept = s.compact(h, n, keep_, [&](int64_t w, int64_t r) {
    const uint8_t* src = (pre_rope ? s.kpre.data() : s.k.data()) + s.cell(h, w) * s.rk;
    load_kv_row(geo_.dtype, src, dk, rot_in_.data() + n_rot * dk);
    rot_pos_[static_cast<size_t>(n_rot)] = pre_rope ? w : w - r;
    rot_row_[static_cast<size_t>(n_rot)] = w;
    if (++n_rot == batch) flush();
  });
  flush();
  KVTIER_ASSERT(kept == keep, "layer {} head {}: kept {} rows of {}", layer, h, kept, keep);
}

void LocretKv::evict_seq(SeqId seq, int64_t keep, int64_t n_protect) {
  const int64_t n = held_[seq];
  if (n <= keep) return;
  for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
    Store& s = store(seq, l);
    for (int64_t h = 0; h < geo_.n_head_kv[l]; ++h) evict_head(s, l, h, n, keep, n_protect);
  }
  held_[seq] = keep;
  ++evictions_;
}

void LocretKv::end_pass() {
  pass_.end();
  for (const SeqPass& sp : pass_.seqs()) {
    const SeqId seq = sp.seq;
    const int64_t start = length_[seq];
    const int64_t end = start + sp.n;
    held_[seq] += sp.n;
    length_[seq] = end;
    last_edges_[seq] = pass_edges_[seq];
    // A chunk of the planned prefill: evict to b, the last n_s protected unless it is the final one.
    if (end <= plan_end_[seq]) {
      const bool final_chunk = end == plan_end_[seq];
      if (held_[seq] > opt_.knobs.budget) {
        evict_seq(seq, opt_.knobs.budget, final_chunk ? 0 : n_protect_);
        evicted_at_[seq] = end;
      }
      if (final_chunk) plan_end_[seq] = 0;
    }
  }
}

void LocretKv::abort_pass() {
  if (pass_.open()) pass_.abort();  // the pass's rows lie past each store's count: forgotten
}

void LocretKv::truncate(SeqId seq, int64_t n) {
  pass_.check_truncate(seq, n, length_[seq]);
  plan_end_[seq] = 0;
  last_edges_[seq] = kEdgeNone;  // the next token starts a span (the dropped token's edges are not kept)
  if (n == 0) {
    held_[seq] = length_[seq] = evicted_at_[seq] = 0;
    return;
  }
  // Positions >= n are dropped; what stays must be a state locret reaches for the shorter sequence:
  // no eviction may have happened after position n (it chose among positions that now go).
  if (n < evicted_at_[seq]) {
    fail(ErrorKind::kInvalidArgument,
         "cannot truncate sequence {} to {} tokens: locret evicted rows after position {} by scores that "
         "included the positions dropped; prefill again",
         seq, n, evicted_at_[seq]);
  }
  const int64_t drop = length_[seq] - n;  // rows after the last eviction are all held, in order
  KVTIER_ASSERT(drop <= held_[seq], "truncate drops {} of {} rows", drop, held_[seq]);
  held_[seq] -= drop;
  length_[seq] = n;
}

}  // namespace kvtier::kv
