// SIMD float ops against the scalar reference on odd lengths.
//
// Bounds (u = 2^-24, first order):
// - add, mul, relu, rope: the same single operations per element (no FMA contraction anywhere), so
//   results are bit-identical.
// - rms_norm: the sum of squares has only non-negative terms; any summation order is within
//   (n + 4) u of the exact sum, so the two paths differ by at most 2 (n + 4) u relative; the
//   1/sqrt halves that and adds 3 roundings; two final products add 2 more:
//   |simd - ref| <= ((n + 4) + 8) u |ref|.
// - layer_norm: the mean differs by at most 2 (n + 4) u mean|x|; the variance's first-order
//   sensitivity to the mean is zero (sum (x - mean) = 0), so as rms_norm plus the mean shift:
//   |simd - ref| <= (n + 16) u (|ref| + mean|x| * scale * |w|).
// - silu, gelu, softmax: exp is a polynomial (see float_ops_avx2.cpp) within 4 ulp of std::exp;
//   silu adds a division and an add: 8 u |ref|. gelu computes tanh as 1 - 2 / (e^{2z} + 1), whose
//   absolute error is ~8 u (relative to 1): |simd - ref| <= 8 u |ref| + 8 u * 0.5 |x|.
//   softmax adds the sums (positive terms): (n + 16) u |ref|.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/float_ops.h"

namespace kvtier::cpu {
namespace {

constexpr double kU = 1.0 / (1 << 24);
const int64_t kSizes[] = {1, 7, 8, 9, 31, 64, 100, 577};

std::vector<Isa> simd_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

std::vector<float> random_vec(int64_t n, std::mt19937& rng, float scale = 3.0f) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

TEST(FloatOps, ElementwiseBitExact) {
  std::mt19937 rng(1);
  for (Isa isa : simd_isas()) {
    for (int64_t n : kSizes) {
      const auto a = random_vec(n, rng), b = random_vec(n, rng);
      std::vector<float> r(a.size()), s(a.size());
      add(Isa::kScalar, a.data(), b.data(), n, r.data());
      add(isa, a.data(), b.data(), n, s.data());
      EXPECT_EQ(r, s) << "add n=" << n;
      mul(Isa::kScalar, a.data(), b.data(), n, r.data());
      mul(isa, a.data(), b.data(), n, s.data());
      EXPECT_EQ(r, s) << "mul n=" << n;
      relu(Isa::kScalar, a.data(), n, r.data());
      relu(isa, a.data(), n, s.data());
      EXPECT_EQ(r, s) << "relu n=" << n;
    }
  }
}

TEST(FloatOps, RopeBitExactAndRotates) {
  std::mt19937 rng(2);
  const int64_t n_heads = 3, head_dim = 64;
  for (int64_t n_rot : {64, 32, 18}) {
    std::vector<float> c(static_cast<size_t>(n_rot / 2)), s(c.size());
    rope_angles(17, n_rot, 10000.0f, 1.0f, c.data(), s.data());
    for (RopeMode mode : {RopeMode::kNormal, RopeMode::kNeox}) {
      const auto x = random_vec(n_heads * head_dim, rng);
      auto ref = x;
      rope(Isa::kScalar, ref.data(), n_heads, head_dim, n_rot, c.data(), s.data(), mode);
      // Rotation preserves each pair's norm; dims past n_rot are untouched.
      for (int64_t h = 0; h < n_heads; ++h) {
        const float* a = x.data() + h * head_dim;
        const float* b = ref.data() + h * head_dim;
        for (int64_t p = 0; p < n_rot / 2; ++p) {
          const int64_t i0 = mode == RopeMode::kNeox ? p : 2 * p;
          const int64_t i1 = mode == RopeMode::kNeox ? p + n_rot / 2 : 2 * p + 1;
          EXPECT_NEAR(std::hypot(a[i0], a[i1]), std::hypot(b[i0], b[i1]),
                      1e-5 * (1 + std::hypot(a[i0], a[i1])));
        }
        for (int64_t i = n_rot; i < head_dim; ++i) EXPECT_EQ(a[i], b[i]);
      }
      for (Isa isa : simd_isas()) {
        auto got = x;
        rope(isa, got.data(), n_heads, head_dim, n_rot, c.data(), s.data(), mode);
        EXPECT_EQ(got, ref) << "n_rot=" << n_rot;
      }
    }
  }
}

TEST(FloatOps, NormsWithinBound) {
  std::mt19937 rng(3);
  for (Isa isa : simd_isas()) {
    for (int64_t n : kSizes) {
      const auto x = random_vec(n, rng), w = random_vec(n, rng, 1.0f), b = random_vec(n, rng, 1.0f);
      std::vector<float> r(x.size()), s(x.size());
      for (const float* wp : {static_cast<const float*>(nullptr), w.data()}) {
        rms_norm(Isa::kScalar, x.data(), wp, 1e-6f, n, r.data());
        rms_norm(isa, x.data(), wp, 1e-6f, n, s.data());
        for (int64_t i = 0; i < n; ++i)
          EXPECT_LE(std::fabs(r[i] - s[i]), (n + 12) * kU * std::fabs(r[i])) << n;
        layer_norm(Isa::kScalar, x.data(), wp, b.data(), 1e-5f, n, r.data());
        layer_norm(isa, x.data(), wp, b.data(), 1e-5f, n, s.data());
        double mean_abs = 0.0, mean = 0.0, var = 0.0;
        for (float v : x) mean_abs += std::fabs(v) / n, mean += v / static_cast<double>(n);
        for (float v : x) var += (v - mean) * (v - mean) / n;
        const double scale = 1.0 / std::sqrt(var + 1e-5);
        for (int64_t i = 0; i < n; ++i) {
          const double wi = wp ? std::fabs(w[i]) : 1.0;
          const double tol = (n + 16) * kU * (std::fabs(r[i]) + std::fabs(b[i]) + mean_abs * scale * wi);
          EXPECT_LE(std::fabs(r[i] - s[i]), tol) << "layer_norm n=" << n << " i=" << i;
        }
      }
    }
  }
}

TEST(FloatOps, ActivationsAndSoftmaxWithinBound) {
  std::mt19937 rng(4);
  for (Isa isa : simd_isas()) {
    for (int64_t n : kSizes) {
      const auto x = random_vec(n, rng, 4.0f);
      std::vector<float> r(x.size()), s(x.size());
      silu(Isa::kScalar, x.data(), n, r.data());
      silu(isa, x.data(), n, s.data());
      for (int64_t i = 0; i < n; ++i)
        EXPECT_LE(std::fabs(r[i] - s[i]), 8 * kU * std::fabs(r[i]) + 1e-30) << x[i];
      gelu_tanh(Isa::kScalar, x.data(), n, r.data());
      gelu_tanh(isa, x.data(), n, s.data());
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_LE(std::fabs(r[i] - s[i]), 8 * kU * (std::fabs(r[i]) + 0.5 * std::fabs(x[i]))) << x[i];
      }
      softmax(Isa::kScalar, x.data(), n, r.data());
      softmax(isa, x.data(), n, s.data());
      double total = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_LE(std::fabs(r[i] - s[i]), (n + 16) * kU * std::fabs(r[i])) << "softmax n=" << n;
        total += s[i];
      }
      EXPECT_NEAR(total, 1.0, 1e-5);
    }
  }
}

}  // namespace
}  // namespace kvtier::cpu
