// RoPE angles of one position for one RoPE setting: for pair p,
//   theta = pos * scale * base^(-2p / n_rot) / factor[p]     (factor = 1 without rope_freqs)
// computed in double and rounded to f32 (the same values whatever the chunking).
#pragma once

#include <cstdint>

#include "model/config.h"

namespace kvtier::model {

// cos, sin: [n_rot / 2] f32
void rope_angles_ext(int64_t pos, const RopeTableConfig& t, int64_t n_rot, const float* freq_factors,
                     float* cos, float* sin);

}  // namespace kvtier::model
