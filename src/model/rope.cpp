#include "model/rope.h"

#include <cmath>

namespace kvtier::model {

void rope_angles_ext(int64_t pos, const RopeTableConfig& t, int64_t n_rot, const float* freq_factors,
                     float* cos, float* sin) {
  for (int64_t p = 0; p < n_rot / 2; ++p) {
    double inv_freq =
        std::pow(static_cast<double>(t.base), -2.0 * static_cast<double>(p) / static_cast<double>(n_rot));
    if (t.use_freq_factors && freq_factors != nullptr) inv_freq /= static_cast<double>(freq_factors[p]);
    const double angle = static_cast<double>(pos) * static_cast<double>(t.scale) * inv_freq;
    cos[p] = static_cast<float>(std::cos(angle));
    sin[p] = static_cast<float>(std::sin(angle));
  }
}

}  // namespace kvtier::model
