#include "runtime/argmax.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace kvtier::runtime {

namespace {

// Four lanes of GCC/Clang vector extensions: SSE2 on x86-64's baseline, NEON elsewhere.
using F4 = float __attribute__((vector_size(16)));
using I4 = int32_t __attribute__((vector_size(16)));

F4 load4(const float* p) {
  F4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

int64_t scalar_first_max(std::span<const float> x) {
  return std::max_element(x.begin(), x.end()) - x.begin();
}

}  // namespace

int64_t first_max_index(std::span<const float> x) {
  constexpr int kVecs = 4, kLanes = 4 * kVecs;  // 16 lanes: lane j sees elements j, j + 16, ...
  const auto n = static_cast<int64_t>(x.size());
  if (n < 2 * kLanes || n > std::numeric_limits<int32_t>::max()) return scalar_first_max(x);
  const float* p = x.data();
  // Per lane its largest element so far and the first index holding it (a later equal one does not
  // replace it: strictly greater only). NaN compares false, so it is tracked apart: std::max_element
  // answers NaN rows by its own rule, which the scalar pass then gives.
  F4 m[kVecs];
  I4 at[kVecs], cur[kVecs];
  I4 nan = {0, 0, 0, 0};
  for (int k = 0; k < kVecs; ++k) {
    m[k] = load4(p + 4 * k);
    at[k] = I4{0, 1, 2, 3} + 4 * k;
    cur[k] = at[k];
    nan |= m[k] != m[k];
  }
  int64_t i = kLanes;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kVecs; ++k) {
      const F4 v = load4(p + i + 4 * k);
      cur[k] += kLanes;
      const I4 gt = v > m[k];
      m[k] = gt ? v : m[k];
      at[k] = gt ? cur[k] : at[k];
      nan |= v != v;
    }
  }
  for (int j = 0; j < 4; ++j)
    if (nan[j] != 0) return scalar_first_max(x);
  // The lanes' maxima: the largest value, and on ties the smallest index (the first occurrence).
  float best = m[0][0];
  int64_t best_at = at[0][0];
  for (int k = 0; k < kVecs; ++k) {
    for (int j = 0; j < 4; ++j) {
      const float v = m[k][j];
      const int64_t a = at[k][j];
      if (v > best || (v == best && a < best_at)) best = v, best_at = a;
    }
  }
  for (; i < n; ++i) {  // the tail comes after every lane's elements: strictly greater only
    if (p[i] > best) best = p[i], best_at = i;
  }
  return best_at;
}

}  // namespace kvtier::runtime
