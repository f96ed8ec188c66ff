#include "locret/loss.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

namespace kvtier::locret {

template <typename T>
LayerLoss layer_loss(const T* P, const float* Y, int64_t n, int64_t hk, uint32_t n_layer,
                     const LossConfig& cfg, T* dP) {
  KVTIER_ASSERT(n > 0 && hk > 0 && n_layer > 0);
  const double reg_scale =
      1.0 / (static_cast<double>(n_layer) * static_cast<double>(hk) * static_cast<double>(n));
  const double smooth_scale = n > 1 ? 1.0 / (static_cast<double>(hk) * static_cast<double>(n - 1)) : 0.0;
  const double alpha =
      cfg.smooth == SmoothReduction::kSumLayers ? cfg.alpha : cfg.alpha / static_cast<double>(n_layer);
  LayerLoss out;
  double reg = 0.0, smooth = 0.0;
  for (int64_t j = 0; j < hk; ++j) {
    for (int64_t t = 0; t < n; ++t) {
      const double e = static_cast<double>(P[t * hk + j]) - static_cast<double>(Y[j * n + t]);
      const double ae = std::fabs(e);
      reg += ae < 1.0 ? 0.5 * e * e : ae - 0.5;
      if (dP != nullptr) dP[t * hk + j] = static_cast<T>(reg_scale * std::clamp(e, -1.0, 1.0));
    }
  }
  for (int64_t j = 0; j < hk && n > 1; ++j) {
    for (int64_t t = 0; t + 1 < n; ++t) {
      const double d = static_cast<double>(P[t * hk + j]) - static_cast<double>(P[(t + 1) * hk + j]);
      smooth += d * d;
      if (dP != nullptr) {
        const double c = alpha * 2.0 * smooth_scale * d;
        dP[t * hk + j] += static_cast<T>(c);
        dP[(t + 1) * hk + j] -= static_cast<T>(c);
      }
    }
  }
  out.reg = reg * reg_scale;
  out.smooth = smooth * smooth_scale;
  out.total = out.reg + alpha * out.smooth;
  return out;
}

template LayerLoss layer_loss<float>(const float*, const float*, int64_t, int64_t, uint32_t,
                                     const LossConfig&, float*);
template LayerLoss layer_loss<double>(const double*, const float*, int64_t, int64_t, uint32_t,
                                      const LossConfig&, double*);

namespace {

// Indices of the k largest values (stride apart), ties to the later index, ascending.
std::vector<int64_t> top_indices(const float* x, int64_t n, int64_t stride, int64_t k) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = i;
  auto better = [&](int64_t a, int64_t b) {
    const float va = x[a * stride], vb = x[b * stride];
    return va != vb ? va > vb : a > b;
  };
  std::nth_element(idx.begin(), idx.begin() + k, idx.end(), better);
  idx.resize(static_cast<size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

}  // namespace

Overlap topk_overlap(const float* P, const float* Y, int64_t n, int64_t hk, double frac) {
  Overlap o;
  const auto k = static_cast<int64_t>(std::floor(frac * static_cast<double>(n)));
  if (k <= 0) return o;
  for (int64_t j = 0; j < hk; ++j) {
    const auto a = top_indices(P + j, n, hk, k);
    const auto b = top_indices(Y + j * n, n, 1, k);
    std::vector<int64_t> both;
    std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
    o.hits += static_cast<int64_t>(both.size());
    o.total += k;
  }
  return o;
}

}  // namespace kvtier::locret
