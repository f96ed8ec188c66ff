// Locret's training objective for one layer (spec locret.md §3.3, the reference's exact reduction),
// its gradient with respect to the predictions, and the top-k overlap metric.
//
//   reg_l    = 1/(L h_kv T) sum_j sum_t SmoothL1(P[t][j] - Y[j][t])            (beta 1)
//   smooth_l = 1/(h_kv (T-1)) sum_j sum_{t<T-1} (P[t][j] - P[t+1][j])^2         (0 when T = 1)
//   loss     = sum_l (reg_l + alpha smooth_l)        [SmoothReduction::kSumLayers, the reference]
//            = sum_l (reg_l + alpha smooth_l / L)    [SmoothReduction::kMeanLayers]
//
// The layers' terms are independent, so a layer's gradient comes from its own terms alone.
#pragma once

#include <cstdint>

namespace kvtier::locret {

enum class SmoothReduction { kSumLayers, kMeanLayers };

struct LossConfig {
  double alpha = 0.0025;
  SmoothReduction smooth = SmoothReduction::kSumLayers;
};

struct LayerLoss {
  double reg = 0.0;     // reg_l (already divided by L)
  double smooth = 0.0;  // smooth_l (not multiplied by alpha)
  double total = 0.0;   // the layer's contribution to the loss
};

// P: [T, h_kv] predictions    Y: [h_kv, T] labels    dP (if not null): [T, h_kv], dLoss/dP
template <typename T>
LayerLoss layer_loss(const T* P, const float* Y, int64_t n, int64_t h_kv, uint32_t n_layer,
                     const LossConfig& cfg, T* dP);

// Sum over KV heads of |topK(P[., j]) n topK(Y[j, .])| with K = floor(frac T), and the sum of K
// (acc = overlap / total over any set of layers and samples). Ties go to the later position.
struct Overlap {
  int64_t hits = 0;
  int64_t total = 0;
};
Overlap topk_overlap(const float* P, const float* Y, int64_t n, int64_t h_kv, double frac = 0.1);

}  // namespace kvtier::locret
