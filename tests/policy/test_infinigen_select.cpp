// InfiniGen's speculation (spec infinigen.md §6.3; §14 A4) against a plain scalar reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/spec_scores.h"
#include "core/error.h"
#include "core/half.h"
#include "policy/infinigen_select.h"

namespace kvtier::policy {
namespace {

struct Case {
  int64_t S, H, Hk, K;
  std::vector<int64_t> T, cap;
  bool integers;  // small integer values: many exact ties
  uint32_t seed;
};

struct Data {
  std::vector<float> qp;                    // [S, H, K]
  std::vector<std::vector<float>> pk;       // [S * Hk][T_s, K] f32 values a half holds exactly (after seal)
  std::vector<std::vector<uint16_t>> pk16;  // the same as f16 bits, what speculate reads
  std::vector<const uint16_t*> pk_ptr;
};

// Rounds the keys to f16 (the partial key cache's precision) and points the input at the f16 copies.
void seal(Data& d) {
  d.pk16.clear();
  d.pk_ptr.clear();
  for (auto& p : d.pk) {
    std::vector<uint16_t> h(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      h[i] = f32_to_f16(p[i]);
      p[i] = f16_to_f32(h[i]);
    }
    d.pk16.push_back(std::move(h));
  }
  for (const auto& h : d.pk16) d.pk_ptr.push_back(h.data());
}

Data make_data(const Case& c) {
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> ud(-2, 2);
  auto value = [&] { return c.integers ? static_cast<float>(ud(rng)) : nd(rng); };
  Data d;
  d.qp.resize(static_cast<size_t>(c.S * c.H * c.K));
  for (float& x : d.qp) x = value();
  for (int64_t s = 0; s < c.S; ++s)
    for (int64_t g = 0; g < c.Hk; ++g) {
      std::vector<float> p(static_cast<size_t>(c.T[static_cast<size_t>(s)] * c.K));
      for (float& x : p) x = value();
      d.pk.push_back(std::move(p));
    }
  seal(d);
  return d;
}

SpecInput input(const Case& c, const Data& d, float scale, GroupScoresFn fn = cpu::spec_scores_ref,
                InfinigenGroup rule = InfinigenGroup::kMax, HeadScoresFn heads = cpu::spec_head_scores_ref) {
  SpecInput in;
  in.n_seq = c.S;
  in.n_head = c.H;
  in.n_head_kv = c.Hk;
  in.k_cols = c.K;
  in.scale = scale;
  in.qp = d.qp.data();
  in.pk = d.pk_ptr;
  in.n_tokens = c.T;
  in.cap = c.cap;
  in.group_scores = fn;
  in.group = rule;
  in.head_scores = heads;
  return in;
}

// The reference: every step written out directly, a full stable sort for the top rows.
// Run with each CPU kernel this machine has (cpu::spec_scores; kScalar: spec_scores_ref, the scalar loop).
void check_data(const Case& c, const Data& d, float alpha, float scale, GroupScoresFn fn,
                InfinigenGroup rule = InfinigenGroup::kMax, HeadScoresFn heads = cpu::spec_head_scores_ref);
void check_against_reference(const Case& c, float alpha, float scale,
                             InfinigenGroup rule = InfinigenGroup::kMax) {
  for (cpu::Isa isa : {cpu::Isa::kScalar, cpu::Isa::kAvx2, cpu::Isa::kAvx512}) {
    if (!cpu::isa_supported(isa)) continue;
    SCOPED_TRACE(std::string(cpu::isa_name(isa)) + " " + std::string(infinigen_group_name(rule)));
    check_data(c, make_data(c), alpha, scale, cpu::spec_scores_kernel(isa), rule,
               cpu::spec_head_scores_kernel(isa));
  }
}

// The same result with the scores and the selection split across a pool's threads (2 and 3; the 3-thread
// pool on a 2-CPU machine sleeps, so only large inputs are split there: LargeInputsSplitAcrossThreads).
void expect_same_with_threads(const Case& c, const Data& d, float alpha, float scale, GroupScoresFn fn,
                              InfinigenGroup rule, HeadScoresFn heads, const SpecResult& want) {
  for (int threads : {2, 3}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    ThreadPool pool(threads);
    SpecInput in = input(c, d, scale, fn, rule, heads);
    in.pool = &pool;
    SpecResult got;
    speculate(in, alpha, got);
    EXPECT_EQ(got.n_sel, want.n_sel);
    EXPECT_EQ(got.chosen, want.chosen);
    EXPECT_EQ(got.offset, want.offset);
    EXPECT_EQ(got.idx, want.idx);
    EXPECT_EQ(got.count, want.count);
    EXPECT_EQ(got.max, want.max);
    EXPECT_EQ(got.scores, want.scores);
  }
}

// The reference's group score of each row: the max over the query heads of their scores (kMax), or of
// each head's score less that head's maximum over the rows (kRelative, G > 1).
void check_data(const Case& c, const Data& d, float alpha, float scale, GroupScoresFn fn, InfinigenGroup rule,
                HeadScoresFn heads) {
  SpecResult got;
  speculate(input(c, d, scale, fn, rule, heads), alpha, got);
  expect_same_with_threads(c, d, alpha, scale, fn, rule, heads, got);
  const int64_t G = c.H / c.Hk;
  std::vector<std::vector<float>> score(static_cast<size_t>(c.S * c.Hk));
  int64_t total = 0;
  for (int64_t s = 0; s < c.S; ++s)
    for (int64_t g = 0; g < c.Hk; ++g) {
      const int64_t T = c.T[static_cast<size_t>(s)];
      auto& sc = score[static_cast<size_t>(s * c.Hk + g)];
      sc.assign(static_cast<size_t>(T), -std::numeric_limits<float>::infinity());
      for (int64_t j = 0; j < G; ++j) {
        std::vector<float> head(static_cast<size_t>(T));
        for (int64_t t = 0; t < T; ++t) {
          float dot = 0.0f;  // the contract: f32, columns ascending, then scaled
          for (int64_t k = 0; k < c.K; ++k)
            dot += d.qp[static_cast<size_t>((s * c.H + g * G + j) * c.K + k)] *
                   d.pk[static_cast<size_t>(s * c.Hk + g)][static_cast<size_t>(t * c.K + k)];
          head[static_cast<size_t>(t)] = scale * dot;
        }
        const float shift =
            rule == InfinigenGroup::kRelative && G > 1 ? *std::max_element(head.begin(), head.end()) : 0.0f;
        for (int64_t t = 0; t < T; ++t)
          sc[static_cast<size_t>(t)] =
              std::max(sc[static_cast<size_t>(t)], head[static_cast<size_t>(t)] - shift);
      }
      const float m = *std::max_element(sc.begin(), sc.end());
      const auto cnt = std::count_if(sc.begin(), sc.end(), [&](float x) { return x > m - alpha; });
      EXPECT_EQ(got.max[static_cast<size_t>(s * c.Hk + g)], m) << s << "," << g;
      EXPECT_EQ(got.count[static_cast<size_t>(s * c.Hk + g)], cnt) << s << "," << g;
      total += cnt;
    }
  const auto n_sel =
      static_cast<int64_t>(std::floor(static_cast<double>(total) / static_cast<double>(c.S * c.Hk)));
  EXPECT_EQ(got.n_sel, std::max<int64_t>(n_sel, 1));
  for (int64_t s = 0; s < c.S; ++s) {
    const int64_t T = c.T[static_cast<size_t>(s)], cap = c.cap[static_cast<size_t>(s)];
    const int64_t n = T <= cap ? T : std::min({n_sel, cap, T});
    EXPECT_EQ(got.chosen[static_cast<size_t>(s)], n) << "sequence " << s;
    for (int64_t g = 0; g < c.Hk; ++g) {
      const auto& sc = score[static_cast<size_t>(s * c.Hk + g)];
      std::vector<int32_t> all(static_cast<size_t>(T));
      std::iota(all.begin(), all.end(), 0);
      std::stable_sort(all.begin(), all.end(), [&](int32_t a, int32_t b) { return sc[a] > sc[b]; });
      std::vector<int32_t> want(all.begin(), all.begin() + n);
      std::sort(want.begin(), want.end());
      const auto rows = got.rows(s, g, c.Hk);
      EXPECT_EQ(std::vector<int32_t>(rows.begin(), rows.end()), want)
          << "sequence " << s << ", KV head " << g;
    }
  }
}

// A4: b = 3, H = 5, T = 1000, k_cols = 38 (the spec's case), the caps binding for two sequences.
TEST(InfinigenSelect, A4MatchesTheScalarReference) {
  check_against_reference({3, 5, 5, 38, {1000, 1000, 1000}, {200, 5, 1000}, false, 1}, 5.0f, 0.125f);
  check_against_reference({3, 5, 5, 38, {1000, 1000, 1000}, {200, 200, 200}, false, 2}, 1.0f, 0.125f);
}

TEST(InfinigenSelect, A4WithExactTiesAndRaggedSequences) {
  check_against_reference({3, 5, 5, 38, {1000, 640, 17}, {200, 128, 20}, true, 3}, 4.0f, 1.0f);
  check_against_reference({2, 5, 5, 38, {1000, 999}, {1000, 100}, true, 4}, 0.5f, 1.0f);
}

// GQA: the score of a KV head's row is the max over its query heads (§15.11).
TEST(InfinigenSelect, A4GroupedQueryHeadsTakeTheMaxOverTheGroup) {
  check_against_reference({2, 6, 2, 19, {500, 300}, {100, 60}, false, 5}, 3.0f, 0.125f);
  check_against_reference({2, 9, 3, 19, {256, 256}, {51, 51}, true, 6}, 2.0f, 1.0f);
}

// The relative rule: each query head measured from its own maximum (GQA groups of 2, 3 and 4; ties;
// threads), and for one head per group the same rows as the max rule.
TEST(InfinigenSelect, RelativeGroupRuleMatchesTheReference) {
  check_against_reference({2, 6, 2, 19, {500, 300}, {100, 60}, false, 5}, 3.0f, 0.125f,
                          InfinigenGroup::kRelative);
  check_against_reference({2, 9, 3, 19, {256, 256}, {51, 51}, true, 6}, 2.0f, 1.0f,
                          InfinigenGroup::kRelative);
  check_against_reference({1, 4, 1, 76, {777}, {155}, false, 13}, 5.0f, 0.0625f, InfinigenGroup::kRelative);
  check_against_reference({2, 9, 3, 38, {3001, 2999}, {600, 3000}, false, 14}, 5.0f, 0.125f,
                          InfinigenGroup::kRelative);  // split across threads
  const Case mha{2, 5, 5, 38, {1000, 640}, {200, 128}, false, 15};
  const Data d = make_data(mha);
  SpecResult a, b;
  speculate(input(mha, d, 0.125f), 5.0f, a);
  speculate(input(mha, d, 0.125f, cpu::spec_scores_ref, InfinigenGroup::kRelative), 5.0f, b);
  EXPECT_EQ(a.idx, b.idx);
  EXPECT_EQ(a.count, b.count);
}

// Why the relative rule: one query head with a large score everywhere (a sink-like head) sets the group's
// maximum under the max rule, so another head's peak 4 below it but 10 above that head's other rows is
// dropped at alpha 3; the relative rule keeps both heads' peaks.
TEST(InfinigenSelect, RelativeRuleKeepsAQuieterHeadsPeak) {
  const int64_t T = 64;
  const Case c{1, 2, 1, 2, {T}, {T - 1}, false, 0};
  Data d;
  d.qp = {1.0f, 0.0f, 0.0f, 1.0f};  // head 0 reads column 0, head 1 column 1
  d.pk.assign(1, std::vector<float>(static_cast<size_t>(T * 2)));
  for (int64_t t = 0; t < T; ++t) {
    d.pk[0][static_cast<size_t>(t * 2)] = t == 0 ? 20.0f : 14.0f;      // head 0: its sink at row 0
    d.pk[0][static_cast<size_t>(t * 2 + 1)] = t == 40 ? 16.0f : 6.0f;  // head 1: its peak at row 40
  }
  seal(d);
  SpecResult mx, rel;
  speculate(input(c, d, 1.0f), 3.0f, mx);
  speculate(input(c, d, 1.0f, cpu::spec_scores_ref, InfinigenGroup::kRelative), 3.0f, rel);
  EXPECT_EQ(std::vector<int32_t>(mx.idx.begin(), mx.idx.end()), std::vector<int32_t>{0});
  EXPECT_EQ(std::vector<int32_t>(rel.idx.begin(), rel.idx.end()), (std::vector<int32_t>{0, 40}));
  check_data(c, d, 3.0f, 1.0f, cpu::spec_scores_ref, InfinigenGroup::kRelative);
}

// alpha = +inf and a cap of every row: every row of every head, in order (the degenerate case, A5).
TEST(InfinigenSelect, InfiniteAlphaAndFullCapSelectEverything) {
  const Case c{2, 4, 2, 8, {300, 123}, {300, 123}, false, 7};
  const Data d = make_data(c);
  SpecResult r;
  speculate(input(c, d, 1.0f), std::numeric_limits<float>::infinity(), r);
  for (int64_t s = 0; s < 2; ++s)
    for (int64_t g = 0; g < 2; ++g) {
      const auto rows = r.rows(s, g, 2);
      ASSERT_EQ(static_cast<int64_t>(rows.size()), c.T[static_cast<size_t>(s)]);
      for (size_t t = 0; t < rows.size(); ++t) EXPECT_EQ(rows[t], static_cast<int32_t>(t));
    }
  check_against_reference(c, std::numeric_limits<float>::infinity(), 1.0f);
}

// The top rows come from candidates above a bound (m - alpha, then m - 2^k alpha, else every row): a
// head whose count is below the shared count widens the bound, and one whose scores fall too slowly for
// any bound (or are -inf) takes every row as a candidate. K = 1, queries 1: the scores are the keys.
TEST(InfinigenSelect, TopRowsBelowTheThresholdMatchTheReference) {
  const int64_t T = 100;
  const Case c{1, 2, 2, 1, {T}, {T - 1}, false, 0};
  Data d;
  d.qp = {1.0f, 1.0f};
  d.pk.assign(2, std::vector<float>(static_cast<size_t>(T)));
  const float inf = std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < T; ++t) {
    d.pk[0][static_cast<size_t>(t)] = 1.0f;                                       // c = T
    d.pk[1][static_cast<size_t>(t)] = t % 7 == 3 ? -inf : static_cast<float>(t);  // c small
  }
  seal(d);
  for (float alpha : {5.0f, 0.5f, 1e-3f}) {  // the bound found at m - 80; none found (every row)
    SCOPED_TRACE(alpha);
    check_data(c, d, alpha, 1.0f, cpu::spec_scores_ref);
  }
  // Ties at the n-th score across the bound's candidates: the lower rows.
  for (int64_t t = 0; t < T; ++t) d.pk[1][static_cast<size_t>(t)] = static_cast<float>(t / 10);
  seal(d);
  for (float alpha : {5.0f, 0.5f, 1e-3f}) check_data(c, d, alpha, 1.0f, cpu::spec_scores_ref);
}

// Inputs above the pool's small-work limit (2^20 products) are split even by a sleeping pool: rows in
// slices of 8-row blocks with a remainder (3001, 2999 rows), several sequences, a cap that binds.
TEST(InfinigenSelect, LargeInputsSplitAcrossThreads) {
  for (uint32_t seed : {11u, 12u}) {
    const Case c{2, 9, 3, 38, {3001, 2999}, {600, 3000}, seed == 12u, seed};
    for (float alpha : {5.0f, 0.5f}) {
      SCOPED_TRACE(alpha);
      check_against_reference(c, alpha, 0.125f);
    }
  }
}

TEST(InfinigenSelect, BuffersAreReusedAcrossCalls) {
  const Case big{3, 5, 5, 38, {1000, 1000, 1000}, {200, 200, 200}, false, 8};
  const Case small{1, 5, 5, 38, {100}, {20}, false, 9};
  const Data db = make_data(big), ds = make_data(small);
  SpecResult r;
  speculate(input(big, db, 0.125f), 5.0f, r);
  const int32_t* idx_data = r.idx.data();
  const float* scores_data = r.scores.data();
  speculate(input(small, ds, 0.125f), 5.0f, r);
  speculate(input(big, db, 0.125f), 5.0f, r);
  EXPECT_EQ(r.idx.data(), idx_data);
  EXPECT_EQ(r.scores.data(), scores_data);
}

TEST(InfinigenSelect, CapAndParameters) {
  EXPECT_EQ(speculation_cap(0.2, 2048), 409);  // the paper's 409 at 2048 tokens
  EXPECT_EQ(speculation_cap(0.2, 100, 2048), 409);
  EXPECT_EQ(speculation_cap(0.2, 3), 1);
  EXPECT_EQ(speculation_cap(1.0, 77), 77);
  EXPECT_NO_THROW(validate({}));
  EXPECT_NO_THROW(validate({std::numeric_limits<float>::infinity(), 1.0, 0.3}));
  EXPECT_THROW(validate({0.0f, 0.2, 0.3}), Error);
  EXPECT_THROW(validate({std::nanf(""), 0.2, 0.3}), Error);
  EXPECT_THROW(validate({5.0f, 0.0, 0.3}), Error);
  EXPECT_THROW(validate({5.0f, 0.2, 1.5}), Error);
}

// The partial projection through B = A[:, cols] equals the skewed row's selected columns.
TEST(InfinigenSelect, PartialRowsAreTheSelectedColumnsOfTheRotatedRow) {
  const int64_t d = 8;
  std::vector<float> a(static_cast<size_t>(d * d));
  std::mt19937 rng(10);
  std::normal_distribution<float> nd;
  for (float& x : a) x = nd(rng);
  std::vector<float> x(static_cast<size_t>(3 * d));
  for (float& v : x) v = nd(rng);
  const std::vector<int32_t> cols = {1, 4, 6};
  const std::vector<float> b = partial_matrix(a.data(), d, cols);
  std::vector<float> out(9);
  partial_rows(x.data(), 3, d, b.data(), 3, out.data());
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 3; ++c) {
      double want = 0.0;
      for (int64_t i = 0; i < d; ++i)
        want += static_cast<double>(x[static_cast<size_t>(r * d + i)]) *
                a[static_cast<size_t>(i * d + cols[static_cast<size_t>(c)])];
      EXPECT_NEAR(out[static_cast<size_t>(r * 3 + c)], want, 1e-5);
    }
}

}  // namespace
}  // namespace kvtier::policy
