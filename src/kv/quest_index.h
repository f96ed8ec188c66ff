// Quest (selection `quest`): query-aware choice of the KV pages a decode step attends. Each page of
// --quest-page positions of a (sequence, layer, KV head) keeps the per-channel minimum and maximum of
// its keys; for a query q the largest q.k any key of the page can reach is bounded by
//   U(page) = sum_i max(q_i * min_i, q_i * max_i),
// and a step attends only the pages with the largest bounds, --kv-budget positions in all (the
// page holding the newest position always among them). With GQA a KV head's pages are ranked by the
// largest bound over its query heads (the heads that share those keys).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kvtier::kv {

// A run of consecutive selected positions [pos0, pos0 + n).
struct PosRange {
  int64_t pos0 = 0;
  int64_t n = 0;
};

class QuestIndex {
 public:
  QuestIndex() = default;
  // Bounds for n_seqs x layers x (KV heads of each layer) x pages of `page` positions, up to capacity.
  QuestIndex(uint32_t n_seqs, std::vector<uint32_t> heads, int64_t capacity, int64_t page, int64_t head_dim);
  static uint64_t bytes(uint32_t n_seqs, std::span<const uint32_t> heads, int64_t capacity, int64_t page,
                        int64_t head_dim);

  int64_t page() const { return page_; }
  // Folds the keys of positions [pos0, pos0 + n) of (seq, layer) into their pages' bounds:
  //   k: [n, heads(layer), head_dim] f32 (as stored: the bounds hold the keys' stored values)
  void update(uint32_t seq, uint32_t layer, int64_t pos0, int64_t n, const float* k);
  // Forgets the pages from position `from` on (truncation); a page cut in two keeps a loose bound.
  void truncate(uint32_t seq, uint32_t layer, int64_t from);
  // The pages that the query rows attend among positions [0, end): the `budget / page` (at least one)
  // best-bounded pages, the last page always included, as ascending runs written to `out` (at least
  // pages(end) entries); returns the filled part. q: [rows, head_dim] f32 (the query heads of KV head
  // `head`). `order` is scratch of at least pages(end) entries.
  std::span<const PosRange> select(uint32_t seq, uint32_t layer, uint32_t head, const float* q, int64_t rows,
                                   int64_t end, int64_t budget, std::span<PosRange> out,
                                   std::span<int64_t> order, std::span<float> bound) const;
  int64_t pages(int64_t positions) const { return (positions + page_ - 1) / page_; }

 private:
  size_t offset(uint32_t seq, uint32_t layer, uint32_t head, int64_t p) const;
  std::vector<uint32_t> heads_;    // [n_layer]
  std::vector<size_t> layer_off_;  // [n_layer] first entry of the layer within a sequence
  size_t per_seq_ = 0;
  int64_t max_pages_ = 0;
  int64_t page_ = 16;
  int64_t dim_ = 0;
  std::vector<float> lo_, hi_;  // [seq][layer][head][page][head_dim] f32 bounds (+inf / -inf when empty)
};

}  // namespace kvtier::kv
