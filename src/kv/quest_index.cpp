#include "kv/quest_index.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace kvtier::kv {

QuestIndex::QuestIndex(uint32_t n_seqs, std::vector<uint32_t> heads, int64_t capacity, int64_t page,
                       int64_t head_dim)
    : heads_(std::move(heads)), max_pages_((capacity + page - 1) / page), page_(page), dim_(head_dim) {
  KVTIER_ASSERT(page >= 1 && head_dim >= 1, "quest page {} head size {}", page, head_dim);
  for (uint32_t h : heads_) {
    layer_off_.push_back(per_seq_);
    per_seq_ += static_cast<size_t>(h) * static_cast<size_t>(max_pages_);
  }
  const size_t n = static_cast<size_t>(n_seqs) * per_seq_ * static_cast<size_t>(dim_);
  lo_.assign(n, std::numeric_limits<float>::infinity());
  hi_.assign(n, -std::numeric_limits<float>::infinity());
}

uint64_t QuestIndex::bytes(uint32_t n_seqs, std::span<const uint32_t> heads, int64_t capacity, int64_t page,
                           int64_t head_dim) {
  uint64_t cells = 0;
  for (uint32_t h : heads) cells += h;
  return uint64_t{n_seqs} * cells * static_cast<uint64_t>((capacity + page - 1) / page) *
         static_cast<uint64_t>(head_dim) * 2 * sizeof(float);
}

size_t QuestIndex::offset(uint32_t seq, uint32_t layer, uint32_t head, int64_t p) const {
  KVTIER_ASSERT(layer < heads_.size() && head < heads_[layer] && p < max_pages_, "quest page {} of layer {}",
                p, layer);
  return (seq * per_seq_ + layer_off_[layer] + static_cast<size_t>(head) * static_cast<size_t>(max_pages_) +
          static_cast<size_t>(p)) *
         static_cast<size_t>(dim_);
}

void QuestIndex::update(uint32_t seq, uint32_t layer, int64_t pos0, int64_t n, const float* k) {
  const uint32_t hk = heads_[layer];
  for (int64_t t = 0; t < n; ++t) {
    const int64_t p = (pos0 + t) / page_;
    for (uint32_t h = 0; h < hk; ++h) {
      const size_t o = offset(seq, layer, h, p);
      const float* row = k + (t * hk + h) * dim_;
      for (int64_t i = 0; i < dim_; ++i) {
        lo_[o + static_cast<size_t>(i)] = std::min(lo_[o + static_cast<size_t>(i)], row[i]);
        hi_[o + static_cast<size_t>(i)] = std::max(hi_[o + static_cast<size_t>(i)], row[i]);
      }
    }
  }
}

void QuestIndex::truncate(uint32_t seq, uint32_t layer, int64_t from) {
  for (uint32_t h = 0; h < heads_[layer]; ++h) {
    for (int64_t p = (from + page_ - 1) / page_; p < max_pages_; ++p) {
      const size_t o = offset(seq, layer, h, p);
      std::fill_n(lo_.begin() + static_cast<std::ptrdiff_t>(o), dim_, std::numeric_limits<float>::infinity());
      std::fill_n(hi_.begin() + static_cast<std::ptrdiff_t>(o), dim_,
                  -std::numeric_limits<float>::infinity());
    }
  }
}

std::span<const PosRange> QuestIndex::select(uint32_t seq, uint32_t layer, uint32_t head, const float* q,
                                             int64_t rows, int64_t end, int64_t budget,
                                             std::span<PosRange> out, std::span<int64_t> order,
                                             std::span<float> bound) const {
  const int64_t np = pages(end);
  KVTIER_ASSERT(static_cast<int64_t>(order.size()) >= np && static_cast<int64_t>(bound.size()) >= np &&
                    static_cast<int64_t>(out.size()) >= np,
                "quest scratch for {} pages", np);
  const int64_t want = std::min(np, std::max<int64_t>(1, budget / page_));
  for (int64_t p = 0; p < np; ++p) {
    const size_t o = offset(seq, layer, head, p);
    float best = -std::numeric_limits<float>::infinity();
    for (int64_t r = 0; r < rows; ++r) {
      const float* qr = q + r * dim_;
      float u = 0.0f;
      for (int64_t i = 0; i < dim_; ++i) {
        u += std::max(qr[i] * lo_[o + static_cast<size_t>(i)], qr[i] * hi_[o + static_cast<size_t>(i)]);
      }
      best = std::max(best, u);
    }
    bound[static_cast<size_t>(p)] = best;
    order[static_cast<size_t>(p)] = p;
  }
  // The last page (the newest positions) first, then by bound; ties keep the older page.
  std::swap(order[0], order[static_cast<size_t>(np - 1)]);
  std::stable_sort(order.begin() + 1, order.begin() + np, [&](int64_t a, int64_t b) {
    return bound[static_cast<size_t>(a)] > bound[static_cast<size_t>(b)] ||
           (bound[static_cast<size_t>(a)] == bound[static_cast<size_t>(b)] && a < b);
  });
  std::sort(order.begin(), order.begin() + want);
  size_t n = 0;
  for (int64_t i = 0; i < want; ++i) {
    const int64_t p = order[static_cast<size_t>(i)];
    const int64_t a = p * page_, b = std::min(end, (p + 1) * page_);
    if (n > 0 && out[n - 1].pos0 + out[n - 1].n == a) {
      out[n - 1].n += b - a;
    } else {
      out[n++] = {a, b - a};
    }
  }
  return out.first(n);
}

}  // namespace kvtier::kv
