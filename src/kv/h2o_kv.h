// H2O (retention `h2o`, resident placement): each (sequence, layer, KV head) keeps at most --kv-budget
// rows: the most recent ones (--h2o-recent of the budget) and the "heavy hitters", the older rows that
// received the most attention so far (the sum, over every query and query head of the KV head, of the
// softmax probability they got). Rows are evicted per KV head after each pass (so chunked prefill holds
// budget + chunk rows at most); ties keep the older row.
//
// Storage: per (sequence, layer) an array of rows per KV head, in position order, compacted on
// eviction; every head holds the same number of rows (they differ in which positions). Attention
// hands the held rows as one span whose positions count back from the pass's first token, so the
// causal mask within the pass is the real one and every older row is visible; while nothing was
// evicted these are the real positions and the result is bit-identical to the resident placement.
// Layers with a sliding window of their own keep that window exactly (oldest rows dropped, never
// scored), since their memory is bounded already.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/attention.h"
#include "core/thread_pool.h"
#include "kv/bounded_rows.h"
#include "kv/footprint.h"
#include "kv/kv_cache.h"
#include "kv/ledger.h"
#include "kv/pass_state.h"

namespace kvtier::kv {

// Rows one (sequence, layer, KV head) holds at most: budget + pass on a global layer, window - 1 + pass
// on a sliding one, never more than the capacity.
int64_t h2o_rows(const KvGeometry& geo, uint32_t layer, int64_t capacity, const KvOptions& o);
// Compute-local bytes of an H2oKv: the rows, their positions and scores, the pass's score deltas
// (kv), and attention scratch plus the log-sum-exp rows (scratch).
BoundedLayout h2o_layout(const KvGeometry& geo, int64_t capacity, uint32_t n_head, int threads,
                         const KvOptions& o);

class H2oKv final : public KvCache {
 public:
  H2oKv(const KvGeometry& geometry, int64_t capacity, uint32_t n_head, MemoryLedger& ledger, ThreadPool& pool,
        cpu::Isa isa, const KvOptions& options);

  const KvGeometry& geometry() const override { return geo_; }
  int64_t capacity() const override { return capacity_; }
  uint32_t max_sequences() const override { return n_seqs_; }
  int64_t positions(SeqId seq) const override;
  std::span<const PassPositions> begin_batch(std::span<const PassInfo> seqs) override;
  void write(uint32_t layer, const LayerRows& rows) override;
  void attend(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o) override;
  void end_pass() override;
  void abort_pass() override;
  void truncate(SeqId seq, int64_t n) override;

  // Rows (sequence, layer) holds now (the same for each of its KV heads), and the position of row r of
  // KV head h (tests).
  int64_t rows(SeqId seq, uint32_t layer) const { return store(seq, layer).n; }
  int64_t position(SeqId seq, uint32_t layer, uint32_t head, int64_t r) const;
  // The accumulated score of row r of KV head h (tests).
  float score(SeqId seq, uint32_t layer, uint32_t head, int64_t r) const;

 private:
  struct Store {  // one (sequence, layer)
    Store(const KvGeometry& geo, uint32_t layer, int64_t cap)
        : rows(geo, layer, cap, false), delta(rows.pos.size()) {}
    BoundedRows rows;          // cap = h2o_rows(); score: accumulated attention
    int64_t n = 0;             // rows held by each KV head
    std::vector<float> delta;  // [n_head_kv][cap] this pass's attention (added at end_pass)
  };
  Store& store(SeqId seq, uint32_t layer) { return stores_[seq * geo_.n_layer() + layer]; }
  const Store& store(SeqId seq, uint32_t layer) const { return stores_[seq * geo_.n_layer() + layer]; }
  bool evicts(uint32_t layer) const { return geo_.window_of(layer) == 0; }
  void evict(Store& s, uint32_t layer, int64_t end);
  // One sequence of the open pass: its rows of the pass's buffers (rows sp.row0 ...).
  void write_seq(uint32_t layer, const LayerRows& all, const SeqPass& sp);
  void attend_seq(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o,
                  const SeqPass& sp);
  // Adds the pass's attention to the sequence's scores and evicts down to the budget.
  void end_seq(const SeqPass& sp);

  KvGeometry geo_;
  int64_t capacity_;
  uint32_t n_seqs_;
  KvOptions opt_;
  ThreadPool& threads_;
  cpu::Isa isa_;
  int64_t recent_ = 0;  // rows kept for the most recent positions (global layers)
  Reservation reservation_;
  Reservation scratch_reservation_;
  std::vector<Store> stores_;     // [n_seqs][n_layer]
  std::vector<int64_t> length_;   // [n_seqs] positions each sequence has seen
  std::vector<float> lse_;        // [max_new, n_head] f32: the pass's log-sum-exp per query head
  std::vector<uint8_t> scratch_;  // attention scratch
  std::vector<uint8_t> keep_;     // [max cap] rows kept by an eviction
  std::vector<int64_t> order_;    // [max cap] candidate rows by score
  PassState pass_;
};

}  // namespace kvtier::kv
