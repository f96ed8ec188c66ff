// The interface between the model and KV placement: the model writes each layer's new K and V
// (after RoPE) and asks for attention of its queries; where the blocks live and how they reach the
// compute is the implementation's business (ResidentKv now; tiered policies later). The model never
// sees blocks, tiers or spans.
#pragma once

#include <cstdint>

#include "kv/geometry.h"

namespace kvtier::kv {

// Per-layer attention settings the model decides.
struct LayerAttention {
  float scale = 1.0f;    // multiplies q.k
  float softcap = 0.0f;  // > 0: tanh soft-capping of the scores
  int64_t window = 0;    // > 0: sliding window (key visible iff q_pos - k_pos < window)
};

class KvCache {
 public:
  virtual ~KvCache() = default;

  virtual const KvGeometry& geometry() const = 0;
  // Positions the cache can hold.
  virtual int64_t capacity() const = 0;
  // Positions [0, length) are stored in every layer.
  virtual int64_t length() const = 0;

  // Appends K and V of positions [pos0, pos0 + n) of `layer`; pos0 must equal the layer's length.
  //   k: [n, n_head_kv(layer), head_dim_k] f32    v: [n, n_head_kv(layer), head_dim_v] f32
  virtual void write(uint32_t layer, int64_t pos0, int64_t n, const float* k, const float* v) = 0;

  // Causal attention of queries at positions [pos0, pos0 + n) over the layer's stored keys (which
  // must include position pos0 + n - 1):
  //   q: [n, n_head, head_dim_k] f32    o: [n, n_head, head_dim_v] f32
  virtual void attend(uint32_t layer, int64_t pos0, int64_t n, const float* q, int64_t n_head,
                      const LayerAttention& la, float* o) = 0;

  // Forgets positions >= n_tokens in every layer (n_tokens <= length()).
  virtual void truncate(int64_t n_tokens) = 0;
};

}  // namespace kvtier::kv
