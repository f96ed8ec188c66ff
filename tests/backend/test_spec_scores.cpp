// cpu::spec_scores (InfiniGen's estimated scores): every ISA path gives the scalar loop's bits, on
// ragged row counts (vector tails), group sizes past one sweep of accumulators, and values that make
// the max's corner cases (ties, signed zeros, infinities, NaN) matter.
#include "backend/cpu/spec_scores.h"

#include <gtest/gtest.h>

#include "core/half.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace kvtier::cpu {
namespace {

// The loop written out independently of spec_scores_ref (the contract: the f16 keys widened, f32 products
// and sums, columns ascending).
std::vector<float> direct(const std::vector<float>& q, int64_t G, int64_t K, const std::vector<uint16_t>& pk,
                          int64_t T, float scale) {
  std::vector<float> out(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    float best = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < G; ++j) {
      float dot = 0.0f;
      for (int64_t c = 0; c < K; ++c) {
        const float p = q[static_cast<size_t>(j * K + c)] * f16_to_f32(pk[static_cast<size_t>(t * K + c)]);
        dot = dot + p;
      }
      const float v = scale * dot;
      best = best < v ? v : best;
    }
    out[static_cast<size_t>(t)] = best;
  }
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(SpecScores, EveryIsaGivesTheScalarBits) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> small(-2, 2);
  for (int64_t G : {1, 3, 4, 5, 9}) {
    for (int64_t K : {1, 7, 8, 9, 16, 19, 38, 76}) {  // 19, 76: SmolLM2, Gemma-3 (r = 0.3)
      for (int64_t T : {1, 15, 16, 17, 31, 33, 100, 257}) {
        for (bool ties : {false, true}) {
          // pk exactly T x K halves (under ASan a read past the last row is caught).
          std::vector<float> q(static_cast<size_t>(G * K));
          std::vector<uint16_t> pk(static_cast<size_t>(T * K));
          for (float& x : q) x = ties ? static_cast<float>(small(rng)) : nd(rng);
          for (uint16_t& x : pk) x = f32_to_f16(ties ? static_cast<float>(small(rng)) : nd(rng));
          const float scale = ties ? 1.0f : 0.125f;
          const std::vector<float> want = direct(q, G, K, pk, T, scale);
          for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
            if (!isa_supported(isa)) continue;
            std::vector<float> got(static_cast<size_t>(T), 42.0f);
            spec_scores_kernel(isa)(q.data(), G, K, pk.data(), T, scale, got.data());
            EXPECT_TRUE(same_bits(got, want)) << isa_name(isa) << " G " << G << " K " << K << " T " << T;
          }
        }
      }
    }
  }
}

TEST(SpecScores, SignedZerosInfinitiesAndNanAsTheScalarMax) {
  const int64_t G = 3, K = 2, T = 19;
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // Query heads: zero, one with an infinity, one plain; keys cycle through zeros of both signs, NaN,
  // infinities and plain values, so rows see -0 vs +0 maxima, inf - inf = NaN dots and NaN products.
  const std::vector<float> q = {0.0f, -0.0f, inf, 1.0f, -1.0f, 2.0f};
  const float vals[] = {0.0f, -0.0f, nan, inf, -inf, 1.5f, -2.0f};
  std::vector<uint16_t> pk(static_cast<size_t>(T * K));
  for (size_t i = 0; i < pk.size(); ++i) pk[i] = f32_to_f16(vals[(i * 3 + i / 7) % 7]);
  const std::vector<float> want = direct(q, G, K, pk, T, 1.0f);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    std::vector<float> got(static_cast<size_t>(T));
    spec_scores_kernel(isa)(q.data(), G, K, pk.data(), T, 1.0f, got.data());
    EXPECT_TRUE(same_bits(got, want)) << isa_name(isa);
  }
}

// The per-head kernel: each head's scaled dot in the same rounding, written with a row stride past T
// (the gap left as it was).
TEST(SpecHeadScores, EveryIsaGivesTheScalarBits) {
  std::mt19937 rng(12);
  std::normal_distribution<float> nd;
  for (int64_t G : {1, 3, 4, 5, 9}) {
    for (int64_t K : {1, 7, 8, 19, 76}) {
      for (int64_t T : {1, 15, 16, 17, 257}) {
        std::vector<float> q(static_cast<size_t>(G * K));
        std::vector<uint16_t> pk(static_cast<size_t>(T * K));
        for (float& x : q) x = nd(rng);
        for (uint16_t& x : pk) x = f32_to_f16(nd(rng));
        const int64_t ld = T + 3;
        std::vector<float> want(static_cast<size_t>(G * ld), 42.0f);
        for (int64_t j = 0; j < G; ++j)
          for (int64_t t = 0; t < T; ++t) {
            float dot = 0.0f;
            for (int64_t c = 0; c < K; ++c)
              dot = dot + q[static_cast<size_t>(j * K + c)] * f16_to_f32(pk[static_cast<size_t>(t * K + c)]);
            want[static_cast<size_t>(j * ld + t)] = 0.125f * dot;
          }
        for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
          if (!isa_supported(isa)) continue;
          std::vector<float> got(static_cast<size_t>(G * ld), 42.0f);
          spec_head_scores_kernel(isa)(q.data(), G, K, pk.data(), T, 0.125f, got.data(), ld);
          EXPECT_TRUE(same_bits(got, want)) << isa_name(isa) << " G " << G << " K " << K << " T " << T;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::cpu
