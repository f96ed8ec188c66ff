#include "locret/retaining_head.h"

#include <cmath>

#include "core/error.h"

namespace kvtier::locret {
namespace {

uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// (0, 1]: 53 random bits.
double unit(uint64_t bits) {
  return (static_cast<double>(bits >> 11) + 1.0) * (1.0 / 9007199254740992.0);
}

}  // namespace

double gaussian(uint64_t seed, uint64_t stream, uint64_t i) {
  const uint64_t key = mix64(mix64(seed) ^ mix64(stream + 0x632be59bd9b4e019ull));
  const double u1 = unit(mix64(key ^ (2 * i)));
  const double u2 = unit(mix64(key ^ (2 * i + 1)));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

RetainingHeads::RetainingHeads(HeadShapes shapes) : shapes_(std::move(shapes)) {
  for (const LayerShape& s : shapes_.layers) {
    LayerParams<float> p;
    p.fc1.assign(static_cast<size_t>(shapes_.d_m * s.d_in()), 0.0f);
    p.fc2.assign(static_cast<size_t>(s.n_head_kv * shapes_.d_m), 0.0f);
    layers_.push_back(std::move(p));
  }
}

RetainingHeads RetainingHeads::random(HeadShapes shapes, uint64_t seed, float stddev) {
  RetainingHeads h(std::move(shapes));
  for (uint32_t l = 0; l < h.n_layer(); ++l) {
    auto& p = h.layers_[l];
    for (size_t i = 0; i < p.fc1.size(); ++i)
      p.fc1[i] = static_cast<float>(stddev * gaussian(seed, 2 * l, i));
    for (size_t i = 0; i < p.fc2.size(); ++i)
      p.fc2[i] = static_cast<float>(stddev * gaussian(seed, 2 * l + 1, i));
  }
  return h;
}

size_t RetainingHeads::scratch_floats(uint32_t l, int64_t n) const {
  return static_cast<size_t>(n * (shapes_.layers.at(l).d_in() + shapes_.d_m));
}

void RetainingHeads::score(const Compute& c, uint32_t l, const float* q_pre, const float* k_pre,
                           const float* v, int64_t n, float* scores, std::span<float> scratch) const {
  KVTIER_ASSERT(l < n_layer(), "retaining head of layer {} of {}", l, n_layer());
  KVTIER_ASSERT(scratch.size() >= scratch_floats(l, n), "retaining-head scratch of {} floats for {} tokens",
                scratch.size(), n);
  const LayerShape& s = shapes_.layers[l];
  float* X = scratch.data();     // [n, d_in]
  float* za = X + n * s.d_in();  // [n, d_m]: Z, activated in place
  assemble_features(s, q_pre, k_pre, v, n, X);
  head_forward(c, s, shapes_.d_m, shapes_.act, layers_[l], X, n, za, za, scores);
}

}  // namespace kvtier::locret
