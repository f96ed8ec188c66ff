#include "locret/capture_kv.h"

#include "core/error.h"

namespace kvtier::locret {

std::span<const kv::PassPositions> CaptureKv::begin_batch(std::span<const kv::PassInfo> seqs) {
  KVTIER_ASSERT(seqs.size() == 1, "the capture decorator takes passes of one sequence, not {}", seqs.size());
  const std::span<const kv::PassPositions> pp = inner_.begin_batch(seqs);
  pass_ = pp[0];
  rows_ = {};
  return pp;
}

void CaptureKv::write(uint32_t layer, const kv::LayerRows& rows) {
  KVTIER_ASSERT(rows.q_pre != nullptr && rows.k_pre != nullptr, "the model did not hand over pre-RoPE rows");
  inner_.write(layer, rows);
  rows_ = rows;
  rows_layer_ = layer;
}

void CaptureKv::attend(uint32_t layer, const float* q, int64_t n_head, const kv::LayerAttention& la,
                       float* o) {
  KVTIER_ASSERT(rows_.k != nullptr && rows_layer_ == layer, "attend of layer {} before its write", layer);
  inner_.attend(layer, q, n_head, la, o);
  LayerCapture c;
  c.layer = layer;
  c.pos0 = pass_.pos0;
  c.n = pass_.n;
  c.n_head = n_head;
  c.q = q;
  c.k = rows_.k;
  c.q_pre = rows_.q_pre;
  c.k_pre = rows_.k_pre;
  c.v = rows_.v;
  c.attention = la;
  observer_.on_layer(c);
  rows_ = {};
}

}  // namespace kvtier::locret
