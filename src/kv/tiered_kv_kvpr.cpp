// TieredKv's kvpr representation (KVPR, ../shared/specs/kvpr.md): the home tier keeps each position's
// K/V-projection input (KvGeometry::act_row_bytes, the activation row the projections quantise to)
// beside its K/V, in pages that share the K/V pages' indices. A unit visit loads the inputs of the
// first `split` visible positions and the K/V of the rest, recomputes the prefix's K/V of the unit's
// heads through the model hook into the staging planes, and attends as without kvpr. The hook gives
// the very bits the pass wrote, so the outputs are identical to resident's.
#include <algorithm>
#include <chrono>
#include <limits>

#include "core/align.h"
#include "core/error.h"
#include "kv/kv_row.h"
#include "kv/page_extents.h"
#include "kv/tiered_kv.h"
#include "policy/hybrid_plan.h"
#include "policy/kvpr_schedule.h"

namespace kvtier::kv {
int64_t TieredKv::split_rows(SeqId seq, const policy::Unit& u, int64_t first, int64_t rows,
                             int64_t qend) const {
  if (!kvpr() || hybrid()) return 0;  // hybrid: the ACT blocks, not a prefix
  // Rows past x_end have no stored inputs (kvpr auto stores none at l = 0); their K/V is always stored.
  // KIVI: the quantised rows only, in whole key groups (first is block-aligned, so a multiple of one).
  const int64_t top = kivi_.bits == 0 ? x_end(seq, u.layer) : std::min(x_end(seq, u.layer), qend);
  const int64_t g = kivi_.bits == 0 ? 1 : kivi_.key_group;
  const int64_t visible = std::clamp<int64_t>(top - first, 0, rows - first) / g * g;
  if (opt_.knobs.recompute >= 0) return std::min(opt_.knobs.recompute, visible) / g * g;  // forced
  if (opt_.knobs.recompute == policy::PolicyKnobs::kRecomputeRandom) {
    // Tests: a split in [0, visible] that changes from visit to visit (a hash of the visit's unit and
    // length, so that a run is reproducible).
    uint64_t h = (uint64_t{u.layer} << 40) ^ (uint64_t{u.head0} << 32) ^ static_cast<uint64_t>(rows);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return static_cast<int64_t>(h % static_cast<uint64_t>(visible + 1)) / g * g;
  }
  if (opt_.kvpr_link_bytes_per_s <= 0 || opt_.kvpr_tokens_per_s <= 0) return 0;  // not profiled
  // The scheduler (policy/kvpr_schedule.h) for this unit: its heads' share of the layer's projection,
  // its heads' K/V rows and the layer's input row over the link, in the prefetch pipeline.
  policy::KvprCosts c;
  c.x_bytes = static_cast<double>(geo_.act_row_bytes[u.layer]);
  c.kv_bytes = static_cast<double>(u.n_heads * (geo_.head_dim_k + geo_.head_dim_v) * esz_);
  c.recompute_flops = static_cast<double>(u.n_heads) / geo_.n_head_kv[u.layer];  // layer projections
  c.v_com_x = c.v_com_kv = opt_.kvpr_link_bytes_per_s;
  c.v_gpu = recompute_s_per_row_ > 0 ? 1.0 / recompute_s_per_row_ : opt_.kvpr_tokens_per_s;
  // W: measured between decode visits; before the first such measurement, the profiled decode weight
  // pass shared among the step's visits (policy::kvpr_hidden_estimate says why that is comparable).
  c.hidden_s = hidden_s_ > 0 ? hidden_s_ : hidden_seed_;
  if (kivi_.bits != 0) return kivi_split(c, u, first, rows, qend, visible);
  // (all the step's rows: K/V of those past the cap cross the link anyway)
  return policy::kvpr_visit_split(c, rows - first, visible);
}

int64_t TieredKv::kivi_split(const policy::KvprCosts& c, const policy::Unit& u, int64_t first, int64_t rows,
                             int64_t qend, int64_t visible) const {
  // A quantised row of the unit's heads costs its share of their quantised pages on the link; the f16
  // residual rows [qend, rows) cross it whatever the split.
  policy::KvprCosts cq = c;
  cq.kv_bytes = static_cast<double>(u.n_heads * lay_.qpage_bytes) / static_cast<double>(geo_.block_tokens);
  const double f16_s = static_cast<double>(rows - std::max(first, qend)) * c.kv_bytes / c.v_com_kv;
  return policy::kvpr_kivi_visit_split(cq, std::max<int64_t>(qend - first, 0), f16_s, visible,
                                       kivi_.key_group);
}

uint32_t TieredKv::xpage_of(SeqId seq, uint32_t layer, int64_t b) const {
  const BlockEntry& e = (kivi_.bits != 0 ? qpages_ : pages_).at(seq, layer, 0, b);
  KVTIER_ASSERT(e.slot != BlockTable::kNoSlot, "seq {} layer {} block {} has no page for its inputs", seq,
                layer, b);
  return e.slot;
}

void TieredKv::calibrate_recompute(const policy::Unit& u, int64_t rows, double seconds) {
  // Visits of a few rows say more about the weight pass than the per-row rate; the model counts that
  // pass as two rows (policy::kvpr_visit_split), so a measurement of r rows is r + 2 rows' worth.
  constexpr int64_t kMinRows = 8;
  if (rows < kMinRows || !(seconds > 0)) return;
  const double share = static_cast<double>(u.n_heads) / geo_.n_head_kv[u.layer];
  const double per_row = seconds / (static_cast<double>(rows + 2) * share);
  if (recompute_s_per_row_ == 0) {
    recompute_s_per_row_ = per_row;
  } else {
    recompute_s_per_row_ += 0.3 * (per_row - recompute_s_per_row_);
  }
}

uint64_t TieredKv::xpage_offset(uint32_t layer, uint32_t page) const {
  return lay_.home_offset[layer] + geo_.n_head_kv[layer] * lay_.head_region_bytes(layer) +
         uint64_t{page} * lay_.xpage_bytes;
}

void TieredKv::add_xrows(SeqId seq, uint32_t layer, uint8_t* xp, int64_t r0, int64_t r1, size_t& n) {
  const int64_t bt = geo_.block_tokens;
  const uint64_t xr = geo_.act_row_bytes[layer];
  const uint64_t a = home_->alignment();
  for (int64_t b = r0 / bt; r1 > r0 && b <= (r1 - 1) / bt; ++b) {
    const Extent x = block_rows_extent(r0, r1, b, bt, xr, a);
    add_copy(xpage_offset(layer, xpage_of(seq, layer, b)) + x.lo,
             xp + static_cast<uint64_t>(b) * lay_.xpage_bytes + x.lo, x.bytes(), n);
  }
}

void TieredKv::add_xcontext(SeqId seq, uint32_t layer, uint8_t* xp, int64_t pos, size_t& n) {
  const int64_t bt = geo_.block_tokens;
  const int64_t b = pos / bt;
  const uint64_t off = static_cast<uint64_t>(pos - b * bt) * geo_.act_row_bytes[layer];
  const uint64_t lo = round_down(off, home_->alignment());
  if (lo == off) return;  // the row starts a page: a store from it writes nothing before it
  add_copy(xpage_offset(layer, xpage_of(seq, layer, b)) + lo,
           xp + static_cast<uint64_t>(b) * lay_.xpage_bytes + lo, round_up(off, home_->alignment()) - lo, n);
}

double TieredKv::visit_clock() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void TieredKv::visit_started(double now) {
  if (prev_visit_start_ >= 0) {
    const double other = std::max(0.0, now - prev_visit_start_ - prev_blocked_s_);
    // A moving average; an interval far beyond it (a pause between requests) is left out.
    if (hidden_s_ == 0) {
      hidden_s_ = other;
    } else if (other < 10 * hidden_s_) {
      hidden_s_ += 0.2 * (other - hidden_s_);
    }
  }
  prev_visit_start_ = now;
  prev_blocked_s_ = 0;
}

void TieredKv::recompute_unit(uint8_t* base, const policy::Unit& u, int64_t r0, int64_t r1) {
  KVTIER_ASSERT(compute_ != nullptr, "kvpr needs the model's compute hook");
  const int64_t bt = geo_.block_tokens;
  const int64_t dk = geo_.head_dim_k, dv = geo_.head_dim_v;
  const uint64_t xr = geo_.act_row_bytes[u.layer];
  const uint8_t* xp = xplane(base);
  const int64_t step = std::min<int64_t>(lay_.recompute_rows, compute_->max_rows());
  for (int64_t p = r0; p < r1;) {
    const int64_t b = p / bt;
    const int64_t m = std::min({step, r1 - p, (b + 1) * bt - p});  // within one block's page
    for (int64_t t = 0; t < m; ++t) re_pos_[static_cast<size_t>(t)] = p + t;
    compute_->project_kv_encoded(
        u.layer, xp + static_cast<uint64_t>(b) * lay_.xpage_bytes + (p - b * bt) * xr,
        std::span(re_pos_.data(), static_cast<size_t>(m)), u.head0, u.n_heads, re_k_.data(), re_v_.data());
    for (int64_t t = 0; t < m; ++t) {
      for (uint32_t h = 0; h < u.n_heads; ++h) {
        store_kv_row(geo_.dtype, re_k_.data() + (t * u.n_heads + h) * dk, dk,
                     base + 2ull * h * layout_.pitch + static_cast<uint64_t>(p + t) * dk * esz_);
        store_kv_row(geo_.dtype, re_v_.data() + (t * u.n_heads + h) * dv, dv,
                     base + (2ull * h + 1) * layout_.pitch + static_cast<uint64_t>(p + t) * dv * esz_);
      }
    }
    p += m;
  }
  recomputed_rows_ += static_cast<uint64_t>(r1 - r0);
}

void TieredKv::recompute_rows(uint8_t* base, const policy::Unit& u, int64_t r0, int64_t r1) {
  if (r0 >= r1) return;
  recompute_unit(base, u, r0, r1);
  if (kivi_.bits == 0) return;
  KVTIER_ASSERT(r0 % kivi_.key_group == 0 && r1 % kivi_.key_group == 0,
                "recomputed rows {}..{} cut a key group", r0, r1);
  quantise_unit(base, u, r0, r1);
}

int64_t TieredKv::store_first_row(int64_t pos0) const {
  const uint64_t a = home_->alignment();
  const uint64_t rk = geo_.head_dim_k * esz_, rv = geo_.head_dim_v * esz_;
  const auto p = static_cast<uint64_t>(pos0);
  return static_cast<int64_t>(std::min(round_down(p * rk, a) / rk, round_down(p * rv, a) / rv));
}

void TieredKv::scatter_new_inputs(uint8_t* xp, uint32_t layer, int64_t pos0, int64_t n) {
  const int64_t bt = geo_.block_tokens;
  const uint64_t xr = geo_.act_row_bytes[layer];
  for (int64_t t = 0; t < n; ++t) {
    const int64_t pos = pos0 + t;
    const int64_t b = pos / bt;
    std::copy_n(new_x_.data() + static_cast<uint64_t>(pass_row0_ + t) * xr, xr,
                xp + static_cast<uint64_t>(b) * lay_.xpage_bytes + static_cast<uint64_t>(pos - b * bt) * xr);
  }
}

double TieredKv::hybrid_ratio() const {
  if (opt_.knobs.act_ratio >= 0) return opt_.knobs.act_ratio;                    // forced
  if (opt_.kvpr_link_bytes_per_s <= 0 || opt_.kvpr_tokens_per_s <= 0) return 0;  // not profiled: all KV
  // Algorithm 1 (policy/hybrid_plan.h) with this engine's rates, per layer and token (averaged over the
  // layers): recompute 1 / tokens_per_s; load a token's K/V or its inputs over the home link; T_w the
  // streamed weights' load time. No compute-local ACT pool, so the home is split for a context of
  // the capacity's blocks.
  const uint32_t n_layer = geo_.n_layer();
  const int64_t bt = geo_.block_tokens;
  double kv_row = 0, x_row = 0;
  for (uint32_t l = 0; l < n_layer; ++l) {
    kv_row += static_cast<double>(geo_.n_head_kv[l] * (geo_.head_dim_k + geo_.head_dim_v) * esz_);
    x_row += static_cast<double>(geo_.act_row_bytes[l]);
  }
  const policy::HostAllocInput in = policy::engine_alloc_input(
      kv_row, x_row, n_layer, bt, static_cast<double>(pages_.max_blocks() * pages_.n_seqs()),
      opt_.kvpr_link_bytes_per_s, opt_.kvpr_tokens_per_s, opt_.weight_load_s);
  return policy::host_block_allocation(in).ratio;
}

int64_t TieredKv::act_rows(int64_t r0, int64_t r1) const {
  const int64_t bt = geo_.block_tokens;
  int64_t n = 0;
  for (int64_t b = r0 / bt; r0 < r1 && b <= (r1 - 1) / bt; ++b)
    if (act_block(b)) n += std::min(r1, (b + 1) * bt) - std::max(r0, b * bt);
  return n;
}

void TieredKv::recompute_act(uint8_t* base, const policy::Unit& u, int64_t first, int64_t rows, int64_t lo,
                             int64_t hi) {
  const int64_t bt = geo_.block_tokens;
  const int64_t r0 = std::max(first, lo), r1 = std::min(rows, hi);
  for (int64_t b = r0 / bt; r0 < r1 && b <= (r1 - 1) / bt; ++b) {
    if (!act_block(b)) continue;
    const int64_t a = std::max(r0, b * bt), e = std::min(r1, (b + 1) * bt);
    if (a < e) recompute_unit(base, u, a, e);
  }
}

}  // namespace kvtier::kv

namespace kvtier::kv {

void TieredKv::plan_mini_batches() {
  const auto& seqs = pass_.seqs();
  seq_order_.resize(seqs.size());
  for (uint32_t b = 0; b < seqs.size(); ++b) seq_order_[b] = b;
  if (!hybrid() || seqs.size() < 2) return;
  // Algorithm 2 (policy::form_mini_batches) over the pass's sequences: their host KV and ACT blocks
  // (the past rows a visit loads; Eq. 11 fixed each block's type). The pass runs one weight load per
  // layer for all of them; within a layer the cache visits them mini-batch by mini-batch, so each
  // mini-batch's loads run while the previous one recomputes and attends (the zig-zag schedule).
  const int64_t bt = geo_.block_tokens;
  std::vector<policy::MbRequest> req(seqs.size());
  for (size_t b = 0; b < seqs.size(); ++b) {
    const int64_t pos0 = seqs[b].pos0;
    for (int64_t k = first_row(0, pos0) / bt; k < (pos0 + bt - 1) / bt; ++k) {
      if (act_block(k)) {
        ++req[b].act_host;
      } else {
        ++req[b].kv_host;
      }
    }
  }
  // K_max = A_max: the blocks of one layer the staging ring holds at once (its buffers, each a unit
  // of `group` KV heads over layout_.rows rows), in whole-layer blocks; at least one sequence's.
  uint32_t hk_max = 1;
  for (uint32_t l = 0; l < geo_.n_layer(); ++l) hk_max = std::max(hk_max, geo_.n_head_kv[l]);
  const int64_t cap = static_cast<int64_t>(lay_.n_buffers) * (layout_.rows / bt) *
                      std::max<uint32_t>(layout_.group, 1) / hk_max;
  policy::MbCosts c;
  c.block_tokens = bt;
  mb_balanced_ = opt_.kvpr_link_bytes_per_s > 0 && opt_.kvpr_tokens_per_s > 0;
  if (mb_balanced_) {  // the profiled rates, per token and layer, as hybrid_ratio() weighs them
    const uint32_t n_layer = geo_.n_layer();
    double kv_row = 0, x_row = 0;
    for (uint32_t l = 0; l < n_layer; ++l) {
      kv_row += static_cast<double>(geo_.n_head_kv[l] * (geo_.head_dim_k + geo_.head_dim_v) * esz_);
      x_row += static_cast<double>(geo_.act_row_bytes[l]);
    }
    c.t_w = opt_.weight_load_s;
    c.gen = {1.0 / opt_.kvpr_tokens_per_s, 0};
    c.load = {kv_row / n_layer / opt_.kvpr_link_bytes_per_s, 0};
    c.lact_slope = x_row / n_layer / opt_.kvpr_link_bytes_per_s;
  } else {  // no rates to balance with: capacity only (every fitting request is accepted)
    c.gen = {1, 0};
    c.load = {1, 0};
    c.tau = std::numeric_limits<double>::max();
  }
  const auto mbs = policy::form_mini_batches(req, cap, cap, c);
  size_t i = 0;
  bool reordered = false;
  for (const auto& mb : mbs) {
    for (const int64_t b : mb) {
      reordered |= static_cast<int64_t>(i) != b;
      seq_order_[i++] = static_cast<uint32_t>(b);
    }
  }
  mb_reordered_ += reordered ? 1 : 0;
  KVTIER_ASSERT(i == seqs.size(), "the mini-batches hold {} of {} sequences", i, seqs.size());
  ++mb_passes_;
  mb_formed_ += mbs.size();
  mb_last_ = static_cast<uint32_t>(mbs.size());
  mb_last_seqs_ = static_cast<uint32_t>(seqs.size());
}

}  // namespace kvtier::kv
