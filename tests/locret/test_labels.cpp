// Labels: the causal importance score of each prompt token (spec locret.md §7 A5, label part).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "locret/labels.h"
#include "locret/retaining_head.h"

namespace kvtier::locret {
namespace {

TEST(LocretLabels, MaxOverAnswerTokensAndTheGroupsQueryHeads) {
  // h 8, h_kv 2 (g 4), d 2, 3 answer tokens, 4 prompt tokens; every q.k is built by hand.
  const int64_t H = 8, hk = 2, d = 2, na = 3, nq = 4;
  std::vector<float> q(na * H * d, 0.0f), k(nq * hk * d, 0.0f);
  auto qr = [&](int64_t p, int64_t i) { return q.data() + (p * H + i) * d; };
  auto kr = [&](int64_t t, int64_t j) { return k.data() + (t * hk + j) * d; };
  for (int64_t t = 0; t < nq; ++t) {
    kr(t, 0)[0] = static_cast<float>(t + 1);  // KV head 0: k = (t + 1, 0)
    kr(t, 1)[1] = 1.0f;                       // KV head 1: k = (0, 1)
  }
  qr(1, 2)[0] = 2.0f;    // answer 1, head 2 (group 0): logits 2 (t + 1)
  qr(2, 3)[0] = -5.0f;   // answer 2, head 3 (group 0): negative, never the max
  qr(0, 4)[0] = 100.0f;  // head 4 is group 1: touches k[.,1][0] = 0 only
  qr(0, 7)[1] = 3.0f;    // head 7 (group 1): logit 3 for every prompt token
  qr(2, 5)[1] = 4.0f;    // head 5 (group 1): logit 4
  std::vector<float> Y(hk * nq);
  cis_labels({q.data(), k.data(), na, nq, H, hk, d, 0.5f, 0.0f}, Y.data());
  for (int64_t t = 0; t < nq; ++t) {
    EXPECT_FLOAT_EQ(Y[t], 0.5f * 2.0f * static_cast<float>(t + 1)) << t;  // scale applied
    EXPECT_FLOAT_EQ(Y[nq + t], 0.5f * 4.0f) << t;
  }
  // Soft-capping maps each logit through c tanh(s / c).
  cis_labels({q.data(), k.data(), na, nq, H, hk, d, 0.5f, 3.0f}, Y.data());
  EXPECT_FLOAT_EQ(Y[3], 3.0f * std::tanh(4.0f / 3.0f));
}

TEST(LocretLabels, MatchesBruteForceOnRandomInputs) {
  const int64_t H = 6, hk = 3, d = 5, na = 4, nq = 9;
  std::vector<float> q, k;
  for (int64_t i = 0; i < na * H * d; ++i)
    q.push_back(static_cast<float>(gaussian(9, 0, static_cast<uint64_t>(i))));
  for (int64_t i = 0; i < nq * hk * d; ++i)
    k.push_back(static_cast<float>(gaussian(9, 1, static_cast<uint64_t>(i))));
  std::vector<float> Y(hk * nq);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  cis_labels({q.data(), k.data(), na, nq, H, hk, d, scale, 0.0f}, Y.data());
  for (int64_t j = 0; j < hk; ++j) {
    for (int64_t t = 0; t < nq; ++t) {
      double best = -1e300;
      for (int64_t p = 0; p < na; ++p) {
        for (int64_t i = 0; i < H; ++i) {
          if (i / (H / hk) != j) continue;
          double s = 0.0;
          for (int64_t e = 0; e < d; ++e) s += q[(p * H + i) * d + e] * k[(t * hk + j) * d + e];
          best = std::max(best, s * scale);
        }
      }
      EXPECT_NEAR(Y[j * nq + t], best, 1e-6);
    }
  }
}

}  // namespace
}  // namespace kvtier::locret
