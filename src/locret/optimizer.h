// The trainer's optimiser (spec locret.md §3.3): AdamW as torch.optim.AdamW computes it (decoupled
// weight decay, bias-corrected moments), gradient clipping by value, and HF's linear schedule with
// warmup. Order within a step: loss -> backward -> clip -> AdamW step (lr of this step) -> next step.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "locret/head_math.h"
#include "locret/head_shape.h"

namespace kvtier::locret {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

// HF get_linear_schedule_with_warmup; step s counts optimizer steps from 0:
//   lr(s) = base * s / warmup                                   for s < warmup
//   lr(s) = base * max(0, (total - s) / (total - warmup))       otherwise
// so the first update has lr 0.
struct LinearSchedule {
  double base_lr = 5e-4;
  int64_t warmup = 2000;
  int64_t total = 3000;
  double lr(int64_t step) const;
};

// Clamps every element to [-clip, clip] (clip > 0).
template <typename T>
void clip_by_value(std::span<T> g, double clip);

// One AdamW update of `param` with gradient `grad`; m and v are the moments, t >= 1 the 1-based step
// count (bias correction):
//   param *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   param -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
template <typename T>
void adamw_update(std::span<T> param, std::span<const T> grad, std::span<T> m, std::span<T> v, int64_t t,
                  double lr, const AdamWConfig& cfg);

// AdamW moments of every layer's head, shaped like its weights, and the steps taken.
struct OptimizerState {
  int64_t step = 0;
  std::vector<LayerParams<float>> m, v;
  static OptimizerState zeros(const HeadShapes& shapes);
};

// Clip, then AdamW update of one layer's head with its gradients, at optimizer step `step` (0-based;
// lr = schedule.lr(step), bias correction with t = step + 1). grad is clipped in place.
void optimizer_step_layer(LayerParams<float>& w, LayerParams<float>& grad, LayerParams<float>& m,
                          LayerParams<float>& v, int64_t step, const LinearSchedule& schedule, double clip,
                          const AdamWConfig& cfg);

}  // namespace kvtier::locret
