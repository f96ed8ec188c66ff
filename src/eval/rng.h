// The harness's own seeded random numbers (no std::rand, no distribution objects whose output
// differs between standard libraries): xoshiro256** seeded through SplitMix64. Every sample draws
// from a generator seeded by mix(seed, task, length, depth, index), so a cell's prompts do not
// depend on which other cells a run asks for.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace kvtier::eval {

// A seed derived from a base seed and a list of coordinates (order matters).
uint64_t mix_seed(uint64_t seed, std::initializer_list<uint64_t> coords);

class Rng {
 public:
  explicit Rng(uint64_t seed);

  uint64_t next();
  // Uniform in [0, n) without modulo bias; n > 0.
  uint64_t below(uint64_t n);
  // Uniform in [lo, hi] (inclusive).
  int64_t between(int64_t lo, int64_t hi);
  // Uniform in [0, 1) from the top 53 bits.
  double unit();

  template <typename T>
  const T& pick(std::span<const T> items) {
    return items[below(items.size())];
  }
  template <typename T>
  void shuffle(std::vector<T>& v) {  // Fisher-Yates
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }

 private:
  uint64_t s_[4];
};

// A number of `digits` decimal digits with a non-zero leading digit, as text.
std::string random_number(Rng& rng, int digits);

}  // namespace kvtier::eval
