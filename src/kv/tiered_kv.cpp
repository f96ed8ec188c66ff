#include "kv/tiered_kv.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "kv/kv_row.h"
#include "policy/retention.h"

namespace kvtier::kv {
namespace {

constexpr uint64_t kPageAlign = 4096;

uint64_t round_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}
uint64_t round_down(uint64_t v, uint64_t a) {
  return v / a * a;
}

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
      pass_(geometry.n_layer(), 1, capacity) {
  lay_ = tiered_layout(geo_, capacity_, n_head, pool.size(), opt_);  // validates, checks the budget
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
  scratch_reservation_ = Reservation(ledger, Tier::kDevice, Category::kScratch, lay_.scratch_bytes);
  scratch_.resize(lay_.scratch_bytes);
  staging_ =
      std::make_unique<BlockPool>(ledger, Tier::kDevice, lay_.buffer_bytes, lay_.n_buffers, kPageAlign);
  for (uint32_t i = 0; i < lay_.n_buffers; ++i) buffer_slots_.push_back(staging_->acquire());

  home_ = opt_.disk_dir.empty() ? make_host_store(ledger, lay_.home_bytes)
                                : make_disk_store(ledger, opt_.disk_dir, lay_.home_bytes, opt_.disk_faults);
  home_block_bytes_ = lay_.home_block_bytes;
  home_pins_reservation_ = Reservation(ledger, Tier::kHost, Category::kKv, lay_.home_pin_bytes);
  // A job moves one extent (a run of whole or partial blocks) per plane: K and V of each head of the
  // largest unit.
  copies_.resize(4ull * lay_.h_max);
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  engine_ = std::make_unique<TransferEngine>(*home_, home_block_bytes_, 4 * lay_.n_buffers + 4,
                                             copies_.size(), opt_.copy_delay_us);
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
  return length_;
}

uint64_t TieredKv::home_plane(uint32_t layer, uint32_t head, int kv) const {
  return lay_.home_offset[layer] + (2ull * head + kv) * lay_.home_pitch[layer];
}

int64_t TieredKv::first_row(uint32_t layer, int64_t pos0) const {
  if (opt_.retention != policy::Retention::kSliding) return 0;
  const int64_t bt = geo_.block_tokens;
  return policy::sliding_first_visible(pos0, geo_.window_of(layer)) / bt * bt;
}

void TieredKv::add_rows(uint32_t layer, uint32_t head, int kv, uint8_t* buf, int64_t r0, int64_t r1,
                        size_t& n) {
  if (r1 <= r0) return;
  const uint64_t rb = (kv == 0 ? geo_.head_dim_k : geo_.head_dim_v) * esz_;
  const uint64_t a = home_->alignment();
  const uint64_t plane = home_plane(layer, head, kv);
  const int64_t ring = lay_.home_rows[layer];
  // Byte range of the rows in the staging plane, page-rounded for direct I/O (the bytes around the
  // rows are loaded rows or never read as valid).
  const uint64_t lo = round_down(static_cast<uint64_t>(r0) * rb, a);
  const uint64_t hi = round_up(static_cast<uint64_t>(r1) * rb, a);
  if (ring >= capacity_) {
    add_copy(plane + lo, buf + lo, hi - lo, n);
    return;
  }
  // A ring plane: row r lives at (r mod ring); ring * rb is a multiple of the page (tiered_layout).
  const uint64_t ring_bytes = static_cast<uint64_t>(ring) * rb;
  KVTIER_ASSERT(hi - lo <= ring_bytes, "rows [{}, {}) do not fit the ring of {} rows", r0, r1, ring);
  const uint64_t start = lo % ring_bytes;
  const uint64_t first = std::min(hi - lo, ring_bytes - start);
  add_copy(plane + start, buf + lo, first, n);
  add_copy(plane, buf + lo + first, hi - lo - first, n);
}

TieredKv::Layout TieredKv::layout_for(uint32_t group) const {
  Layout lay;
  lay.group = group;
  lay.pitch = round_down(lay_.buffer_bytes / (2ull * group), kPageAlign);
  lay.rows = static_cast<int64_t>(lay.pitch / row_max_);
  return lay;
}

PassPositions TieredKv::begin_pass(const PassInfo& info) {
  pass_.begin(info, length_);
  try {
    KVTIER_ASSERT(info.n <= opt_.max_new_rows, "pass of {} rows, staging for {}", info.n, opt_.max_new_rows);
    pass_pos0_ = pass_.pos0();
    pass_n_ = pass_.n();
    plan(pass_pos0_ + pass_n_);
  } catch (...) {
    pass_.abort();
    throw;
  }
  return {pass_pos0_, pass_n_};
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
  pass_first_visit_ = next_visit_;
  ++passes_;
}

void TieredKv::write(uint32_t layer, const LayerRows& rows) {
  pass_.write(layer);
  const int64_t n = pass_n_;
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
}

void TieredKv::submit_load(uint64_t visit, size_t unit_index, int64_t rows) {
  const policy::Unit& u = plan_.units[unit_index];
  uint8_t* base = buffer(visit);
  const int64_t first = std::min(first_row(u.layer, rows), rows);
  size_t n_blocks = 0;
  for (uint32_t h = 0; h < u.n_heads; ++h) {
    for (int kv = 0; kv < 2; ++kv) {
      add_rows(u.layer, u.head0 + h, kv, base + (2ull * h + kv) * layout_.pitch, first, rows, n_blocks);
    }
  }
  Visit vis;
  vis.visit = visit;
  vis.unit = u;
  vis.first = first;
  vis.rows = rows;
  vis.epoch = epoch_;
  // Submitted even with nothing to load: waiting on it also orders this visit after the store that
  // last read the buffer (a zero-byte job is still a FIFO fence).
  vis.ticket = engine_->prepare(CopyDir::kLoad, std::span(copies_.data(), n_blocks),
                                {staging_.get(), buffer_slot(visit)});
  inflight_.push_back(vis);
}

void TieredKv::prefetch_ahead(uint64_t visit) {
  const uint64_t n_off = offloaded_.size();
  const uint64_t last = inflight_.empty() ? visit : std::max(visit, inflight_.back().visit);
  for (uint64_t v = last + 1; v <= visit + opt_.placement.prefetch_depth; ++v) {
    const uint64_t rel = v - pass_first_visit_;
    const uint64_t pass_ahead = rel / n_off;
    if (pass_ahead > 1) break;  // two passes ahead: their lengths are unknown
    const int64_t rows = pass_ahead == 0 ? pass_pos0_ : pass_pos0_ + pass_n_;
    if (rows + 1 > layout_.rows) break;  // the next pass will need another layout
    submit_load(v, offloaded_[rel % n_off], rows);
  }
}

void TieredKv::scatter_new_rows(uint8_t* base, uint64_t pitch, const policy::Unit& u, int64_t pos0,
                                int64_t n) {
  const int64_t hk = geo_.n_head_kv[u.layer];
  const uint64_t rk = geo_.head_dim_k * esz_, rv = geo_.head_dim_v * esz_;
  for (int64_t t = 0; t < n; ++t) {
    for (uint32_t h = 0; h < u.n_heads; ++h) {
      const int64_t src = t * hk + u.head0 + h;
      std::memcpy(base + 2ull * h * pitch + static_cast<uint64_t>(pos0 + t) * rk,
                  new_k_.data() + static_cast<uint64_t>(src) * rk, rk);
      std::memcpy(base + (2ull * h + 1) * pitch + static_cast<uint64_t>(pos0 + t) * rv,
                  new_v_.data() + static_cast<uint64_t>(src) * rv, rv);
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
  const int64_t qh = u.n_heads * ap.q_per_kv;
  const int64_t first_q = u.head0 * ap.q_per_kv;
  cpu::AttnQueries aq{q + first_q * ap.head_dim_k, n_head * ap.head_dim_k, n, qh, pos0};
  cpu::AttnOutput out{o + first_q * ap.head_dim_v, n_head * ap.head_dim_v, nullptr, 0};
  cpu::attend(threads_, isa_, ap, aq, std::span(&span, 1), out, scratch_);
}

void TieredKv::attend(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o) {
  pass_.attend(layer);
  KVTIER_ASSERT(la.window == geo_.window_of(layer) || geo_.window.empty(),
                "layer {}: attention window {} but the cache was sized for {}", layer, la.window,
                geo_.window_of(layer));
  const int64_t pos0 = pass_pos0_;
  const int64_t n = pass_n_;
  for (size_t i = first_unit_[layer]; i < plan_.units.size() && plan_.units[i].layer == layer; ++i) {
    const policy::Unit& u = plan_.units[i];
    if (u.is_static) {
      uint8_t* base = static_.get() + lay_.static_offset[layer];
      scatter_new_rows(base, lay_.static_pitch, u, pos0, n);
      attend_unit(base, lay_.static_pitch, u, pos0, n, q, n_head, la, o);
      continue;
    }
    const uint64_t visit = next_visit_++;
    const bool ready = !inflight_.empty() && inflight_.front().visit == visit &&
                       inflight_.front().epoch == epoch_ && inflight_.front().unit.layer == u.layer &&
                       inflight_.front().unit.head0 == u.head0 &&
                       inflight_.front().unit.n_heads == u.n_heads && inflight_.front().rows == pos0 &&
                       inflight_.front().first == std::min(first_row(u.layer, pos0), pos0);
    if (ready) {
      engine_->wait(inflight_.front().ticket);
      inflight_.erase(inflight_.begin());
    } else {
      // Not prefetched (first visit, after a truncation or a layout change): load now.
      engine_->drain();
      inflight_.clear();
      submit_load(visit, i, pos0);
      if (pos0 > 0) ++sync_loads_;
      engine_->wait(inflight_.front().ticket);
      inflight_.clear();
    }
    // The load has completed and FIFO order completed every earlier job on this buffer: nothing in
    // flight may still read or write it when the compute writes into it.
    KVTIER_ASSERT(staging_->pins(buffer_slot(visit)) == 0, "staging buffer {} is pinned by a transfer",
                  buffer_slot(visit));
    uint8_t* base = buffer(visit);
    scatter_new_rows(base, layout_.pitch, u, pos0, n);
    // Write back only the new rows (page-aligned around them for direct I/O; the bytes before the
    // first new row in its page are the loaded rows, those after the last are never read as valid).
    size_t n_blocks = 0;
    for (uint32_t h = 0; h < u.n_heads; ++h) {
      for (int kv = 0; kv < 2; ++kv) {
        add_rows(layer, u.head0 + h, kv, base + (2ull * h + kv) * layout_.pitch, pos0, pos0 + n, n_blocks);
      }
    }
    engine_->prepare(CopyDir::kStore, std::span(copies_.data(), n_blocks),
                     {staging_.get(), buffer_slot(visit)});
    prefetch_ahead(visit);
    attend_unit(base, layout_.pitch, u, pos0, n, q, n_head, la, o);
  }
}

void TieredKv::end_pass() {
  pass_.end();
  length_ = pass_pos0_ + pass_n_;
}

void TieredKv::abort_pass() {
  if (!pass_.open()) return;
  pass_.abort();
  // Rows of the aborted pass may have reached the home tier; they lie past length_ and are rewritten
  // by the next pass. Loads prefetched for it are void.
  engine_->drain();
  inflight_.clear();
  ++epoch_;
  pass_pos0_ = -1;
}

void TieredKv::truncate(SeqId seq, int64_t n_tokens) {
  pass_.check_truncate(seq, n_tokens, length_);
  for (uint32_t l = 0; l < geo_.n_layer(); ++l) {
    // A ring holds the latest home_rows positions (the rows from block (length - ring) on).
    const int64_t ring = lay_.home_rows[l];
    const int64_t bt = geo_.block_tokens;
    // Stores round up to whole pages, which may clobber a few rows past the oldest: a block of slack.
    const int64_t oldest = length_ - ring + bt;
    if (ring < capacity_ && n_tokens > 0 && first_row(l, n_tokens) < oldest) {
      fail(ErrorKind::kInvalidArgument,
           "cannot truncate to {} tokens: sliding retention already overwrote positions below {} of layer "
           "{}, which position {} attends; prefill again, or use a policy without +sliding",
           n_tokens, oldest, l, n_tokens);
    }
  }
  // Waits for every transfer in flight: their pins drop before rows are forgotten (a store of rows
  // being truncated lands first; prefetched loads of the old length are void after the epoch bump).
  engine_->drain();
  KVTIER_ASSERT(engine_->home_pins().pinned_blocks() == 0 && staging_->pinned_blocks() == 0,
                "KV blocks pinned after the transfers drained");
  inflight_.clear();
  ++epoch_;
  length_ = n_tokens;
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
  s.home = home_->describe();
  return s;
}

}  // namespace kvtier::kv
