// InfiniGen's teacher-forced emulation (spec infinigen.md §13, the paper's accuracy method): the
// tokens run in ordinary passes over a dense cache, and every query at a position >= emulate_from in
// a layer that speculates (>= 2, no window of its own) attends only the rows InfiniGen's decode path
// would have chosen for it, plus itself. A whole continuation (or a whole text) thus costs one pass
// instead of one decode step per token, and gives what the decode path gives:
//
//   columns       per (layer, KV head) from the prompt's rows (positions < emulate_from), chosen when the
//                 layer first meets an emulated query, or the skew file's offline set for a prompt under
//                 the partial key cache's minimum (emulate_from 0: always the offline set);
//   partial keys  RoPE(k)·B of the prompt's rows as stored (f16 widened, as the decode path reads them
//                 from its home tier) and of later rows as computed (f32, as a decode pass writes them);
//   look-ahead    layer l's queries of the token from layer l-1's normed input (the model's project_q),
//                 times B, against the partial keys of the positions before it: policy::speculate with
//                 the decode path's alpha, cap (floor(budget · position)) and group rule;
//   attention     the chosen rows then the token's own, as one span at positions 0 .. chosen (the decode
//                 path's compact planes); every row chosen: the dense result, as the decode path attends
//                 its whole buffer.
// With the same passes' inputs the decode path and the emulation choose the same rows (A6: held to
// >= 99 % of (layer, KV head, step) cases by tests/runtime/test_infinigen_emulation.cpp).
//
// One sequence per pass (Error(kInvalidArgument) otherwise); a sequence is shortened only to 0, and
// after a failed pass it must be (its columns' scores saw the failed pass's rows).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "core/thread_pool.h"
#include "kv/kv_cache.h"
#include "kv/ledger.h"
#include "kv/partial_keys.h"
#include "kv/speculation_observer.h"
#include "policy/infinigen_select.h"
#include "skew/skew_file.h"

namespace kvtier::kv {

struct InfinigenEmulationOptions {
  policy::InfinigenParams params;  // alpha, budget, group (the columns come from the skew file)
  int64_t emulate_from = 0;        // first position whose query is treated as a decode step
  int64_t n_head = 0;              // query heads
  int64_t n_embd = 0;              // width of LayerRows::x
  cpu::Isa isa = cpu::Isa::kScalar;
  SpeculationObserver* observer = nullptr;  // sees every emulated speculation (may be null)
};

struct InfinigenEmulationStats {
  uint64_t queries = 0;      // (layer, token) pairs that speculated
  uint64_t rows_total = 0;   // rows available to them, summed over KV heads
  uint64_t rows_chosen = 0;  // rows they attended (the token itself not counted)
};

class InfinigenEmulationKv final : public KvCache {
 public:
  // `inner` holds the rows and attends densely (a resident cache); `skew` must match its geometry.
  // Throws Error(kInvalidArgument) naming the mismatch or the bad value.
  InfinigenEmulationKv(KvCache& inner, const skew::SkewSet& skew, const InfinigenEmulationOptions& options,
                       ThreadPool& pool);

  const KvGeometry& geometry() const override { return inner_.geometry(); }
  int64_t capacity() const override { return inner_.capacity(); }
  uint32_t max_sequences() const override { return inner_.max_sequences(); }
  int64_t positions(SeqId seq) const override { return inner_.positions(seq); }
  uint32_t needs() const override { return inner_.needs() | kNeedLayerInput; }
  void set_compute(KvCompute* compute) override;
  std::span<const PassPositions> begin_batch(std::span<const PassInfo> seqs) override;
  void write(uint32_t layer, const LayerRows& rows) override;
  void attend(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o) override;
  void end_pass() override;
  void abort_pass() override;
  std::vector<int64_t> plan_prefill(SeqId seq, int64_t n, int64_t chunk) override {
    return inner_.plan_prefill(seq, n, chunk);
  }
  void truncate(SeqId seq, int64_t n) override;

  const InfinigenEmulationStats& stats() const { return stats_; }

 private:
  bool speculates(uint32_t layer) const { return layer >= 2 && geo_.window_of(layer) == 0; }
  // Rows of the pass from which queries are emulated (positions >= max(emulate_from, 1)).
  int64_t first_emulated_row() const;
  void look_ahead(uint32_t layer, const float* x);
  void attend_emulated(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o);

  KvCache& inner_;
  const skew::SkewSet& skew_;
  InfinigenEmulationOptions opt_;
  ThreadPool& pool_;
  const KvGeometry& geo_;
  KvCompute* compute_ = nullptr;
  size_t esz_ = 0;
  MemoryLedger ledger_;  // the partial keys' own (an evaluation aid, not a placement)
  std::unique_ptr<PartialKeys> pk_;
  // [seq * n_layer + l] each [positions, n_head_kv, d] dtype, the layers that speculate (else empty)
  std::vector<std::vector<uint8_t>> keys_, values_;
  std::vector<uint8_t> chosen_;  // [seq * n_layer + l] columns chosen
  std::vector<uint8_t> broken_;  // [seq] a pass failed: truncate to 0 first
  // The open pass.
  bool open_ = false;
  SeqId seq_ = 0;
  PassPositions pass_{};
  const float* new_k_ = nullptr;  // the pass's keys of the layer being run: [n, n_head_kv, d] f32
  // [layer % 2]: [n - first, n_head, d] the look-ahead queries of a layer (write(l) makes layer l+1's
  // before attend(l) reads layer l's), and the layer each belongs to (0: none)
  std::vector<float> la_q_[2];
  uint32_t la_layer_[2] = {0, 0};
  std::vector<int64_t> la_pos_;
  std::vector<float> qp_;  // [n_head, k_cols] one token's partial queries
  std::vector<const uint16_t*> pk_rows_;
  policy::SpecResult r_;
  std::vector<uint8_t> ck_, cv_;  // [n_head_kv, rows, d] compact planes of one token
  std::vector<float> k_f32_;      // [n_head_kv, d] one stored row widened
  std::vector<uint8_t> scratch_;
  InfinigenEmulationStats stats_;
};

}  // namespace kvtier::kv
