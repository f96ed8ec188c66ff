// The learning-rate schedule, value clipping and AdamW (spec locret.md §7 A6).
#include <gtest/gtest.h>

#include <vector>

#include "locret/optimizer.h"

namespace kvtier::locret {
namespace {

TEST(LocretSchedule, PaperScheduleAtTheSpecsPoints) {
  const LinearSchedule s{5e-4, 2000, 3000};
  EXPECT_EQ(s.lr(0), 0.0);  // the first update has lr 0
  EXPECT_DOUBLE_EQ(s.lr(1000), 2.5e-4);
  EXPECT_DOUBLE_EQ(s.lr(2000), 5e-4);
  EXPECT_DOUBLE_EQ(s.lr(2500), 2.5e-4);
  EXPECT_DOUBLE_EQ(s.lr(2999), 5e-7);
  EXPECT_EQ(s.lr(3000), 0.0);
  EXPECT_EQ(s.lr(4000), 0.0);                                 // never negative
  EXPECT_DOUBLE_EQ((LinearSchedule{1.0, 0, 10}.lr(0)), 1.0);  // no warmup: decay from the start
}

TEST(LocretOptimizer, ClipByValueBoundsEveryElement) {
  std::vector<float> g = {-3.0f, -0.5f, -0.49f, 0.0f, 0.2f, 0.5f, 7.0f};
  clip_by_value<float>(g, 0.5);
  EXPECT_EQ(g, (std::vector<float>{-0.5f, -0.5f, -0.49f, 0.0f, 0.2f, 0.5f, 0.5f}));
}

TEST(LocretOptimizer, AdamWMatchesTheReferenceFormulaForThreeSteps) {
  // torch.optim.AdamW(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01). Step 1 by hand for p = 1,
  // g = 0.5, lr = 1e-3: m = 0.05, v = 0.0125, m^ = 0.5, v^ = 0.25, so
  // p = 1 (1 - 1e-5) - 1e-3 * 0.5 / (0.5 + 1e-8) = 0.99899000002. Steps 2 and 3 (and the second
  // parameter) are the same formula evaluated in Python's doubles.
  const AdamWConfig cfg;
  std::vector<double> p = {1.0, -0.3}, m(2, 0.0), v(2, 0.0);
  const double grads[3][2] = {{0.5, 0.01}, {-0.2, 0.02}, {0.1, -0.7}};
  const double lrs[3] = {1e-3, 2e-3, 5e-4};
  const double want[3][2] = {{0.99899000002, -0.300996999000001},
                             {0.998272427075747, -0.3029069495963504},
                             {0.9980738296300824, -0.30260558602974064}};
  for (int t = 0; t < 3; ++t) {
    const std::vector<double> g(grads[t], grads[t] + 2);
    adamw_update<double>(p, g, m, v, t + 1, lrs[t], cfg);
    EXPECT_NEAR(p[0], want[t][0], 1e-15);
    EXPECT_NEAR(p[1], want[t][1], 1e-15);
  }
  EXPECT_NEAR(m[1], -0.06739, 1e-15);
  EXPECT_NEAR(v[1], 0.0245235125, 1e-15);
}

TEST(LocretOptimizer, StepClipsThenUpdatesWithTheScheduledRate) {
  LayerParams<float> w{{1.0f}, {2.0f}}, g{{3.0f}, {-0.25f}}, m{{0.0f}, {0.0f}}, v{{0.0f}, {0.0f}};
  const LinearSchedule s{1e-2, 2, 10};
  optimizer_step_layer(w, g, m, v, 0, s, 0.5, {});
  EXPECT_EQ(g.fc1[0], 0.5f);             // clipped in place
  EXPECT_EQ(w.fc1[0], 1.0f);             // lr(0) = 0: only the moments move
  EXPECT_FLOAT_EQ(m.fc1[0], 0.05f);      // (1 - 0.9) * 0.5
  EXPECT_FLOAT_EQ(v.fc2[0], 0.003125f);  // (1 - 0.95) * 0.25^2
  LayerParams<float> g2{{0.5f}, {-0.25f}};
  optimizer_step_layer(w, g2, m, v, 1, s, 0.5, {});  // lr 5e-3, t = 2
  EXPECT_LT(w.fc1[0], 1.0f);
  EXPECT_GT(w.fc2[0], 2.0f * (1.0f - 5e-5f));
}

}  // namespace
}  // namespace kvtier::locret
