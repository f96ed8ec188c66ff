// The scorer a scoring retention (Locret) asks for one importance score per new KV unit: declared
// here, implemented above `kv` (locret::HeadScorer over trained retaining heads; tests use their own),
// so that `kv` never depends on `locret`. Scores are computed once, when a unit is written, from the
// rows the forward pass hands a cache that asks for kNeedPreRope.
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_features.h"
#include "core/thread_pool.h"

namespace kvtier::kv {

class UnitScorer {
 public:
  virtual ~UnitScorer() = default;
  // Scores of n new tokens of `layer` at true positions pos0, pos0 + 1, ... (one per KV head):
  //   q_pre: [n, n_head, head_dim_k] f32    k_pre: [n, n_head_kv(layer), head_dim_k] f32
  //   v: [n, n_head_kv(layer), head_dim_v] f32    scores: [n, n_head_kv(layer)] f32
  virtual void score(ThreadPool& pool, cpu::Isa isa, uint32_t layer, int64_t pos0, const float* q_pre,
                     const float* k_pre, const float* v, int64_t n, float* scores) = 0;
};

}  // namespace kvtier::kv
