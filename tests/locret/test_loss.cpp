// The loss, its gradients and the top-k overlap (spec locret.md §7 A3, A4, A7).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "locret/head_math.h"
#include "locret/loss.h"
#include "locret/retaining_head.h"

namespace kvtier::locret {
namespace {

TEST(LocretLoss, WorkedExample) {
  // One layer, one head, T = 3: SmoothL1 mean (0.125 + 1.5 + 0) / 3, smooth (4 + 0.25) / 2.
  const double P[3] = {0.0, 2.0, 2.5};
  const float Y[3] = {0.5f, 0.0f, 2.5f};
  const LayerLoss l = layer_loss<double>(P, Y, 3, 1, 1, {}, nullptr);
  EXPECT_NEAR(l.reg, 0.5416667, 1e-7);
  EXPECT_NEAR(l.smooth, 2.125, 1e-12);
  EXPECT_NEAR(l.total, 0.5469792, 1e-7);
  // kMeanLayers divides the smoothness term by L; with L = 2 reg halves too.
  const LayerLoss two = layer_loss<double>(P, Y, 3, 1, 2, {0.0025, SmoothReduction::kMeanLayers}, nullptr);
  EXPECT_NEAR(two.total, 0.5416667 / 2 + 0.0025 * 2.125 / 2, 1e-7);
}

// A4: finite differences of the whole loss (two layers, both terms) against the analytic
// gradients of every fc1 and fc2 element, fp64. D_in 12, d_m 8, h_kv 2, T 7, L 2.
class LocretGradCheck : public ::testing::TestWithParam<HeadActivation> {};

TEST_P(LocretGradCheck, HeadAndLossAgainstFiniteDifferences) {
  const HeadActivation act = GetParam();
  const LayerShape s{2, 2, 2, 2};  // d_in = 4 + 4 + 4 = 12
  const int64_t dm = 8, n = 7, hk = 2;
  const uint32_t L = 2;
  ASSERT_EQ(s.d_in(), 12);
  std::vector<std::vector<double>> X(L), Y64(L);
  std::vector<std::vector<float>> Y(L);
  std::vector<LayerParams<double>> w(L);
  for (uint32_t l = 0; l < L; ++l) {
    for (int64_t i = 0; i < n * s.d_in(); ++i) X[l].push_back(gaussian(1, 10 + l, static_cast<uint64_t>(i)));
    for (int64_t i = 0; i < hk * n; ++i)
      Y[l].push_back(static_cast<float>(2.0 * gaussian(2, l, static_cast<uint64_t>(i))));
    for (int64_t i = 0; i < dm * s.d_in(); ++i)
      w[l].fc1.push_back(0.4 * gaussian(3, l, static_cast<uint64_t>(i)));
    for (int64_t i = 0; i < hk * dm; ++i) w[l].fc2.push_back(0.8 * gaussian(4, l, static_cast<uint64_t>(i)));
  }
  const LossConfig cfg{0.0025, SmoothReduction::kSumLayers};
  auto loss = [&](const std::vector<LayerParams<double>>& ws, bool& both_regimes) {
    double total = 0.0;
    int small = 0, large = 0;
    for (uint32_t l = 0; l < L; ++l) {
      std::vector<double> z(static_cast<size_t>(n * dm)), a(z.size()), p(static_cast<size_t>(n * hk));
      head_forward<double>({}, s, dm, act, ws[l], X[l].data(), n, z.data(), a.data(), p.data());
      total += layer_loss<double>(p.data(), Y[l].data(), n, hk, L, cfg, nullptr).total;
      for (int64_t t = 0; t < n; ++t)
        for (int64_t j = 0; j < hk; ++j) (std::fabs(p[t * hk + j] - Y[l][j * n + t]) < 1.0 ? small : large)++;
    }
    both_regimes = small > 0 && large > 0;
    return total;
  };
  bool both = false;
  loss(w, both);
  EXPECT_TRUE(both) << "the fixture should exercise both SmoothL1 branches";
  for (uint32_t l = 0; l < L; ++l) {
    std::vector<double> z(static_cast<size_t>(n * dm)), a(z.size()), p(static_cast<size_t>(n * hk)),
        dp(p.size());
    head_forward<double>({}, s, dm, act, w[l], X[l].data(), n, z.data(), a.data(), p.data());
    layer_loss<double>(p.data(), Y[l].data(), n, hk, L, cfg, dp.data());
    LayerParams<double> g;
    BackwardScratch<double> sc;
    head_backward<double>({}, s, dm, act, w[l], X[l].data(), n, z.data(), a.data(), dp.data(), g, sc);
    for (int fc = 1; fc <= 2; ++fc) {
      std::vector<double>& param = fc == 1 ? w[l].fc1 : w[l].fc2;
      const std::vector<double>& analytic = fc == 1 ? g.fc1 : g.fc2;
      double num2 = 0.0, diff2 = 0.0;
      for (size_t i = 0; i < param.size(); ++i) {
        const double keep = param[i], h = 1e-6;
        bool unused = false;
        param[i] = keep + h;
        const double up = loss(w, unused);
        param[i] = keep - h;
        const double down = loss(w, unused);
        param[i] = keep;
        const double numeric = (up - down) / (2 * h);
        num2 += numeric * numeric;
        diff2 += (numeric - analytic[i]) * (numeric - analytic[i]);
      }
      ASSERT_GT(num2, 0.0);
      EXPECT_LT(std::sqrt(diff2 / num2), 1e-5) << "layer " << l << " fc" << fc;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Activations, LocretGradCheck,
                         ::testing::Values(HeadActivation::kSilu, HeadActivation::kGeluTanh,
                                           HeadActivation::kRelu));

TEST(LocretLoss, FloatGradientsMatchDouble) {
  // The f32 path (cpu::matmul GEMMs) the trainer runs gives the fp64 gradients to f32 precision.
  const LayerShape s{4, 2, 8, 8};
  const int64_t dm = 16, n = 33, hk = 2;
  std::vector<float> Xf, Y;
  std::vector<double> Xd;
  LayerParams<float> wf;
  LayerParams<double> wd;
  for (int64_t i = 0; i < n * s.d_in(); ++i) {
    Xd.push_back(static_cast<float>(gaussian(5, 0, static_cast<uint64_t>(i))));
    Xf.push_back(static_cast<float>(Xd.back()));
  }
  for (int64_t i = 0; i < hk * n; ++i)
    Y.push_back(static_cast<float>(gaussian(5, 1, static_cast<uint64_t>(i))));
  for (int64_t i = 0; i < dm * s.d_in(); ++i)
    wf.fc1.push_back(static_cast<float>(0.1 * gaussian(5, 2, static_cast<uint64_t>(i))));
  for (int64_t i = 0; i < hk * dm; ++i)
    wf.fc2.push_back(static_cast<float>(0.3 * gaussian(5, 3, static_cast<uint64_t>(i))));
  wd.fc1.assign(wf.fc1.begin(), wf.fc1.end());
  wd.fc2.assign(wf.fc2.begin(), wf.fc2.end());
  ThreadPool pool(2);
  auto grads = [&](auto& w, auto& X, auto zero, const Compute& c) {
    using T = decltype(zero);
    std::vector<T> z(static_cast<size_t>(n * dm)), a(z.size()), p(static_cast<size_t>(n * hk)), dp(p.size());
    head_forward<T>(c, s, dm, HeadActivation::kSilu, w, X.data(), n, z.data(), a.data(), p.data());
    layer_loss<T>(p.data(), Y.data(), n, hk, 1, {}, dp.data());
    LayerParams<T> g;
    BackwardScratch<T> sc;
    head_backward<T>(c, s, dm, HeadActivation::kSilu, w, X.data(), n, z.data(), a.data(), dp.data(), g, sc);
    return g;
  };
  const auto gd = grads(wd, Xd, 0.0, {});
  const auto gf = grads(wf, Xf, 0.0f, {&pool, cpu::best_isa()});
  double scale = 0.0;
  for (double x : gd.fc1) scale = std::max(scale, std::fabs(x));
  ASSERT_GT(scale, 0.0);
  for (size_t i = 0; i < gd.fc1.size(); ++i) EXPECT_NEAR(gf.fc1[i], gd.fc1[i], 1e-4 * scale);
  for (size_t i = 0; i < gd.fc2.size(); ++i)
    EXPECT_NEAR(gf.fc2[i], gd.fc2[i], 1e-4 * std::max(1e-3, std::fabs(gd.fc2[i])) + 1e-6);
}

TEST(LocretOverlap, TopTenPercentOverlap) {
  // T = 20, K = 2 per head. Head 0: predictions rank 3, 7 top, labels 7, 9: one hit. Head 1: same
  // ranking in both: two hits.
  const int64_t n = 20, hk = 2;
  std::vector<float> P(n * hk, 0.0f), Y(hk * n, 0.0f);
  P[3 * hk + 0] = 5.0f;
  P[7 * hk + 0] = 4.0f;
  Y[0 * n + 7] = 1.0f;
  Y[0 * n + 9] = 2.0f;
  P[1 * hk + 1] = 1.0f;
  P[2 * hk + 1] = 1.0f;
  Y[1 * n + 1] = 3.0f;
  Y[1 * n + 2] = 3.0f;
  const Overlap o = topk_overlap(P.data(), Y.data(), n, hk);
  EXPECT_EQ(o.total, 4);
  EXPECT_EQ(o.hits, 3);
  // Ties go to the later position: all-equal predictions pick the last K positions.
  std::vector<float> flat(n, 0.0f), late(n, 0.0f);
  late[18] = late[19] = 1.0f;
  EXPECT_EQ(topk_overlap(flat.data(), late.data(), n, 1).hits, 2);
}

}  // namespace
}  // namespace kvtier::locret
