// The index of the first largest element of a row of logits: std::max_element's answer (a NaN row
// gives that answer too), in one pass over 16 lanes instead of one compare-and-branch per element.
// Greedy decoding calls it once per token over the vocabulary (262,144 logits on Gemma-3).
#pragma once

#include <cstdint>
#include <span>

namespace kvtier::runtime {

int64_t first_max_index(std::span<const float> x);

}  // namespace kvtier::runtime
