#include "locret/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace kvtier::locret {

double LinearSchedule::lr(int64_t step) const {
  if (step < warmup)
    return base_lr * static_cast<double>(step) / static_cast<double>(std::max<int64_t>(1, warmup));
  return base_lr * std::max(0.0, static_cast<double>(total - step) /
                                     static_cast<double>(std::max<int64_t>(1, total - warmup)));
}

template <typename T>
void clip_by_value(std::span<T> g, double clip) {
  KVTIER_ASSERT(clip > 0.0);
  const T c = static_cast<T>(clip);
  for (T& x : g) x = std::clamp(x, -c, c);
}

template <typename T>
void adamw_update(std::span<T> param, std::span<const T> grad, std::span<T> m, std::span<T> v, int64_t t,
                  double lr, const AdamWConfig& cfg) {
  KVTIER_ASSERT(t >= 1 && grad.size() == param.size() && m.size() == param.size() &&
                v.size() == param.size());
  const double bc1 = 1.0 - std::pow(cfg.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(cfg.beta2, static_cast<double>(t));
  const double step_size = lr / bc1;
  const double bc2_sqrt = std::sqrt(bc2);
  const double decay = 1.0 - lr * cfg.weight_decay;
  for (size_t i = 0; i < param.size(); ++i) {
    const double g = grad[i];
    const double mi = cfg.beta1 * m[i] + (1.0 - cfg.beta1) * g;
    const double vi = cfg.beta2 * v[i] + (1.0 - cfg.beta2) * g * g;
    m[i] = static_cast<T>(mi);
    v[i] = static_cast<T>(vi);
    const double p = static_cast<double>(param[i]) * decay;
    param[i] = static_cast<T>(p - step_size * mi / (std::sqrt(vi) / bc2_sqrt + cfg.eps));
  }
}

template void clip_by_value<float>(std::span<float>, double);
template void clip_by_value<double>(std::span<double>, double);
template void adamw_update<float>(std::span<float>, std::span<const float>, std::span<float>,
                                  std::span<float>, int64_t, double, const AdamWConfig&);
template void adamw_update<double>(std::span<double>, std::span<const double>, std::span<double>,
                                   std::span<double>, int64_t, double, const AdamWConfig&);

OptimizerState OptimizerState::zeros(const HeadShapes& shapes) {
  OptimizerState s;
  for (const LayerShape& l : shapes.layers) {
    LayerParams<float> z;
    z.fc1.assign(static_cast<size_t>(shapes.d_m * l.d_in()), 0.0f);
    z.fc2.assign(static_cast<size_t>(l.n_head_kv * shapes.d_m), 0.0f);
    s.m.push_back(z);
    s.v.push_back(std::move(z));
  }
  return s;
}

void optimizer_step_layer(LayerParams<float>& w, LayerParams<float>& grad, LayerParams<float>& m,
                          LayerParams<float>& v, int64_t step, const LinearSchedule& schedule, double clip,
                          const AdamWConfig& cfg) {
  const double lr = schedule.lr(step);
  clip_by_value<float>(grad.fc1, clip);
  clip_by_value<float>(grad.fc2, clip);
  adamw_update<float>(w.fc1, grad.fc1, m.fc1, v.fc1, step + 1, lr, cfg);
  adamw_update<float>(w.fc2, grad.fc2, m.fc2, v.fc2, step + 1, lr, cfg);
}

}  // namespace kvtier::locret
