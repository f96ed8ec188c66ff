#include "kv/h2o_kv.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/cpu/attention_mass.h"
#include "core/error.h"
#include "kv/kv_row.h"
#include "policy/retention.h"

namespace kvtier::kv {
namespace {

int64_t max_rows(const KvGeometry& geo, int64_t capacity, const KvOptions& o) {
  int64_t m = 0;
  for (uint32_t l = 0; l < geo.n_layer(); ++l) m = std::max(m, h2o_rows(geo, l, capacity, o));
  return m;
}

}  // namespace

int64_t h2o_rows(const KvGeometry& geo, uint32_t layer, int64_t capacity, const KvOptions& o) {
  const int64_t max_new = max_new_rows(capacity, o);
  const int64_t w = geo.window_of(layer);
  return std::min(capacity, w > 0 ? w - 1 + max_new : o.knobs.budget + max_new);
}

BoundedLayout h2o_layout(const KvGeometry& geo, int64_t capacity, uint32_t n_head, int threads,
                         const KvOptions& o) {
  geo.validate();
  if (capacity <= 0) fail(ErrorKind::kInvalidArgument, "KV capacity of {} positions", capacity);
  if (o.knobs.budget <= 0)
    fail(ErrorKind::kInvalidArgument, "h2o needs --kv-budget N (tokens per sequence and layer kept)");
  BoundedLayout r;
  for (uint32_t l = 0; l < geo.n_layer(); ++l) {
    r.kv_bytes += uint64_t{o.max_seqs} * geo.n_head_kv[l] *
                  static_cast<uint64_t>(h2o_rows(geo, l, capacity, o)) * bounded_row_bytes(geo, false, 2);
  }
  const auto rows = static_cast<uint64_t>(max_rows(geo, capacity, o));
  r.scratch_bytes = geo.attention_scratch_bytes(n_head, threads) +
                    static_cast<uint64_t>(max_new_rows(capacity, o)) * n_head * sizeof(float) +
                    rows * (1 + sizeof(int64_t));
  return r;
}

H2oKv::H2oKv(const KvGeometry& geometry, int64_t capacity, uint32_t n_head, MemoryLedger& ledger,
             ThreadPool& pool, cpu::Isa isa, const KvOptions& options)
    : geo_(geometry),
      capacity_(capacity),
      n_seqs_(std::max<uint32_t>(options.max_seqs, 1)),
      opt_(options),
      threads_(pool),
      isa_(isa),
      pass_(geometry.n_layer(), std::max<uint32_t>(options.max_seqs, 1), capacity) {
  opt_.max_seqs = n_seqs_;
  const BoundedLayout lay = h2o_layout(geo_, capacity_, n_head, pool.size(), opt_);
  check_bounded_budget("h2o", lay, opt_, "--kv-budget or --chunk");
  recent_ = std::clamp<int64_t>(std::llround(static_cast<double>(opt_.knobs.budget) * opt_.knobs.h2o_recent),
                                0, opt_.knobs.budget);
  reservation_ = Reservation(ledger, Tier::kDevice, Category::kKv, lay.kv_bytes);
  scratch_reservation_ = Reservation(ledger, Tier::kDevice, Category::kScratch, lay.scratch_bytes);
  stores_.reserve(static_cast<size_t>(n_seqs_) * geo_.n_layer());
  for (uint32_t s = 0; s < n_seqs_; ++s) {
    for (uint32_t l = 0; l < geo_.n_layer(); ++l)
      stores_.emplace_back(geo_, l, h2o_rows(geo_, l, capacity_, opt_));
  }
  length_.assign(n_seqs_, 0);
  lse_.resize(static_cast<size_t>(max_new_rows(capacity_, opt_) * n_head));
  scratch_.resize(geo_.attention_scratch_bytes(n_head, pool.size()));
  keep_.resize(static_cast<size_t>(max_rows(geo_, capacity_, opt_)));
  order_.resize(keep_.size());
}

int64_t H2oKv::positions(SeqId seq) const {
  pass_.check_seq(seq, "positions");
  return length_[seq];
}

int64_t H2oKv::position(SeqId seq, uint32_t layer, uint32_t head, int64_t r) const {
  const Store& s = store(seq, layer);
  KVTIER_ASSERT(r < s.n, "row {} of {}", r, s.n);
  return s.rows.pos[s.rows.cell(head, r)];
}

float H2oKv::score(SeqId seq, uint32_t layer, uint32_t head, int64_t r) const {
  const Store& s = store(seq, layer);
  KVTIER_ASSERT(r < s.n, "row {} of {}", r, s.n);
  return s.rows.score[s.rows.cell(head, r)];
}

std::span<const PassPositions> H2oKv::begin_batch(std::span<const PassInfo> seqs) {
  pass_.begin(seqs, length_);
  if (pass_.total() > max_new_rows(capacity_, opt_)) {
    pass_.abort();
    fail(ErrorKind::kInternal, "h2o pass of {} tokens; the cache was sized for {}", pass_.total(),
         max_new_rows(capacity_, opt_));
  }
  return pass_.positions();
}

void H2oKv::write(uint32_t layer, const LayerRows& rows) {
  pass_.write(layer);
  for (const SeqPass& sp : pass_.seqs()) write_seq(layer, rows, sp);
}

void H2oKv::write_seq(uint32_t layer, const LayerRows& all, const SeqPass& sp) {
  Store& s = store(sp.seq, layer);
  const int64_t hk = geo_.n_head_kv[layer];
  const int64_t dk = geo_.head_dim_k, dv = geo_.head_dim_v;
  const float* k = all.k + sp.row0 * hk * dk;  // this sequence's rows
  const float* v = all.v + sp.row0 * hk * dv;
  KVTIER_ASSERT(s.n + sp.n <= s.rows.cap, "layer {}: {} + {} rows in {}", layer, s.n, sp.n, s.rows.cap);
  for (int64_t t = 0; t < sp.n; ++t) {
    for (int64_t h = 0; h < hk; ++h)
      s.rows.put(h, s.n + t, k + (t * hk + h) * dk, nullptr, v + (t * hk + h) * dv, sp.pos0 + t, 0.0f);
  }
}

void H2oKv::attend(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o) {
  pass_.attend(layer);
  for (const SeqPass& sp : pass_.seqs()) {
    attend_seq(layer, q + sp.row0 * n_head * geo_.head_dim_k, n_head, la,
               o + sp.row0 * n_head * geo_.head_dim_v, sp);
  }
}

void H2oKv::attend_seq(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o,
                       const SeqPass& sp) {
  Store& s = store(sp.seq, layer);
  const int64_t pos0 = sp.pos0;
  const int64_t n = sp.n;
  const int64_t hk = geo_.n_head_kv[layer];
  KVTIER_ASSERT(la.window == geo_.window_of(layer) || geo_.window.empty(),
                "layer {}: attention window {} but the cache was sized for {}", layer, la.window,
                geo_.window_of(layer));
  const cpu::AttnParams ap = layer_attn_params(geo_, layer, n_head, la);
  // The held rows, counted back from the pass's first token: real positions until something is evicted
  // (and always on a sliding layer, which only drops its oldest rows).
  const cpu::KvSpan span = s.rows.span(geo_, pos0 - s.n, s.n + n);
  const cpu::AttnQueries aq{q, n_head * ap.head_dim_k, n, n_head, pos0};
  const cpu::AttnOutput out{o, n_head * ap.head_dim_v, lse_.data(), n_head};
  cpu::attend(threads_, isa_, ap, aq, std::span(&span, 1), out, scratch_);
  if (!evicts(layer)) return;
  for (int64_t h = 0; h < hk; ++h) {
    std::fill_n(s.delta.begin() + h * s.rows.cap, s.n + n, 0.0f);
  }
  cpu::accumulate_key_mass(threads_, isa_, ap, aq, span, lse_.data(), n_head, s.delta.data(), s.rows.cap);
}

void H2oKv::evict(Store& s, uint32_t layer, int64_t end) {
  const int64_t hk = geo_.n_head_kv[layer];
  if (!evicts(layer)) {  // a sliding layer: the rows below what the next query can see
    const int64_t first = policy::sliding_first_visible(end, geo_.window_of(layer));
    int64_t drop = 0;
    while (drop < s.n && s.rows.pos[static_cast<size_t>(drop)] < first) ++drop;
    if (drop == 0) return;
    std::fill(keep_.begin(), keep_.begin() + s.n, uint8_t{1});
    std::fill(keep_.begin(), keep_.begin() + drop, uint8_t{0});
    for (int64_t h = 0; h < hk; ++h) s.rows.compact(h, s.n, keep_);
    s.n -= drop;
    return;
  }
  const int64_t budget = opt_.knobs.budget;
  if (s.n <= budget) return;
  const int64_t old = s.n - recent_;  // rows older than the recent window: candidates
  for (int64_t h = 0; h < hk; ++h) {
    const float* sc = s.rows.score.data() + s.rows.cell(h, 0);
    // The budget - recent best-scored candidates (ties: the older row) and every recent row.
    mark_best(old, budget - recent_, order_, keep_,
              [sc](int64_t a, int64_t b) { return sc[a] != sc[b] ? sc[a] > sc[b] : a < b; });
    std::fill(keep_.begin() + old, keep_.begin() + s.n, uint8_t{1});
    const int64_t kept = s.rows.compact(h, s.n, keep_);
    KVTIER_ASSERT(kept == budget, "layer {} head {}: kept {} rows of budget {}", layer, h, kept, budget);
  }
  s.n = budget;
}

void H2oKv::end_pass() {
  pass_.end();
  for (const SeqPass& sp : pass_.seqs()) end_seq(sp);
}

void H2oKv::end_seq(const SeqPass& sp) {
  const SeqId seq = sp.seq;
  const int64_t n = sp.n;
  const int64_t end = sp.pos0 + n;
  for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
    Store& s = store(seq, l);
    if (evicts(l)) {
      for (int64_t h = 0; h < geo_.n_head_kv[l]; ++h) {
        for (int64_t r = 0; r < s.n; ++r) s.rows.score[s.rows.cell(h, r)] += s.delta[s.rows.cell(h, r)];
        for (int64_t r = s.n; r < s.n + n; ++r) s.rows.score[s.rows.cell(h, r)] = s.delta[s.rows.cell(h, r)];
      }
    }
    s.n += n;
    evict(s, l, end);
  }
  length_[seq] = end;
}

void H2oKv::abort_pass() {
  if (pass_.open()) pass_.abort();  // the pass's rows lie past each store's count: forgotten
}

void H2oKv::truncate(SeqId seq, int64_t n) {
  pass_.check_truncate(seq, n, length_[seq]);
  // Rows of positions >= n go. What stays must be a state H2O could have reached: every KV head drops
  // the same positions (true of the recent rows, not of the heavy hitters), and a sliding layer still
  // holds the window of a query at n.
  for (uint32_t l = 0; l < geo_.n_layer() && n > 0; ++l) {
    const Store& s = store(seq, l);
    auto gone = [&](int64_t h) {
      int64_t f = s.n;
      while (f > 0 && s.rows.pos[s.rows.cell(h, f - 1)] >= n) --f;
      return f;
    };
    const int64_t f0 = gone(0);
    const std::vector<int64_t>& pos = s.rows.pos;
    bool ok = evicts(l) || s.n == 0 || pos[0] <= policy::sliding_first_visible(n, geo_.window_of(l));
    for (int64_t h = 1; ok && h < geo_.n_head_kv[l]; ++h) {
      ok = gone(h) == f0 && std::equal(pos.begin() + h * s.rows.cap + f0, pos.begin() + h * s.rows.cap + s.n,
                                       pos.begin() + f0);
    }
    if (!ok) {
      fail(
          ErrorKind::kInvalidArgument,
          "cannot truncate sequence {} to {} tokens: h2o already evicted rows of layer {} that decide what a "
          "query at {} attends; prefill again",
          seq, n, l, n);
    }
  }
  for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
    Store& s = store(seq, l);
    int64_t keep = s.n;
    while (keep > 0 && s.rows.pos[static_cast<size_t>(keep - 1)] >= n) --keep;  // the same in every head
    s.n = n == 0 ? 0 : keep;
  }
  length_[seq] = n;
}

}  // namespace kvtier::kv
