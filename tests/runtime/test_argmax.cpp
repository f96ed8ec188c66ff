// runtime::first_max_index against std::max_element, the rule it replaces: ties (the first wins),
// signed zeros, infinities, NaN anywhere, every length around the 16-lane blocks, and a vocabulary row.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "runtime/argmax.h"

namespace kvtier::runtime {
namespace {

int64_t reference(const std::vector<float>& x) {
  return std::max_element(x.begin(), x.end()) - x.begin();
}

// Values from a small set, so that ties are common, with ±0, ±inf and (sometimes) NaN.
std::vector<float> tied_row(std::mt19937& rng, size_t n, bool with_nan) {
  const float inf = std::numeric_limits<float>::infinity();
  const float pool[] = {0.0f, -0.0f, 1.0f, 2.0f, -1.0f, 3.0f, -inf, inf, 2.0f, 0.5f};
  std::vector<float> x(n);
  for (float& v : x) v = pool[rng() % 10];
  if (with_nan) x[rng() % n] = std::numeric_limits<float>::quiet_NaN();
  return x;
}

TEST(FirstMaxIndex, AgreesWithMaxElementOnTiesZerosInfinitiesAndNaN) {
  std::mt19937 rng(11);
  for (size_t n = 1; n <= 131; ++n) {
    for (int rep = 0; rep < 40; ++rep) {
      const auto x = tied_row(rng, n, rep % 4 == 3);
      ASSERT_EQ(first_max_index(x), reference(x)) << "n " << n << " rep " << rep;
    }
  }
}

// Every position of the maximum, in the blocks and the tail, once alone and once tied with a later copy.
TEST(FirstMaxIndex, FindsTheMaximumAtEveryPosition) {
  for (size_t n : {32, 33, 47, 48, 63, 100}) {
    for (size_t at = 0; at < n; ++at) {
      std::vector<float> x(n, -5.0f);
      x[at] = 7.0f;
      ASSERT_EQ(first_max_index(x), static_cast<int64_t>(at)) << n << " " << at;
      for (size_t later = at + 1; later < n; later += 5) {
        auto y = x;
        y[later] = 7.0f;
        ASSERT_EQ(first_max_index(y), static_cast<int64_t>(at)) << n << " " << at << " " << later;
      }
    }
  }
}

// A leading NaN is std::max_element's answer (nothing compares greater than it); a NaN elsewhere is
// never the answer.
TEST(FirstMaxIndex, GivesMaxElementsAnswerForNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x(64, 1.0f);
  x[40] = 9.0f;
  x[0] = nan;
  EXPECT_EQ(first_max_index(x), 0);
  x[0] = 1.0f;
  x[20] = nan;
  EXPECT_EQ(first_max_index(x), 40);
  x[40] = nan;
  EXPECT_EQ(first_max_index(x), reference(x));
}

TEST(FirstMaxIndex, AgreesOnVocabularySizedRows) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 3.0f);
  for (size_t n : {49152, 262144, 262145}) {
    std::vector<float> x(n);
    for (float& v : x) v = d(rng);
    EXPECT_EQ(first_max_index(x), reference(x)) << n;
    x[n - 1] = 1e9f;  // in the tail (n = 262145) or the last block
    EXPECT_EQ(first_max_index(x), static_cast<int64_t>(n - 1)) << n;
    x[n / 3] = 1e9f;  // a tie: the first wins
    EXPECT_EQ(first_max_index(x), static_cast<int64_t>(n / 3)) << n;
  }
}

}  // namespace
}  // namespace kvtier::runtime
