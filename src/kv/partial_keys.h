// InfiniGen's partial key cache (spec infinigen.md §5.1–5.2, §7.3, §15.2, §15.10), for RoPE models:
// per (sequence, layer, KV head) the rows PK[slot] = RoPE(k)·B of the stored keys, B = A[:, cols]
// (d x k_cols) with A from the model's skew file and cols chosen per sequence at the end of its
// prefill. Rows sit at the same slots as the keys they come from.
//
//   during prefill: observe(seq, l, q, k, n)   accumulates score[c] = sum |Q~[., c]| + sum |K~[., c]|
//   end of prefill: choose_columns(seq)        top k_cols columns per (layer, KV head), or the skew
//                                              file's offline set below min_prompt tokens (§15.2)
//                   write(seq, l, slot0, k, n) the prompt's rows (from the stored keys)
//   each decode:    write(seq, l, slot, k, 1)  the new token's row
//   speculation:    rows(seq, l, g)            [slots, k_cols] f16, for policy::speculate
//
// The rows are stored in IEEE half (the spec's layout, §10: PK ≈ r/2 of an f16 KV cache, C5), computed in
// f32 and rounded to nearest; speculation widens them exactly and accumulates in f32 (§6.2 [D]). Half the
// memory of f32 rows; the time of the speculation did not change with it (docs/benchmarks.md).
//
// Per-sequence column sets cost nothing extra here: a RoPE model's partial query is RoPE(q)·B from
// the full q (§6.2), so there is no partial weight to share across a batch.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/geometry.h"
#include "kv/kv_cache.h"
#include "kv/ledger.h"
#include "skew/skew_file.h"

namespace kvtier::kv {

struct PartialKeysShape {
  int64_t n_head = 0;  // query heads (the KV heads' groups: G = n_head / n_head_kv)
  int64_t slots = 0;   // rows per (sequence, layer, KV head)
  uint32_t max_seqs = 1;
  int64_t min_prompt = 64;  // below this many prompt tokens the offline columns are used
};

// Throws Error(kInvalidArgument) naming the mismatch unless the skew set has the geometry's layers, head
// size and KV heads per layer.
void check_skew_geometry(const skew::SkewSet& skew, const KvGeometry& geo);

class PartialKeys {
 public:
  // Reserves slots x k_cols x 2 bytes per (sequence, layer, KV head) as device KV in the ledger.
  PartialKeys(const skew::SkewSet& skew, const PartialKeysShape& shape, MemoryLedger& ledger);

  // Bytes it holds for these sizes (what the constructor reserves; planners predict with it).
  static uint64_t bytes(const skew::SkewSet& skew, const PartialKeysShape& shape);

  int64_t k_cols() const { return k_; }
  int64_t head_dim() const { return d_; }

  // Prefill rows of a layer: q: [n, n_head, d] f32 and k: [n, n_head_kv, d] f32, both after RoPE.
  void observe(SeqId seq, uint32_t layer, const float* q, const float* k, int64_t n);
  // Picks the sequence's columns per (layer, KV head) and resets its scores.
  void choose_columns(SeqId seq);
  // The same for one layer (the teacher-forced emulation chooses each layer's columns as its pass
  // reaches it).
  void choose_layer_columns(SeqId seq, uint32_t layer);
  // Rows of the keys k: [n, n_head_kv, d] f32 (after RoPE) at slots slot0 .. slot0 + n - 1.
  void write(SeqId seq, uint32_t layer, int64_t slot0, const float* k, int64_t n);
  // The row of one key k: [d] f32 (after RoPE) of KV head g at `slot` (the bounded pool: each head's new
  // token takes its own victim's slot).
  void write_row(SeqId seq, uint32_t layer, uint32_t g, int64_t slot, const float* k);
  // Partial keys of (seq, layer, KV head g): [slots, k_cols] f16 bits.
  const uint16_t* rows(SeqId seq, uint32_t layer, uint32_t g) const;
  // B of (seq, layer, g): [d, k_cols] f32 (partial query: RoPE(q)·B); cols: [k_cols] ascending.
  const float* projection(SeqId seq, uint32_t layer, uint32_t g) const;
  std::span<const int32_t> columns(SeqId seq, uint32_t layer, uint32_t g) const;
  // Forgets the sequence's columns and scores (its rows are overwritten by the next prefill).
  void reset(SeqId seq);

 private:
  size_t unit(SeqId seq, uint32_t layer, uint32_t g) const;

  const skew::SkewSet& skew_;
  PartialKeysShape shape_;
  int64_t d_ = 0;
  int64_t k_ = 0;
  std::vector<size_t> layer_unit0_;  // [n_layer] first unit of the layer within a sequence
  size_t units_per_seq_ = 0;
  Reservation reservation_;
  std::vector<uint16_t> pk_;       // [max_seqs, units, slots, k_cols] f16
  std::vector<float> b_;           // [max_seqs, units, d, k_cols] f32
  std::vector<int32_t> cols_;      // [max_seqs, units, k_cols]
  std::vector<double> score_;      // [max_seqs, units, d] column scores of the prefill so far
  std::vector<int64_t> observed_;  // [max_seqs] prompt tokens observed (layer 0)
  std::vector<float> rot_;         // scratch: [d] one rotated row
  std::vector<float> row_;         // scratch: [k_cols] one partial row in f32
};

}  // namespace kvtier::kv
