// A KV cache decorator that shows the trainer each layer's rows as the frozen backbone computes
// them: it asks the model for the pre-RoPE rows (kv::kNeedPreRope), passes every call on to the
// wrapped cache unchanged (so the backbone's arithmetic is the inference path's), and after a layer's
// attention calls the observer with the pass's pre-RoPE q, k, v (the retaining heads' input) and its
// post-RoPE q and k (the labels' input). No change to the forward pass is needed.
#pragma once

#include <cstdint>
#include <span>

#include "kv/kv_cache.h"

namespace kvtier::locret {

// One layer of one pass (n tokens at positions pos0 ..), valid during the observer call only:
struct LayerCapture {
  uint32_t layer = 0;
  int64_t pos0 = 0;
  int64_t n = 0;
  int64_t n_head = 0;
  const float* q = nullptr;      // [n, n_head, dk] f32, post-RoPE
  const float* k = nullptr;      // [n, n_head_kv, dk] f32, post-RoPE
  const float* q_pre = nullptr;  // [n, n_head, dk] f32
  const float* k_pre = nullptr;  // [n, n_head_kv, dk] f32
  const float* v = nullptr;      // [n, n_head_kv, dv] f32
  kv::LayerAttention attention;  // the layer's scale and soft-capping
};

class LayerObserver {
 public:
  virtual ~LayerObserver() = default;
  virtual void on_layer(const LayerCapture& c) = 0;
};

class CaptureKv final : public kv::KvCache {
 public:
  // Both must outlive the decorator.
  CaptureKv(kv::KvCache& inner, LayerObserver& observer) : inner_(inner), observer_(observer) {}

  const kv::KvGeometry& geometry() const override { return inner_.geometry(); }
  int64_t capacity() const override { return inner_.capacity(); }
  uint32_t max_sequences() const override { return inner_.max_sequences(); }
  int64_t positions(kv::SeqId seq) const override { return inner_.positions(seq); }
  uint32_t needs() const override { return inner_.needs() | kv::kNeedPreRope; }
  void set_compute(kv::KvCompute* compute) override { inner_.set_compute(compute); }
  // One sequence per pass (the trainer's).
  std::span<const kv::PassPositions> begin_batch(std::span<const kv::PassInfo> seqs) override;
  void write(uint32_t layer, const kv::LayerRows& rows) override;
  void attend(uint32_t layer, const float* q, int64_t n_head, const kv::LayerAttention& la,
              float* o) override;
  void end_pass() override { inner_.end_pass(); }
  void abort_pass() override { inner_.abort_pass(); }
  void truncate(kv::SeqId seq, int64_t n) override { inner_.truncate(seq, n); }

 private:
  kv::KvCache& inner_;
  LayerObserver& observer_;
  kv::PassPositions pass_;
  kv::LayerRows rows_;
  uint32_t rows_layer_ = 0;
};

}  // namespace kvtier::locret
