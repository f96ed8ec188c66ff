// The resident placement: every stored block lives in compute-local memory, in block pools (one per
// block size) shared by the cache's sequences and allocated up front. A block table maps each
// (sequence, layer, head group, logical block) to its pool slot and positions. Attention hands the
// stored blocks of each group, in position order, as spans to the backend's blocked attention.
// With sliding retention, a sliding-window layer frees the blocks no later query can see at the end
// of each pass (exact: those keys are masked for every later query), so its pool holds window + pass
// positions per sequence, not the whole context.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "backend/cpu/attention.h"
#include "core/thread_pool.h"
#include "kv/block_pool.h"
#include "kv/block_table.h"
#include "kv/footprint.h"
#include "kv/kv_cache.h"
#include "kv/kv_compute.h"
#include "kv/pass_state.h"
#include "kv/quest_index.h"
#include "kv/streaming_attend.h"

namespace kvtier::kv {

class ResidentKv final : public KvCache {
 public:
  // n_head: query heads (for scratch sizing). Throws Error(kBudget) if the pools do not fit.
  ResidentKv(const KvGeometry& geometry, int64_t capacity, uint32_t n_head, MemoryLedger& ledger,
             ThreadPool& pool, cpu::Isa isa, const KvOptions& options = {});

  const KvGeometry& geometry() const override { return geo_; }
  int64_t capacity() const override { return capacity_; }
  uint32_t max_sequences() const override { return table_.n_seqs(); }
  int64_t positions(SeqId seq) const override;
  uint32_t needs() const override;
  void set_compute(KvCompute* compute) override { compute_ = compute; }
  std::span<const PassPositions> begin_batch(std::span<const PassInfo> seqs) override;
  void write(uint32_t layer, const LayerRows& rows) override;
  void attend(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o) override;
  void end_pass() override;
  void abort_pass() override;
  void truncate(SeqId seq, int64_t n) override;

  // The spans of group `group` of `layer` of `seq` covering the stored positions below `end`, one per
  // block, in order. Writes into `out` (at least blocks_for(end) entries) and returns the filled part.
  std::span<const cpu::KvSpan> spans(SeqId seq, uint32_t layer, uint32_t group, int64_t end,
                                     std::span<cpu::KvSpan> out) const;
  int64_t blocks_for(int64_t n_tokens) const {
    return (n_tokens + geo_.block_tokens - 1) / geo_.block_tokens;
  }
  // Blocks in use now over all pools, and their bytes.
  uint64_t blocks_in_use() const;
  uint64_t kv_bytes_in_use() const;

 private:
  BlockPool& pool_of(uint32_t layer) { return *pools_[pool_index_[layer]]; }
  const BlockPool& pool_of(uint32_t layer) const { return *pools_[pool_index_[layer]]; }
  void free_blocks(SeqId seq, uint32_t layer, int64_t from, int64_t to);
  void write_seq(uint32_t layer, const LayerRows& rows, const SeqPass& sp);
  void attend_seq(uint32_t layer, const float* q, const float* q_pre, int64_t n_head,
                  const LayerAttention& la, float* o, const SeqPass& sp);
  // Does streaming retention (sinks + recent window) apply to the layer? (not to a layer with a
  // window of its own, which keeps it)
  bool streams(uint32_t layer) const;
  // Quest's decode step on a layer without a window of its own: each KV head attends its selected pages.
  bool attend_quest(uint32_t layer, const float* q, int64_t n_head, const cpu::AttnParams& ap, float* o,
                    const SeqPass& sp);
  // KIVI: quantises the key groups of `seq` that left the residual window now that it holds `end`
  // positions, and frees the f16 blocks that hold no unquantised position any more.
  void flush_kivi(SeqId seq, int64_t end);
  BlockPool& quant_pool_of(uint32_t layer) { return *pools_[quant_pool_index_[layer]]; }
  const BlockPool& quant_pool_of(uint32_t layer) const { return *pools_[quant_pool_index_[layer]]; }

  KvGeometry geo_;
  int64_t capacity_;
  KvOptions opt_;
  ThreadPool& threads_;
  cpu::Isa isa_;
  std::vector<std::unique_ptr<BlockPool>> pools_;  // one per distinct block size
  std::vector<uint32_t> pool_index_;               // [n_layer]
  Reservation meta_reservation_;                   // table_ and span_buf_
  BlockTable table_;
  cpu::KiviFormat kivi_;                    // bits 0: f16 / f32 rows only
  std::vector<uint32_t> quant_pool_index_;  // KIVI: [n_layer]
  BlockTable qtable_;                       // KIVI: the quantised blocks' slots (else empty)
  std::vector<int64_t> qend_;               // KIVI: [n_seqs] positions below are quantised
  std::vector<int64_t> positions_;          // [n_seqs] tokens each sequence holds
  std::vector<uint64_t> written_;           // [n_layer] serial of the last pass that wrote the layer
  std::vector<cpu::KvSpan> span_buf_;       // [max_blocks] spans of one attend call
  PassState pass_;
  Reservation scratch_reservation_;  // scratch_ and streaming_
  std::vector<uint8_t> scratch_;     // attention scratch, sized for the widest layer
  StreamingBuffers streaming_;       // retention streaming: the sink attention's buffers
  KvCompute* compute_ = nullptr;     // the model's hook (streaming re-rotates queries)
  const float* q_pre_ = nullptr;     // kNeedPreRope: the open layer's queries before RoPE
  // selection quest: page bounds and the scratch of one selection
  QuestIndex quest_;
  std::vector<PosRange> quest_ranges_;    // [pages] selected runs
  std::vector<int64_t> quest_order_;      // [pages]
  std::vector<float> quest_bound_;        // [pages]
  std::vector<cpu::KvSpan> quest_spans_;  // [pages + blocks] the runs cut at block boundaries
};

}  // namespace kvtier::kv
