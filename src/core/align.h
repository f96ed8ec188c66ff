// Rounding of byte counts and offsets to an alignment (pages for direct I/O, cache lines).
#pragma once

#include <cstdint>

namespace kvtier {

// v rounded up / down to a multiple of a (a > 0; v + a - 1 must not overflow).
constexpr uint64_t round_up(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}
constexpr uint64_t round_down(uint64_t v, uint64_t a) {
  return v / a * a;
}

}  // namespace kvtier
