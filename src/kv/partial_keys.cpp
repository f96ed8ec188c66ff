#include "kv/partial_keys.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/half.h"
#include "skew/skew_math.h"

namespace kvtier::kv {

namespace {
size_t count_units(const skew::SkewSet& s) {
  size_t u = 0;
  for (const auto& L : s.layers) u += L.n_head_kv;
  return u;
}
}  // namespace

void check_skew_geometry(const skew::SkewSet& skew, const KvGeometry& geo) {
  const uint32_t L = geo.n_layer();
  if (skew.layers.size() != L || skew.head_dim != geo.head_dim_k) {
    fail(ErrorKind::kInvalidArgument, "the skew file has {} layers of head size {}; the model {} of {}",
         skew.layers.size(), skew.head_dim, L, geo.head_dim_k);
  }
  for (uint32_t l = 0; l < L; ++l) {
    if (skew.layers[l].n_head_kv != geo.n_head_kv[l])
      fail(ErrorKind::kInvalidArgument, "the skew file's layer {} has {} KV heads, the model {}", l,
           skew.layers[l].n_head_kv, geo.n_head_kv[l]);
  }
}

uint64_t PartialKeys::bytes(const skew::SkewSet& skew, const PartialKeysShape& shape) {
  return uint64_t{shape.max_seqs} * count_units(skew) * static_cast<uint64_t>(shape.slots) *
         skew.partial_columns * sizeof(uint16_t);
}

PartialKeys::PartialKeys(const skew::SkewSet& skew, const PartialKeysShape& shape, MemoryLedger& ledger)
    : skew_(skew), shape_(shape), d_(skew.head_dim), k_(skew.partial_columns) {
  KVTIER_ASSERT(shape.slots >= 1 && shape.max_seqs >= 1 && shape.n_head >= 1 && !skew.layers.empty());
  units_per_seq_ = 0;
  for (const auto& L : skew.layers) {
    KVTIER_ASSERT(shape.n_head % L.n_head_kv == 0, "{} query heads over {} KV heads", shape.n_head,
                  L.n_head_kv);
    layer_unit0_.push_back(units_per_seq_);
    units_per_seq_ += L.n_head_kv;
  }
  reservation_ = Reservation(ledger, Tier::kDevice, Category::kKv, bytes(skew, shape));
  const size_t units = units_per_seq_ * shape.max_seqs;
  pk_.assign(units * static_cast<size_t>(shape.slots * k_), 0);
  b_.assign(units * static_cast<size_t>(d_ * k_), 0.0f);
  cols_.assign(units * static_cast<size_t>(k_), 0);
  score_.assign(units * static_cast<size_t>(d_), 0.0);
  observed_.assign(shape.max_seqs * skew.layers.size(), 0);
  rot_.resize(static_cast<size_t>(d_));
  row_.resize(static_cast<size_t>(k_));
}

size_t PartialKeys::unit(SeqId seq, uint32_t layer, uint32_t g) const {
  KVTIER_ASSERT(seq < shape_.max_seqs && layer < skew_.layers.size() && g < skew_.layers[layer].n_head_kv);
  return seq * units_per_seq_ + layer_unit0_[layer] + g;
}

void PartialKeys::observe(SeqId seq, uint32_t layer, const float* q, const float* k, int64_t n) {
  const skew::LayerSkew& L = skew_.layers[layer];
  const int64_t hk = L.n_head_kv;
  const int64_t G = shape_.n_head / hk;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t h = 0; h < shape_.n_head; ++h) {
      const auto g = static_cast<uint32_t>(h / G);
      skew::rotate_rows(q + (t * shape_.n_head + h) * d_, 1, d_, L.head_a(g, d_), rot_.data());
      skew::add_abs_column_sums(rot_.data(), 1, d_, &score_[unit(seq, layer, g) * static_cast<size_t>(d_)]);
    }
    for (int64_t g = 0; g < hk; ++g) {
      const auto gg = static_cast<uint32_t>(g);
      skew::rotate_rows(k + (t * hk + g) * d_, 1, d_, L.head_a(gg, d_), rot_.data());
      skew::add_abs_column_sums(rot_.data(), 1, d_, &score_[unit(seq, layer, gg) * static_cast<size_t>(d_)]);
    }
  }
  observed_[seq * skew_.layers.size() + layer] += n;
}

void PartialKeys::choose_columns(SeqId seq) {
  for (uint32_t l = 0; l < skew_.layers.size(); ++l) choose_layer_columns(seq, l);
}

void PartialKeys::choose_layer_columns(SeqId seq, uint32_t l) {
  const skew::LayerSkew& L = skew_.layers[l];
  int64_t& observed = observed_[seq * skew_.layers.size() + l];
  const bool offline = observed < shape_.min_prompt;
  observed = 0;
  for (uint32_t g = 0; g < L.n_head_kv; ++g) {
    const size_t u = unit(seq, l, g);
    double* score = &score_[u * static_cast<size_t>(d_)];
    std::vector<int32_t> cols;
    if (offline) {
      cols.assign(L.head_cols(g, k_), L.head_cols(g, k_) + k_);
    } else {
      cols = skew::top_columns({score, static_cast<size_t>(d_)}, k_);
    }
    std::fill(score, score + d_, 0.0);
    std::copy(cols.begin(), cols.end(), cols_.begin() + static_cast<ptrdiff_t>(u * static_cast<size_t>(k_)));
    const float* a = L.head_a(g, d_);
    float* b = &b_[u * static_cast<size_t>(d_ * k_)];
    for (int64_t i = 0; i < d_; ++i)
      for (int64_t c = 0; c < k_; ++c) b[i * k_ + c] = a[i * d_ + cols[static_cast<size_t>(c)]];
  }
}

void PartialKeys::write(SeqId seq, uint32_t layer, int64_t slot0, const float* k, int64_t n) {
  KVTIER_ASSERT(slot0 >= 0 && slot0 + n <= shape_.slots, "partial-key rows [{}, {}) of {} slots", slot0,
                slot0 + n, shape_.slots);
  const int64_t hk = skew_.layers[layer].n_head_kv;
  for (int64_t g = 0; g < hk; ++g) {
    for (int64_t t = 0; t < n; ++t)
      write_row(seq, layer, static_cast<uint32_t>(g), slot0 + t, k + (t * hk + g) * d_);
  }
}

void PartialKeys::write_row(SeqId seq, uint32_t layer, uint32_t g, int64_t slot, const float* k) {
  KVTIER_ASSERT(slot >= 0 && slot < shape_.slots, "partial-key row {} of {} slots", slot, shape_.slots);
  const size_t u = unit(seq, layer, g);
  const float* b = &b_[u * static_cast<size_t>(d_ * k_)];
  float* o = row_.data();
  std::fill(o, o + k_, 0.0f);
  for (int64_t i = 0; i < d_; ++i)
    for (int64_t c = 0; c < k_; ++c) o[c] += k[i] * b[i * k_ + c];
  uint16_t* dst =
      &pk_[(u * static_cast<size_t>(shape_.slots) + static_cast<size_t>(slot)) * static_cast<size_t>(k_)];
  for (int64_t c = 0; c < k_; ++c) dst[c] = f32_to_f16(o[c]);
}

const uint16_t* PartialKeys::rows(SeqId seq, uint32_t layer, uint32_t g) const {
  return &pk_[unit(seq, layer, g) * static_cast<size_t>(shape_.slots * k_)];
}

const float* PartialKeys::projection(SeqId seq, uint32_t layer, uint32_t g) const {
  return &b_[unit(seq, layer, g) * static_cast<size_t>(d_ * k_)];
}

std::span<const int32_t> PartialKeys::columns(SeqId seq, uint32_t layer, uint32_t g) const {
  return {&cols_[unit(seq, layer, g) * static_cast<size_t>(k_)], static_cast<size_t>(k_)};
}

void PartialKeys::reset(SeqId seq) {
  KVTIER_ASSERT(seq < shape_.max_seqs);
  std::fill(score_.begin() + static_cast<ptrdiff_t>(seq * units_per_seq_ * static_cast<size_t>(d_)),
            score_.begin() + static_cast<ptrdiff_t>((seq + 1) * units_per_seq_ * static_cast<size_t>(d_)),
            0.0);
  std::fill_n(observed_.begin() + static_cast<ptrdiff_t>(seq * skew_.layers.size()), skew_.layers.size(), 0);
}

}  // namespace kvtier::kv
