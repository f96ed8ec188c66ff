// Locret (retention `locret`, resident placement; spec locret.md §3.4): every new KV unit (token x KV
// head x layer) gets one score from a UnitScorer (the trained retaining heads) when it is written,
// kept beside the row and never recomputed. A prompt is prefilled in chunks (plan_prefill): its first
// n - n_loc tokens in chunks of the session's --chunk B, after each of which every (layer, KV head)
// keeps the --kv-budget b best-scored units (ties: the later position), the last n_s
// (--stabilizers) units always among them except after the final chunk; the last n_loc (--local-tail)
// prompt tokens and decoded tokens are appended without eviction.
//
// Positions are compact (spec §8.1): row i of every (layer, KV head) sits at position i and a pass's
// tokens continue from the rows held, so a 128K prompt never sees positions past b + B + n_loc + ...
// Keys are stored after RoPE at their row's position and (--locret-keys prerope, the default) pre-RoPE
// beside them; a row moved by an eviction is re-rotated to its new position from its pre-RoPE key
// (KvCompute::rope_k_rows), or (rerotate) its stored key is turned by the distance it moved. Nothing
// moves while nothing is evicted, so with --kv-budget >= the context every row is the bits the
// forward pass wrote at its true position and the result is bit-identical to `resident`.
// With --locret-positions original (spec §8.1's option) a pass's tokens take their true positions and
// every row keeps the one its key was rotated at: an eviction only drops rows, and attention is the
// full model's over the rows kept (the causal mask and a sliding window see the rows in order, the
// pass's own rows last).
//
// Memory: per (sequence, layer) b + n_loc + B rows per KV head. A pass outside the prefill plan
// (decoding, perplexity's passes, batched steps) that would overflow them first evicts down to b as
// after a non-final chunk (the spec's optional decode-time eviction, §8.10, only when memory runs
// out). Every layer holds the same number of rows; which positions differs per (layer, KV head).
// A layer with a sliding window of its own keeps its most recent rows (--locret-sliding recent, the
// default: contiguous, so its window sees what the model's would, at the true relative positions) or
// is scored like a global layer (scored: its window then applies over compact positions).
// --locret-sinks N protects the prompt's first N rows on every other layer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/cpu/attention.h"
#include "core/thread_pool.h"
#include "kv/bounded_rows.h"
#include "kv/footprint.h"
#include "kv/kv_cache.h"
#include "kv/kv_compute.h"
#include "kv/ledger.h"
#include "kv/pass_state.h"
#include "kv/unit_scorer.h"

namespace kvtier::kv {

// Rows one (sequence, layer, KV head) holds at most: b + n_loc + B, never more than the capacity.
int64_t locret_rows(int64_t capacity, const KvOptions& o);
// Whether the kept rows are renumbered compactly after an eviction (--locret-positions compact).
inline bool locret_compact(const KvOptions& o) {
  return o.knobs.locret_positions == policy::LocretPositions::kCompact;
}
// Whether locret keeps spans whole (--locret-span word|number): every row then keeps a link to the row
// before it (BoundedRows::link), and a pass needs its token ids and KvOptions::token_edges.
inline bool locret_spans(const KvOptions& o) {
  return o.knobs.locret_span != policy::LocretSpan::kToken;
}
// The links of a pass's n tokens (link[t] = 1: token t continues the span of the token before it,
// the one before the pass's first being `prev_edges`' token); returns the last token's edges. Throws
// Error(kInternal) for a pass without token ids and kInvalidArgument for an id outside the table.
uint8_t locret_pass_links(const KvOptions& o, std::span<const int32_t> tokens, int64_t n, uint8_t prev_edges,
                          uint8_t* link);
// Whether every row keeps a copy of its key before RoPE (--locret-keys prerope, compact positions:
// with original positions no key is ever turned).
inline bool locret_pre_rope(const KvOptions& o) {
  return locret_compact(o) && o.knobs.locret_keys == policy::LocretKeys::kPreRope;
}
// Compute-local bytes of a LocretKv: rows (K after RoPE, K before RoPE unless --locret-keys rerotate,
// V), positions and scores (kv);
// attention scratch, the pass's scores and the eviction's and re-rotation's work rows (scratch).
BoundedLayout locret_layout(const KvGeometry& geo, int64_t capacity, uint32_t n_head, int threads,
                            const KvOptions& o);
// The passes of a prompt of n tokens (spec §3.4): the first n - n_loc in chunks of min(chunk, max_new)
// (evicting), then the n_loc tail (appended). *evicting_tokens: n - n_loc (0 when that is empty).
std::vector<int64_t> locret_prefill_passes(int64_t n, int64_t chunk, int64_t max_new, int64_t local_tail,
                                           int64_t* evicting_tokens);
// The eviction decision of one (layer, KV head) holding rows [0, n) in position order: keep[r] = 1 for
// the `keep` rows with the largest key, where the key is +inf for the last n_protect rows
// (stabilizers) and for the first n_sink rows (--locret-sinks: the prompt's first tokens, which stay
// rows 0.. since they are never evicted), and otherwise the largest span score over the unprotected
// rows j within pool / 2 rows of r (pool 1: row r's own); ties go to the later row (the later
// position). A row's span score is its score, or with links (BoundedRows::link, null: none) the best
// score of the run of linked rows it is in (a word, a number: kept or evicted whole).
// span_best: work space of n entries when link is given; order: work space of n entries.
struct LocretMark {
  const float* score = nullptr;   // [n]
  const uint8_t* link = nullptr;  // [n] or null
  int64_t n = 0;
  int64_t keep = 0;
  int64_t n_protect = 0;
  int64_t n_sink = 0;
  int64_t pool = 1;
};
void locret_mark_keep(const LocretMark& m, std::span<float> span_best, std::span<int64_t> order,
                      std::span<uint8_t> keep_mask);
// The rows an eviction of `layer` to `keep` rows protects: the last n_protect (stabilizers) and the
// first --locret-sinks; on a layer with a sliding window of its own under --locret-sliding recent, the
// last `keep` (its most recent rows) and no sinks, which its window would hide anyway.
struct LocretProtected {
  int64_t last = 0;
  int64_t first = 0;
};
LocretProtected locret_protected(const KvGeometry& geo, const policy::PolicyKnobs& k, uint32_t layer,
                                 int64_t keep, int64_t n_protect);
// Host bytes locret keeps beside an offloaded placement's home tier (TieredKv): per (sequence, layer,
// KV head) locret_rows() scores (f32) and pre-RoPE keys (KV dtype; none with --locret-keys rerotate),
// the pass's scores and the eviction's work rows.
uint64_t locret_side_bytes(const KvGeometry& geo, int64_t capacity, const KvOptions& o);

class LocretKv final : public KvCache {
 public:
  // options.scorer scores the units (required).
  LocretKv(const KvGeometry& geometry, int64_t capacity, uint32_t n_head, MemoryLedger& ledger,
           ThreadPool& pool, cpu::Isa isa, const KvOptions& options);

  const KvGeometry& geometry() const override { return geo_; }
  int64_t capacity() const override { return capacity_; }
  uint32_t max_sequences() const override { return n_seqs_; }
  int64_t positions(SeqId seq) const override;
  uint32_t needs() const override { return kNeedPreRope; }
  void set_compute(KvCompute* compute) override { compute_ = compute; }
  std::vector<int64_t> plan_prefill(SeqId seq, int64_t n, int64_t chunk) override;
  std::span<const PassPositions> begin_batch(std::span<const PassInfo> seqs) override;
  void write(uint32_t layer, const LayerRows& rows) override;
  void attend(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o) override;
  void end_pass() override;
  void abort_pass() override;
  void truncate(SeqId seq, int64_t n) override;

  // Tests: rows the sequence holds (every layer and KV head the same), the true position and the
  // stored score of row r of (layer, KV head), and evictions so far.
  int64_t rows(SeqId seq) const { return held_[seq]; }
  int64_t position(SeqId seq, uint32_t layer, uint32_t head, int64_t r) const;
  float score(SeqId seq, uint32_t layer, uint32_t head, int64_t r) const;
  uint64_t evictions() const { return evictions_; }

 private:
  // One (sequence, layer): cap = locret_rows(), K after RoPE at the row's compact position and K
  // before RoPE beside it; score: the unit's score from its creation.
  using Store = BoundedRows;
  Store& store(SeqId seq, uint32_t layer) { return stores_[seq * geo_.n_layer() + layer]; }
  const Store& store(SeqId seq, uint32_t layer) const { return stores_[seq * geo_.n_layer() + layer]; }
  // Keeps the `keep` best rows of every (layer, KV head) of the sequence (n_protect last ones first).
  void evict_seq(SeqId seq, int64_t keep, int64_t n_protect);
  void evict_head(Store& s, uint32_t layer, int64_t h, int64_t n, int64_t keep, int64_t n_protect);
  void write_seq(uint32_t layer, const LayerRows& all, const SeqPass& sp);
  void attend_seq(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o,
                  const SeqPass& sp);

  KvGeometry geo_;
  int64_t capacity_;
  uint32_t n_seqs_;
  KvOptions opt_;
  ThreadPool& threads_;
  cpu::Isa isa_;
  int64_t n_head_;     // query heads (the q rows' width / head_dim_k)
  int64_t cap_;        // rows per (sequence, layer, KV head)
  int64_t n_protect_;  // n_s
  KvCompute* compute_ = nullptr;
  std::shared_ptr<UnitScorer> scorer_;
  Reservation reservation_;
  Reservation scratch_reservation_;
  std::vector<Store> stores_;            // [n_seqs][n_layer]
  std::vector<int64_t> length_;          // [n_seqs] tokens each sequence has seen
  std::vector<int64_t> held_;            // [n_seqs] rows each holds per (layer, KV head) = next position
  std::vector<int64_t> plan_end_;        // [n_seqs] true position where the evicting prefill ends (0: none)
  std::vector<int64_t> evicted_at_;      // [n_seqs] length when the sequence last evicted
  std::vector<float> pass_scores_;       // [max_new, max n_head_kv] f32: the pass's scores
  std::vector<uint8_t> scratch_;         // attention scratch
  std::vector<uint8_t> keep_;            // [cap] rows an eviction keeps
  std::vector<int64_t> order_;           // [cap] candidate rows
  std::vector<float> span_best_;         // [cap] the eviction's span scores (--locret-span word|number)
  std::vector<uint8_t> pass_link_;       // [max_new] the pass's links, in batch order (spans only)
  std::vector<uint8_t> last_edges_;      // [n_seqs] TokenEdge bits of each sequence's last token
  std::vector<uint8_t> pass_edges_;      // [n_seqs] those after the open pass
  std::vector<float> rot_in_, rot_out_;  // [max rows, head_dim_k] f32: keys being re-rotated (compact only)
  std::vector<int64_t> rot_pos_;         // [max rows] the angle's position: prerope the new row, rerotate
                                         // new row - old row
  std::vector<int64_t> rot_row_;         // [max rows] their new rows
  uint64_t evictions_ = 0;
  PassState pass_;
};

}  // namespace kvtier::kv
