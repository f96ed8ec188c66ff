// Locret's retaining heads of a model (spec locret.md §3.1): f32 weights per layer and the scorer
// the inference path and the trainer both call. Scoring n new tokens of layer l takes exactly the
// rows the forward pass hands a KV cache that asks for kv::kNeedPreRope (q_pre, k_pre, v) and gives
// one predicted causal importance score per token and KV head.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "locret/head_math.h"
#include "locret/head_shape.h"

namespace kvtier::locret {

class RetainingHeads {
 public:
  RetainingHeads() = default;
  // Zero weights of the given shapes.
  explicit RetainingHeads(HeadShapes shapes);
  // Weights drawn from N(0, stddev^2) (spec §8.3: both layers, never zero), a pure function of
  // (seed, layer, tensor, element).
  static RetainingHeads random(HeadShapes shapes, uint64_t seed, float stddev = 0.02f);

  const HeadShapes& shapes() const { return shapes_; }
  uint32_t n_layer() const { return shapes_.n_layer(); }
  LayerParams<float>& layer(uint32_t l) { return layers_.at(l); }
  const LayerParams<float>& layer(uint32_t l) const { return layers_.at(l); }

  // Floats of scratch score() needs for n tokens of layer l.
  size_t scratch_floats(uint32_t l, int64_t n) const;
  // Scores of n tokens of layer l:
  //   q_pre: [n, n_head, dk] f32    k_pre: [n, n_head_kv, dk] f32    v: [n, n_head_kv, dv] f32
  //   scores: [n, n_head_kv] f32
  void score(const Compute& c, uint32_t l, const float* q_pre, const float* k_pre, const float* v, int64_t n,
             float* scores, std::span<float> scratch) const;

 private:
  HeadShapes shapes_;
  std::vector<LayerParams<float>> layers_;
};

// Element i of N(0, 1) noise for (seed, stream): a pure function (splitmix64 + Box-Muller).
double gaussian(uint64_t seed, uint64_t stream, uint64_t i);

}  // namespace kvtier::locret
