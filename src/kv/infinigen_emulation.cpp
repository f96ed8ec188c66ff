#include "kv/infinigen_emulation.h"

#include <algorithm>
#include <cstring>

#include "backend/cpu/attention.h"
#include "backend/cpu/spec_scores.h"
#include "core/error.h"
#include "kv/bounded_rows.h"
#include "kv/kv_compute.h"
#include "kv/kv_row.h"

namespace kvtier::kv {

InfinigenEmulationKv::InfinigenEmulationKv(KvCache& inner, const skew::SkewSet& skew,
                                           const InfinigenEmulationOptions& options, ThreadPool& pool)
    : inner_(inner), skew_(skew), opt_(options), pool_(pool), geo_(inner.geometry()) {
  policy::validate(opt_.params);
  if (opt_.emulate_from < 0)
    fail(ErrorKind::kInvalidArgument, "the emulation's first position must be >= 0, not {}",
         opt_.emulate_from);
  if (opt_.n_head < 1 || opt_.n_embd < 1)
    fail(ErrorKind::kInvalidArgument, "the emulation needs the model's query heads and width");
  const uint32_t L = geo_.n_layer();
  check_skew_geometry(skew_, geo_);
  for (uint32_t l = 0; l < L; ++l) {
    if (opt_.n_head % geo_.n_head_kv[l] != 0)
      fail(ErrorKind::kInvalidArgument, "{} query heads over {} KV heads", opt_.n_head, geo_.n_head_kv[l]);
  }
  esz_ = cpu::kv_dtype_bytes(geo_.dtype);
  PartialKeysShape ps;
  ps.n_head = opt_.n_head;
  ps.slots = inner_.capacity();
  ps.max_seqs = inner_.max_sequences();
  pk_ = std::make_unique<PartialKeys>(skew_, ps, ledger_);
  const size_t units = size_t{inner_.max_sequences()} * L;
  keys_.resize(units);
  values_.resize(units);
  chosen_.assign(units, 0);
  broken_.assign(inner_.max_sequences(), 0);
  const uint32_t hk = geo_.max_head_kv();
  qp_.resize(static_cast<size_t>(opt_.n_head * pk_->k_cols()));
  pk_rows_.resize(hk);
  k_f32_.resize(static_cast<size_t>(hk) * geo_.head_dim_k);
  scratch_.resize(geo_.attention_scratch_bytes(static_cast<uint32_t>(opt_.n_head), pool_.size()));
}

void InfinigenEmulationKv::set_compute(KvCompute* compute) {
  compute_ = compute;
  inner_.set_compute(compute);
}

std::span<const PassPositions> InfinigenEmulationKv::begin_batch(std::span<const PassInfo> seqs) {
  if (seqs.size() != 1)
    fail(ErrorKind::kInvalidArgument, "the InfiniGen emulation runs one sequence per pass, not {}",
         seqs.size());
  if (seqs[0].seq < broken_.size() && broken_[seqs[0].seq]) {
    fail(ErrorKind::kInvalidArgument,
         "sequence {}: a failed pass had already fed the emulation's column choice; truncate it to 0 and run "
         "it again",
         seqs[0].seq);
  }
  const std::span<const PassPositions> pos = inner_.begin_batch(seqs);
  open_ = true;
  seq_ = seqs[0].seq;
  pass_ = pos[0];
  la_layer_[0] = la_layer_[1] = 0;
  const uint32_t L = geo_.n_layer();
  for (uint32_t l = 0; l < L; ++l) {
    if (!speculates(l)) continue;  // the dense layers' rows live in the inner cache only
    const auto row = static_cast<size_t>(geo_.n_head_kv[l]) * geo_.head_dim_k * esz_;
    const auto need = static_cast<size_t>(pass_.pos0 + pass_.n) * row;
    const size_t u = seq_ * L + l;
    if (keys_[u].size() < need) {
      keys_[u].resize(need);
      values_[u].resize(static_cast<size_t>(pass_.pos0 + pass_.n) * geo_.n_head_kv[l] * geo_.head_dim_v *
                        esz_);
    }
  }
  return pos;
}

int64_t InfinigenEmulationKv::first_emulated_row() const {
  const int64_t first = std::max<int64_t>(opt_.emulate_from, 1);
  return std::clamp<int64_t>(first - pass_.pos0, 0, pass_.n);
}

void InfinigenEmulationKv::write(uint32_t layer, const LayerRows& rows) {
  inner_.write(layer, rows);
  const int64_t hk = geo_.n_head_kv[layer];
  const int64_t dk = geo_.head_dim_k;
  const int64_t dv = geo_.head_dim_v;
  const size_t u = seq_ * geo_.n_layer() + layer;
  for (int64_t t = 0; t < pass_.n && speculates(layer); ++t) {
    for (int64_t g = 0; g < hk; ++g) {
      const int64_t row = pass_.position(t) * hk + g;
      store_kv_row(geo_.dtype, rows.k + (t * hk + g) * dk, dk, keys_[u].data() + row * dk * esz_);
      store_kv_row(geo_.dtype, rows.v + (t * hk + g) * dv, dv, values_[u].data() + row * dv * esz_);
    }
  }
  new_k_ = rows.k;
  const uint32_t next = layer + 1;
  if (next < geo_.n_layer() && speculates(next) && first_emulated_row() < pass_.n) {
    KVTIER_ASSERT(compute_ != nullptr && rows.x != nullptr,
                  "the emulation needs the model's hook and layer inputs");
    look_ahead(next, rows.x);
  }
}

// Layer `layer`'s queries of the emulated tokens from layer layer-1's normed input (spec §6.2).
void InfinigenEmulationKv::look_ahead(uint32_t layer, const float* x) {
  const int64_t first = first_emulated_row();
  const int64_t n = pass_.n - first;
  const int64_t width = opt_.n_head * geo_.head_dim_k;
  std::vector<float>& la_q = la_q_[layer % 2];  // write(l) runs before attend(l) reads layer l's
  la_q.resize(static_cast<size_t>(n * width));
  la_pos_.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) la_pos_[static_cast<size_t>(t)] = pass_.position(first + t);
  const int64_t step = compute_->max_rows();
  for (int64_t t = 0; t < n; t += step) {
    const int64_t m = std::min(step, n - t);
    compute_->project_q(layer, x + (first + t) * opt_.n_embd,
                        std::span<const int64_t>(la_pos_.data() + t, static_cast<size_t>(m)),
                        la_q.data() + t * width);
  }
  la_layer_[layer % 2] = layer;
}

void InfinigenEmulationKv::attend(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la,
                                  float* o) {
  inner_.attend(layer, q, n_head, la, o);
  if (!speculates(layer)) return;
  KVTIER_ASSERT(n_head == opt_.n_head, "{} query heads, the emulation was built for {}", n_head, opt_.n_head);
  const uint32_t L = geo_.n_layer();
  const size_t u = seq_ * L + layer;
  const int64_t first = first_emulated_row();
  const int64_t hk = geo_.n_head_kv[layer];
  const int64_t dk = geo_.head_dim_k;
  if (!chosen_[u]) {
    // The prompt's rows of this pass choose the columns (the decode path observes its prefill passes).
    const int64_t prompt = std::clamp<int64_t>(opt_.emulate_from - pass_.pos0, 0, pass_.n);
    if (prompt > 0) pk_->observe(seq_, layer, q, new_k_, prompt);
    if (first == pass_.n) return;
    pk_->choose_layer_columns(seq_, layer);
    chosen_[u] = 1;
    // The prompt's partial keys from its stored rows, as the decode path reads them from its home tier.
    const int64_t stored = std::min(opt_.emulate_from, pass_.pos0 + pass_.n);
    for (int64_t p = 0; p < stored; ++p) {
      for (int64_t g = 0; g < hk; ++g)
        load_kv_row(geo_.dtype, keys_[u].data() + (p * hk + g) * dk * esz_, dk, k_f32_.data() + g * dk);
      pk_->write(seq_, layer, p, k_f32_.data(), 1);
    }
  }
  // Later rows from the pass's keys as computed (a decode pass writes its own row so).
  const int64_t from = std::max<int64_t>(opt_.emulate_from - pass_.pos0, 0);
  if (from < pass_.n) pk_->write(seq_, layer, pass_.pos0 + from, new_k_ + from * hk * dk, pass_.n - from);
  if (first < pass_.n) attend_emulated(layer, q, n_head, la, o);
}

void InfinigenEmulationKv::attend_emulated(uint32_t layer, const float* q, int64_t n_head,
                                           const LayerAttention& la, float* o) {
  KVTIER_ASSERT(la_layer_[layer % 2] == layer, "the look-ahead of layer {} is missing", layer);
  const uint32_t L = geo_.n_layer();
  const size_t u = seq_ * L + layer;
  const int64_t first = first_emulated_row();
  const int64_t hk = geo_.n_head_kv[layer];
  const int64_t G = n_head / hk;
  const int64_t dk = geo_.head_dim_k;
  const int64_t dv = geo_.head_dim_v;
  const int64_t kc = pk_->k_cols();
  const cpu::AttnParams ap = layer_attn_params(geo_, layer, n_head, la);
  for (int64_t g = 0; g < hk; ++g)
    pk_rows_[static_cast<size_t>(g)] = pk_->rows(seq_, layer, static_cast<uint32_t>(g));
  for (int64_t t = first; t < pass_.n; ++t) {
    const int64_t pos = pass_.position(t);
    const float* qa = la_q_[layer % 2].data() + (t - first) * n_head * dk;
    for (int64_t h = 0; h < n_head; ++h)
      policy::partial_rows(qa + h * dk, 1, dk, pk_->projection(seq_, layer, static_cast<uint32_t>(h / G)), kc,
                           qp_.data() + h * kc);
    const int64_t T[1] = {pos};
    const int64_t cap[1] = {policy::speculation_cap(opt_.params.budget, pos)};
    policy::SpecInput in;
    in.n_seq = 1;
    in.n_head = n_head;
    in.n_head_kv = hk;
    in.k_cols = kc;
    in.scale = la.scale;
    in.qp = qp_.data();
    in.pk = std::span<const uint16_t* const>(pk_rows_.data(), static_cast<size_t>(hk));
    in.n_tokens = T;
    in.cap = cap;
    in.group_scores = cpu::spec_scores_kernel(opt_.isa);
    in.group = opt_.params.group;
    in.head_scores = cpu::spec_head_scores_kernel(opt_.isa);
    in.pool = &pool_;
    policy::speculate(in, opt_.params.alpha, r_);
    if (opt_.observer != nullptr) opt_.observer->on_speculation(seq_, layer, pos, pos, r_, 0, hk);
    const int64_t chosen = r_.chosen[0];
    ++stats_.queries;
    stats_.rows_total += static_cast<uint64_t>(pos * hk);
    stats_.rows_chosen += static_cast<uint64_t>(std::min(chosen, pos) * hk);
    if (chosen >= pos) continue;  // every row: the dense result stands
    // Compact planes: the chosen rows, then the token's own, at positions 0 .. chosen.
    const int64_t rows = chosen + 1;
    ck_.resize(static_cast<size_t>(hk * rows * dk) * esz_);
    cv_.resize(static_cast<size_t>(hk * rows * dv) * esz_);
    for (int64_t g = 0; g < hk; ++g) {
      const std::span<const int32_t> idx = r_.rows(0, g, hk);
      KVTIER_ASSERT(static_cast<int64_t>(idx.size()) == chosen);
      for (int64_t i = 0; i <= chosen; ++i) {
        const int64_t p = i < chosen ? idx[static_cast<size_t>(i)] : pos;
        std::memcpy(ck_.data() + ((g * rows + i) * dk) * esz_, keys_[u].data() + ((p * hk + g) * dk) * esz_,
                    static_cast<size_t>(dk) * esz_);
        std::memcpy(cv_.data() + ((g * rows + i) * dv) * esz_, values_[u].data() + ((p * hk + g) * dv) * esz_,
                    static_cast<size_t>(dv) * esz_);
      }
    }
    cpu::KvSpan span;
    span.pos0 = 0;
    span.n_tokens = rows;
    span.k = ck_.data();
    span.v = cv_.data();
    span.k_head_stride = rows * dk;
    span.v_head_stride = rows * dv;
    const cpu::AttnQueries aq{q + t * n_head * dk, n_head * dk, 1, n_head, chosen};
    const cpu::AttnOutput out{o + t * n_head * dv, n_head * dv, nullptr, 0};
    cpu::attend(pool_, opt_.isa, ap, aq, std::span(&span, 1), out, scratch_);
  }
}

void InfinigenEmulationKv::end_pass() {
  inner_.end_pass();
  open_ = false;
}

void InfinigenEmulationKv::abort_pass() {
  inner_.abort_pass();
  if (open_) broken_[seq_] = 1;  // its column scores saw rows of a pass that did not happen
  open_ = false;
}

void InfinigenEmulationKv::truncate(SeqId seq, int64_t n) {
  if (n != 0 && n < inner_.positions(seq)) {
    fail(ErrorKind::kInvalidArgument,
         "the InfiniGen emulation cannot shorten sequence {} to {} tokens (its columns saw the rest); "
         "truncate "
         "it to 0",
         seq, n);
  }
  inner_.truncate(seq, n);
  if (n == 0) {
    broken_[seq] = 0;
    for (uint32_t l = 0; l < geo_.n_layer(); ++l) chosen_[seq * geo_.n_layer() + l] = 0;
    pk_->reset(seq);
  }
}

}  // namespace kvtier::kv
