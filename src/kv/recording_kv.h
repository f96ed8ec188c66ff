// A KV cache that hands every pass's new rows and queries to an observer and otherwise forwards
// everything to the cache it wraps, unchanged (the forward pass computes the same bits as without it;
// extra_needs may ask the model for more rows, e.g. the layer inputs, which change nothing else).
// `kvtier skew` collects InfiniGen's samples through it: the keys of write() and the queries of
// attend() are both after RoPE (and QK-norm), the form the skewing matrices are computed from.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kv/kv_cache.h"

namespace kvtier::kv {

class KvObserver {
 public:
  virtual ~KvObserver() = default;
  // The pass's new rows of `layer` (n of them; rows.k: [n, n_head_kv(layer), head_dim_k] f32 after
  // RoPE; rows.x etc. as the needs asked).
  virtual void on_write(uint32_t layer, const LayerRows& rows, int64_t n) = 0;
  // The pass's queries of `layer`: q: [n, n_head, head_dim_k] f32 after RoPE.
  virtual void on_queries(uint32_t layer, const float* q, int64_t n, int64_t n_head) = 0;
};

class RecordingKv final : public KvCache {
 public:
  RecordingKv(KvCache& inner, KvObserver& observer, uint32_t extra_needs = kNeedNone)
      : inner_(inner), observer_(observer), extra_needs_(extra_needs) {}

  const KvGeometry& geometry() const override { return inner_.geometry(); }
  int64_t capacity() const override { return inner_.capacity(); }
  uint32_t max_sequences() const override { return inner_.max_sequences(); }
  int64_t positions(SeqId seq) const override { return inner_.positions(seq); }
  uint32_t needs() const override { return inner_.needs() | extra_needs_; }
  void set_compute(KvCompute* compute) override { inner_.set_compute(compute); }
  std::span<const PassPositions> begin_batch(std::span<const PassInfo> seqs) override;
  void write(uint32_t layer, const LayerRows& rows) override;
  void attend(uint32_t layer, const float* q, int64_t n_head, const LayerAttention& la, float* o) override;
  void end_pass() override { inner_.end_pass(); }
  void abort_pass() override { inner_.abort_pass(); }
  void truncate(SeqId seq, int64_t n) override { inner_.truncate(seq, n); }

 private:
  KvCache& inner_;
  KvObserver& observer_;
  uint32_t extra_needs_;
  int64_t pass_rows_ = 0;  // rows of the open pass (all its sequences)
};

}  // namespace kvtier::kv
