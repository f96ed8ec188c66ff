// InfiniGen's offline skewing math (spec infinigen.md §4, §5.1, §14 A1 and A3) on random data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/error.h"
#include "skew/skew_math.h"

namespace kvtier::skew {
namespace {

using Mat = std::vector<float>;  // row-major

// Rows with an anisotropic, rotated spectrum (a few strong directions, not aligned with the axes),
// like real queries after RoPE: rows = z · diag(scale) · R, R a random orthogonal matrix.
struct Source {
  int64_t d;
  Mat rot;                   // [d, d]
  std::vector<float> scale;  // [d]
  std::mt19937 rng;
  Source(int64_t d_, uint32_t seed) : d(d_), rng(seed) {
    std::normal_distribution<float> nd;
    Mat g(static_cast<size_t>(d * d));
    for (float& x : g) x = nd(rng);
    rot = skew_matrix(g, d, d).a;  // an orthogonal matrix from the SVD of a Gaussian one
    scale.resize(static_cast<size_t>(d));
    for (int64_t i = 0; i < d; ++i)
      scale[static_cast<size_t>(i)] = 8.0f * std::exp(-0.25f * static_cast<float>(i)) + 0.05f;
  }
  Mat rows(int64_t n) {
    std::normal_distribution<float> nd;
    Mat z(static_cast<size_t>(n * d));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < d; ++i)
        z[static_cast<size_t>(r * d + i)] = nd(rng) * scale[static_cast<size_t>(i)];
    Mat out(z.size());
    rotate_rows(z.data(), n, d, rot.data(), out.data());
    return out;
  }
};

// max |A B^T - C D^T| / max |A B^T| over rows of [n, d] matrices (dot products in f64).
double relative_score_error(const Mat& a, const Mat& b, const Mat& c, const Mat& dd, int64_t n, int64_t m,
                            int64_t d) {
  double worst = 0.0, top = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      double s0 = 0.0, s1 = 0.0;
      for (int64_t x = 0; x < d; ++x) {
        s0 += static_cast<double>(a[static_cast<size_t>(i * d + x)]) * b[static_cast<size_t>(j * d + x)];
        s1 += static_cast<double>(c[static_cast<size_t>(i * d + x)]) * dd[static_cast<size_t>(j * d + x)];
      }
      worst = std::max(worst, std::abs(s0 - s1));
      top = std::max(top, std::abs(s0));
    }
  }
  return worst / top;
}

Mat rotated(const Mat& x, int64_t n, int64_t d, const SkewMatrix& a) {
  Mat out(x.size());
  rotate_rows(x.data(), n, d, a.a.data(), out.data());
  return out;
}

TEST(SkewMath, PartialColumnsIsFloorOfRatioTimesHeadDim) {
  EXPECT_EQ(partial_columns(0.3, 128), 38);  // the spec's examples
  EXPECT_EQ(partial_columns(0.2, 128), 25);
  EXPECT_EQ(partial_columns(0.3, 64), 19);
  EXPECT_EQ(partial_columns(0.001, 64), 1);
  EXPECT_EQ(partial_columns(1.0, 64), 64);
  EXPECT_THROW(partial_columns(0.0, 64), Error);
  EXPECT_THROW(partial_columns(1.5, 64), Error);
}

TEST(SkewMath, SkewMatrixIsOrthogonalWithDescendingSingularValues) {
  Source src(64, 1);
  const Mat q = src.rows(500);
  const SkewMatrix a = skew_matrix(q, 500, 64);
  for (int64_t i = 0; i < 64; ++i) {
    for (int64_t j = 0; j < 64; ++j) {
      double s = 0.0;
      for (int64_t c = 0; c < 64; ++c)
        s += static_cast<double>(a.a[static_cast<size_t>(i * 64 + c)]) * a.a[static_cast<size_t>(j * 64 + c)];
      EXPECT_NEAR(s, i == j ? 1.0 : 0.0, 1e-6) << i << "," << j;
    }
  }
  EXPECT_TRUE(std::is_sorted(a.sigma.rbegin(), a.sigma.rend()));
  EXPECT_GT(a.sigma[0], 10.0f * a.sigma[40]);
}

// A1: q~·k~ = q·k for every pair (RoPE form: A applied to the rows as they are, post-RoPE).
TEST(SkewMath, A1SkewedScoresEqualTheOriginal) {
  for (const int64_t d : {64, 128}) {
    Source src(d, 2);
    const int64_t n = 300;
    const Mat q = src.rows(n), k = src.rows(n);
    const SkewMatrix a = skew_matrix(q, n, d);
    const double err = relative_score_error(q, k, rotated(q, n, d, a), rotated(k, n, d, a), n, n, d);
    EXPECT_LT(err, 1e-5) << "d = " << d;
  }
}

// A1 under GQA: one A per KV head from its G query heads' stacked rows is exact for every head.
TEST(SkewMath, A1OneMatrixPerKvHeadIsExactForEveryQueryHeadOfTheGroup) {
  const int64_t d = 64, n = 200, G = 3;
  Source src(d, 3);
  Mat stacked;
  std::vector<Mat> qs;
  for (int64_t j = 0; j < G; ++j) {
    qs.push_back(src.rows(n));
    stacked.insert(stacked.end(), qs.back().begin(), qs.back().end());
  }
  const Mat k = src.rows(n);
  const SkewMatrix a = skew_matrix(stacked, G * n, d);
  const Mat kt = rotated(k, n, d, a);
  for (int64_t j = 0; j < G; ++j)
    EXPECT_LT(relative_score_error(qs[static_cast<size_t>(j)], k,
                                   rotated(qs[static_cast<size_t>(j)], n, d, a), kt, n, n, d),
              1e-5);
}

// A1 with biases (the folded form, OPT): x·W~ + b~ gives the skewed q and k only when the biases are
// rotated too; leaving them unrotated breaks the scores.
TEST(SkewMath, A1FoldedProjectionsWithBiasesAreExact) {
  const int64_t D = 96, d = 32, n = 150;
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  auto fill = [&](int64_t count, float s) {
    Mat m(static_cast<size_t>(count));
    for (float& x : m) x = s * nd(rng);
    return m;
  };
  const Mat x = fill(n * D, 1.0f), wq = fill(D * d, 0.3f), wk = fill(D * d, 0.3f), bq = fill(d, 2.0f),
            bk = fill(d, 2.0f);
  auto project = [&](const Mat& w, const Mat* b) {
    Mat out(static_cast<size_t>(n * d), 0.0f);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < d; ++j) {
        double s = b ? (*b)[static_cast<size_t>(j)] : 0.0;
        for (int64_t i = 0; i < D; ++i)
          s += static_cast<double>(x[static_cast<size_t>(r * D + i)]) * w[static_cast<size_t>(i * d + j)];
        out[static_cast<size_t>(r * d + j)] = static_cast<float>(s);
      }
    return out;
  };
  const Mat q = project(wq, &bq), k = project(wk, &bk);
  const SkewMatrix a = skew_matrix(q, n, d);
  Mat wq2 = wq, wk2 = wk, bq2 = bq, bk2 = bk;
  fold_projection(wq2.data(), D, d, bq2.data(), a);
  fold_projection(wk2.data(), D, d, bk2.data(), a);
  EXPECT_LT(relative_score_error(q, k, project(wq2, &bq2), project(wk2, &bk2), n, n, d), 1e-5);
  // The weights rotated but the biases left as they were: not exact.
  EXPECT_GT(relative_score_error(q, k, project(wq2, &bq), project(wk2, &bk), n, n, d), 1e-3);
}

// A3: the column norms of Q~ = Q·A are the singular values, and on held-out rows the top 30 % of
// columns by sum |Q~| + |K~| carry a larger share than the top 30 % of the unskewed columns.
TEST(SkewMath, A3SkewConcentratesEnergy) {
  const int64_t d = 64, n = 400;
  Source src(d, 5);
  const Mat q = src.rows(n);
  const SkewMatrix a = skew_matrix(q, n, d);
  const Mat qt = rotated(q, n, d, a);
  for (int64_t c = 0; c < d; ++c) {
    double s = 0.0;
    for (int64_t r = 0; r < n; ++r)
      s += static_cast<double>(qt[static_cast<size_t>(r * d + c)]) * qt[static_cast<size_t>(r * d + c)];
    const double sigma = a.sigma[static_cast<size_t>(c)];
    EXPECT_NEAR(std::sqrt(s), sigma, 1e-3 * a.sigma[0]) << "column " << c;
  }
  const Mat hq = src.rows(n), hk = src.rows(n);
  auto top_share = [&](const Mat& qq, const Mat& kk) {
    std::vector<double> score(static_cast<size_t>(d), 0.0);
    add_abs_column_sums(qq.data(), n, d, score.data());
    add_abs_column_sums(kk.data(), n, d, score.data());
    const std::vector<int32_t> top = top_columns(score, partial_columns(0.3, d));
    double in = 0.0;
    for (const int32_t c : top) in += score[static_cast<size_t>(c)];
    return in / std::accumulate(score.begin(), score.end(), 0.0);
  };
  const double plain = top_share(hq, hk);
  const double skewed = top_share(rotated(hq, n, d, a), rotated(hk, n, d, a));
  EXPECT_GT(skewed, plain + 0.2) << "plain " << plain << ", skewed " << skewed;
}

TEST(SkewMath, TopColumnsBreaksTiesTowardTheLowerIndexAndSortsTheResult) {
  const std::vector<double> score = {1.0, 5.0, 3.0, 5.0, 3.0, 0.0};
  EXPECT_EQ(top_columns(score, 1), (std::vector<int32_t>{1}));
  EXPECT_EQ(top_columns(score, 3), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(top_columns(score, 6), (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
}

TEST(SkewMath, FewerRowsThanColumnsStillGiveAFullOrthogonalMatrix) {
  Source src(32, 6);
  const Mat q = src.rows(5);
  const SkewMatrix a = skew_matrix(q, 5, 32);
  EXPECT_EQ(a.sigma[5], 0.0f);
  const Mat k = src.rows(5);
  EXPECT_LT(relative_score_error(q, k, rotated(q, 5, 32, a), rotated(k, 5, 32, a), 5, 5, 32), 1e-5);
}

TEST(SkewMath, EmptySampleIsAnError) {
  EXPECT_THROW(skew_matrix({}, 0, 64), Error);
}

}  // namespace
}  // namespace kvtier::skew
