// Retaining head shapes and forward pass (spec locret.md §7 A1, A2).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "locret/head_math.h"
#include "locret/retaining_head.h"

namespace kvtier::locret {
namespace {

TEST(LocretHead, ParameterCountsOfThePaperConfigs) {
  // Phi-3-mini-128K: MHA 32/32, d 96; Llama-3.1-8B: GQA 32/8, d 128 (spec §3.1 table).
  const HeadShapes phi = head_shapes(32, 32, 32, 96, 1024);
  EXPECT_EQ(phi.layers[0].d_in(), 9216);
  EXPECT_EQ(phi.parameters(0), 9469952u);
  EXPECT_EQ(phi.parameters(), 303038464u);
  const HeadShapes llama = head_shapes(32, 32, 8, 128, 1024);
  EXPECT_EQ(llama.layers[0].d_in(), 6144);
  EXPECT_EQ(llama.parameters(0), 6299648u);
  EXPECT_EQ(llama.parameters(), 201588736u);
  for (int64_t dm : {256, 512, 2048, 4096}) {
    EXPECT_EQ(head_shapes(32, 32, 32, 96, dm).parameters(), 32u * static_cast<uint64_t>(9216 * dm + dm * 32));
    EXPECT_EQ(head_shapes(32, 32, 8, 128, dm).parameters(), 32u * static_cast<uint64_t>(6144 * dm + dm * 8));
  }
}

// A naive triple loop over the spec's formula, fp64, the input assembled from [Q|K|V] by hand.
std::vector<double> naive_scores(const LayerShape& s, int64_t dm, const LayerParams<double>& w,
                                 const std::vector<float>& q, const std::vector<float>& k,
                                 const std::vector<float>& v, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n * s.n_head_kv));
  for (int64_t t = 0; t < n; ++t) {
    std::vector<double> x;
    for (int64_t h = 0; h < s.n_head; ++h)
      for (int64_t e = 0; e < s.head_dim_k; ++e) x.push_back(q[(t * s.n_head + h) * s.head_dim_k + e]);
    for (int64_t h = 0; h < s.n_head_kv; ++h)
      for (int64_t e = 0; e < s.head_dim_k; ++e) x.push_back(k[(t * s.n_head_kv + h) * s.head_dim_k + e]);
    for (int64_t h = 0; h < s.n_head_kv; ++h)
      for (int64_t e = 0; e < s.head_dim_v; ++e) x.push_back(v[(t * s.n_head_kv + h) * s.head_dim_v + e]);
    std::vector<double> a(static_cast<size_t>(dm));
    for (int64_t m = 0; m < dm; ++m) {
      double z = 0.0;
      for (int64_t i = 0; i < s.d_in(); ++i) z += x[i] * w.fc1[m * s.d_in() + i];  // X W1, W1 = fc1^T
      a[m] = z / (1.0 + std::exp(-z));
    }
    for (int64_t j = 0; j < s.n_head_kv; ++j) {
      double p = 0.0;
      for (int64_t m = 0; m < dm; ++m) p += a[m] * w.fc2[j * dm + m];
      out[t * s.n_head_kv + j] = p;
    }
  }
  return out;
}

struct Fixture {
  LayerShape s{4, 2, 8, 6};  // h 4, h_kv 2, dk 8, dv 6: d_in 32 + 16 + 12 = 60
  int64_t dm = 16, n = 5;
  std::vector<float> q, k, v;
  Fixture() {
    auto fill = [](std::vector<float>& x, size_t count, uint64_t stream) {
      for (size_t i = 0; i < count; ++i) x.push_back(static_cast<float>(gaussian(7, stream, i)));
    };
    fill(q, static_cast<size_t>(n * s.q_dim()), 1);
    fill(k, static_cast<size_t>(n * s.k_dim()), 2);
    fill(v, static_cast<size_t>(n * s.v_dim()), 3);
  }
};

TEST(LocretHead, ForwardMatchesNaiveLoopInFp64) {
  Fixture f;
  HeadShapes shapes;
  shapes.d_m = f.dm;
  shapes.layers = {f.s};
  const RetainingHeads heads = RetainingHeads::random(shapes, 3, 0.3f);
  LayerParams<double> w;
  w.fc1.assign(heads.layer(0).fc1.begin(), heads.layer(0).fc1.end());
  w.fc2.assign(heads.layer(0).fc2.begin(), heads.layer(0).fc2.end());
  std::vector<double> X(static_cast<size_t>(f.n * f.s.d_in())), z(static_cast<size_t>(f.n * f.dm)),
      a(z.size()), p(static_cast<size_t>(f.n * f.s.n_head_kv));
  assemble_features(f.s, f.q.data(), f.k.data(), f.v.data(), f.n, X.data());
  head_forward<double>({}, f.s, f.dm, HeadActivation::kSilu, w, X.data(), f.n, z.data(), a.data(), p.data());
  const auto want = naive_scores(f.s, f.dm, w, f.q, f.k, f.v, f.n);
  ASSERT_EQ(p.size(), want.size());
  double max_rel = 0.0;
  for (size_t i = 0; i < p.size(); ++i)
    max_rel = std::max(max_rel, std::fabs(p[i] - want[i]) / std::fabs(want[i]));
  EXPECT_LT(max_rel, 1e-6);

  // The f32 inference scorer (cpu::matmul, every ISA) agrees with the fp64 reference.
  ThreadPool pool(2);
  for (cpu::Isa isa : {cpu::Isa::kScalar, cpu::best_isa()}) {
    std::vector<float> scores(p.size()), scratch(heads.scratch_floats(0, f.n));
    heads.score({&pool, isa}, 0, f.q.data(), f.k.data(), f.v.data(), f.n, scores.data(), scratch);
    for (size_t i = 0; i < p.size(); ++i)
      EXPECT_NEAR(scores[i], want[i], 1e-5 * std::max(1.0, std::fabs(want[i])));
  }
}

TEST(LocretHead, ScoresOfATokenDependOnlyOnItsOwnRows) {
  // Scoring tokens one at a time gives the bits of scoring them together (inference scores chunks
  // of any size; training scores whole prompts).
  Fixture f;
  HeadShapes shapes;
  shapes.d_m = f.dm;
  shapes.layers = {f.s};
  const RetainingHeads heads = RetainingHeads::random(shapes, 5);
  ThreadPool pool(2);
  const Compute c{&pool, cpu::best_isa()};
  std::vector<float> all(static_cast<size_t>(f.n * f.s.n_head_kv)), scratch(heads.scratch_floats(0, f.n));
  heads.score(c, 0, f.q.data(), f.k.data(), f.v.data(), f.n, all.data(), scratch);
  for (int64_t t = 0; t < f.n; ++t) {
    float one[2];
    heads.score(c, 0, f.q.data() + t * f.s.q_dim(), f.k.data() + t * f.s.k_dim(),
                f.v.data() + t * f.s.v_dim(), 1, one, scratch);
    EXPECT_EQ(one[0], all[t * 2]);
    EXPECT_EQ(one[1], all[t * 2 + 1]);
  }
}

TEST(LocretHead, RandomInitIsSeededAndNeverZero) {
  const HeadShapes shapes = head_shapes(2, 4, 2, 8, 16);
  const auto a = RetainingHeads::random(shapes, 11);
  const auto b = RetainingHeads::random(shapes, 11);
  const auto c = RetainingHeads::random(shapes, 12);
  EXPECT_EQ(a.layer(1).fc1, b.layer(1).fc1);
  EXPECT_NE(a.layer(1).fc1, c.layer(1).fc1);
  double sum2 = 0.0;
  for (float x : a.layer(0).fc1) sum2 += static_cast<double>(x) * x;
  const double sd = std::sqrt(sum2 / static_cast<double>(a.layer(0).fc1.size()));
  EXPECT_NEAR(sd, 0.02, 0.002);
  bool fc2_nonzero = false;
  for (float x : a.layer(0).fc2) fc2_nonzero |= x != 0.0f;
  EXPECT_TRUE(fc2_nonzero);
}

}  // namespace
}  // namespace kvtier::locret
