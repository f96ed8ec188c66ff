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

uint64_t row_bytes(const KvGeometry& geo) {
  return static_cast<uint64_t>(geo.head_dim_k + geo.head_dim_v) * cpu::kv_dtype_bytes(geo.dtype) +
         sizeof(int64_t) + 2 * sizeof(float);
}

int64_t max_q_per_kv(const KvGeometry& geo, uint32_t n_head) {
  int64_t m = 1;
  for (uint32_t l = 0; l < geo.n_layer(); ++l) m = std::max<int64_t>(m, n_head / geo.n_head_kv[l]);
  return m;
}

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

H2oLayout h2o_layout(const KvGeometry& geo, int64_t capacity, uint32_t n_head, int threads,
                     const KvOptions& o) {
  geo.validate();
  if (capacity <= 0) fail(ErrorKind::kInvalidArgument, "KV capacity of {} positions", capacity);
  if (o.knobs.budget <= 0)
    fail(ErrorKind::kInvalidArgument, "h2o needs --kv-budget N (tokens per sequence and layer kept)");
  H2oLayout r;
  for (uint32_t l = 0; l < geo.n_layer(); ++l) {
    r.kv_bytes += uint64_t{o.max_seqs} * geo.n_head_kv[l] *
                  static_cast<uint64_t>(h2o_rows(geo, l, capacity, o)) * row_bytes(geo);
  }
  cpu::AttnParams ap;
  ap.head_dim_k = geo.head_dim_k;
  ap.head_dim_v = geo.head_dim_v;
  ap.q_per_kv = max_q_per_kv(geo, n_head);
  const auto rows = static_cast<uint64_t>(max_rows(geo, capacity, o));
  r.scratch_bytes = cpu::attention_scratch_bytes(ap, threads) +
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
      esz_(cpu::kv_dtype_bytes(geometry.dtype)),
      pass_(geometry.n_layer(), std::max<uint32_t>(options.max_seqs, 1), capacity) {
  opt_.max_seqs = n_seqs_;
  const H2oLayout lay = h2o_layout(geo_, capacity_, n_head, pool.size(), opt_);
  if (opt_.kv_mem != 0 && lay.kv_bytes + lay.scratch_bytes > opt_.kv_mem) {
    fail(ErrorKind::kBudget,
         "h2o with --kv-budget {} needs {} bytes of compute-local memory ({} of KV rows and scores, {} of "
         "scratch) but --kv-mem is {} bytes; lower --kv-budget or --chunk, or raise --kv-mem",
         opt_.knobs.budget, lay.kv_bytes + lay.scratch_bytes, lay.kv_bytes, lay.scratch_bytes, opt_.kv_mem);
  }
  recent_ = std::clamp<int64_t>(std::llround(static_cast<double>(opt_.knobs.budget) * opt_.knobs.h2o_recent),
                                0, opt_.knobs.budget);
  reservation_ = Reservation(ledger, Tier::kDevice, Category::kKv, lay.kv_bytes);
  scratch_reservation_ = Reservation(ledger, Tier::kDevice, Category::kScratch, lay.scratch_bytes);
  for (uint32_t s = 0; s < n_seqs_; ++s) {
    for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
      Store& st = stores_.emplace_back();
      st.cap = h2o_rows(geo_, l, capacity_, opt_);
      const auto cells = static_cast<size_t>(geo_.n_head_kv[l] * st.cap);
      st.k.resize(cells * static_cast<size_t>(geo_.head_dim_k) * esz_);
      st.v.resize(cells * static_cast<size_t>(geo_.head_dim_v) * esz_);
      st.pos.resize(cells);
      st.score.resize(cells);
      st.delta.resize(cells);
    }
  }
  length_.assign(n_seqs_, 0);
  lse_.resize(static_cast<size_t>(max_new_rows(capacity_, opt_) * n_head));
  cpu::AttnParams ap;
  ap.head_dim_k = geo_.head_dim_k;
  ap.head_dim_v = geo_.head_dim_v;
  ap.q_per_kv = max_q_per_kv(geo_, n_head);
  scratch_.resize(cpu::attention_scratch_bytes(ap, pool.size()));
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
  return s.pos[static_cast<size_t>(head * s.cap + r)];
}

float H2oKv::score(SeqId seq, uint32_t layer, uint32_t head, int64_t r) const {
  const Store& s = store(seq, layer);
  KVTIER_ASSERT(r < s.n, "row {} of {}", r, s.n);
  return s.score[static_cast<size_t>(head * s.cap + r)];
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
  const int64_t n = sp.n;
  const int64_t hk = geo_.n_head_kv[layer];
  const int64_t dk = geo_.head_dim_k, dv = geo_.head_dim_v;
  LayerRows rows;  // this sequence's rows
  rows.k = all.k + sp.row0 * hk * dk;
  rows.v = all.v + sp.row0 * hk * dv;
  KVTIER_ASSERT(s.n + n <= s.cap, "layer {}: {} + {} rows in {}", layer, s.n, n, s.cap);
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < hk; ++h) {
      const int64_t r = h * s.cap + s.n + t;
      store_kv_row(geo_.dtype, rows.k + (t * hk + h) * dk, dk,
                   s.k.data() + static_cast<size_t>(r * dk) * esz_);
      store_kv_row(geo_.dtype, rows.v + (t * hk + h) * dv, dv,
                   s.v.data() + static_cast<size_t>(r * dv) * esz_);
      s.pos[static_cast<size_t>(r)] = sp.pos0 + t;
    }
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
  cpu::AttnParams ap;
  ap.head_dim_k = geo_.head_dim_k;
  ap.head_dim_v = geo_.head_dim_v;
  ap.q_per_kv = n_head / hk;
  ap.scale = la.scale;
  ap.softcap = la.softcap;
  ap.window = la.window;
  ap.kv_dtype = geo_.dtype;
  // The held rows, counted back from the pass's first token: real positions until something is evicted
  // (and always on a sliding layer, which only drops its oldest rows).
  cpu::KvSpan span;
  span.pos0 = pos0 - s.n;
  span.n_tokens = s.n + n;
  span.k = s.k.data();
  span.v = s.v.data();
  span.k_head_stride = s.cap * geo_.head_dim_k;
  span.v_head_stride = s.cap * geo_.head_dim_v;
  const cpu::AttnQueries aq{q, n_head * ap.head_dim_k, n, n_head, pos0};
  const cpu::AttnOutput out{o, n_head * ap.head_dim_v, lse_.data(), n_head};
  cpu::attend(threads_, isa_, ap, aq, std::span(&span, 1), out, scratch_);
  if (!evicts(layer)) return;
  for (int64_t h = 0; h < hk; ++h) {
    std::fill_n(s.delta.begin() + h * s.cap, s.n + n, 0.0f);
  }
  cpu::accumulate_key_mass(threads_, isa_, ap, aq, span, lse_.data(), n_head, s.delta.data(), s.cap);
}

int64_t H2oKv::compact(Store& s, uint32_t layer, int64_t h, const std::vector<uint8_t>& keep) {
  const size_t rk = static_cast<size_t>(geo_.head_dim_k) * esz_,
               rv = static_cast<size_t>(geo_.head_dim_v) * esz_;
  int64_t w = 0;
  for (int64_t r = 0; r < s.n; ++r) {
    if (!keep[static_cast<size_t>(r)]) continue;
    if (w != r) {
      const auto src = static_cast<size_t>(h * s.cap + r), dst = static_cast<size_t>(h * s.cap + w);
      std::memmove(s.k.data() + dst * rk, s.k.data() + src * rk, rk);
      std::memmove(s.v.data() + dst * rv, s.v.data() + src * rv, rv);
      s.pos[dst] = s.pos[src];
      s.score[dst] = s.score[src];
    }
    ++w;
  }
  (void)layer;
  return w;
}

void H2oKv::evict(Store& s, uint32_t layer, int64_t end) {
  const int64_t hk = geo_.n_head_kv[layer];
  if (!evicts(layer)) {  // a sliding layer: the rows below what the next query can see
    const int64_t first = policy::sliding_first_visible(end, geo_.window_of(layer));
    int64_t drop = 0;
    while (drop < s.n && s.pos[static_cast<size_t>(drop)] < first) ++drop;
    if (drop == 0) return;
    std::fill(keep_.begin(), keep_.begin() + s.n, uint8_t{1});
    std::fill(keep_.begin(), keep_.begin() + drop, uint8_t{0});
    for (int64_t h = 0; h < hk; ++h) compact(s, layer, h, keep_);
    s.n -= drop;
    return;
  }
  const int64_t budget = opt_.knobs.budget;
  if (s.n <= budget) return;
  const int64_t old = s.n - recent_;       // rows older than the recent window: candidates
  const int64_t heavy = budget - recent_;  // of which the best-scored are kept
  for (int64_t h = 0; h < hk; ++h) {
    const float* sc = s.score.data() + h * s.cap;
    std::iota(order_.begin(), order_.begin() + old, int64_t{0});
    std::stable_sort(order_.begin(), order_.begin() + old,
                     [&](int64_t a, int64_t b) { return sc[a] > sc[b]; });
    std::fill(keep_.begin(), keep_.begin() + s.n, uint8_t{0});
    std::fill(keep_.begin() + old, keep_.begin() + s.n, uint8_t{1});
    for (int64_t i = 0; i < heavy; ++i) keep_[static_cast<size_t>(order_[static_cast<size_t>(i)])] = 1;
    const int64_t kept = compact(s, layer, h, keep_);
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
        for (int64_t r = 0; r < s.n; ++r) s.score[h * s.cap + r] += s.delta[h * s.cap + r];
        for (int64_t r = s.n; r < s.n + n; ++r) s.score[h * s.cap + r] = s.delta[h * s.cap + r];
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
      while (f > 0 && s.pos[static_cast<size_t>(h * s.cap + f - 1)] >= n) --f;
      return f;
    };
    const int64_t f0 = gone(0);
    bool ok = evicts(l) || s.n == 0 || s.pos[0] <= policy::sliding_first_visible(n, geo_.window_of(l));
    for (int64_t h = 1; ok && h < geo_.n_head_kv[l]; ++h) {
      ok = gone(h) == f0 &&
           std::equal(s.pos.begin() + h * s.cap + f0, s.pos.begin() + h * s.cap + s.n, s.pos.begin() + f0);
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
    while (keep > 0 && s.pos[static_cast<size_t>(keep - 1)] >= n) --keep;  // the same in every head
    s.n = n == 0 ? 0 : keep;
  }
  length_[seq] = n;
}

}  // namespace kvtier::kv
