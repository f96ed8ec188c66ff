// InfiniGen's KV-side pieces: the partial key cache (spec infinigen.md §5.1–5.2, §7.3, §15.2) and
// the gather of chosen rows with the current token always attended (§7.1–7.2, A7).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kv/partial_keys.h"
#include "kv/row_gather.h"
#include "policy/infinigen_select.h"
#include "skew/skew_math.h"

namespace kvtier::kv {
namespace {

constexpr int64_t kD = 16, kHeads = 6, kHk = 2, kLayers = 2;

std::vector<float> random_rows(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> nd;
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = nd(rng) * (1.0f + 4.0f * static_cast<float>(i % kD == 3));
  return v;
}

skew::SkewSet make_skew(std::mt19937& rng) {
  skew::SkewSet set;
  set.head_dim = kD;
  set.partial_ratio = 0.25f;
  set.partial_columns = 4;
  for (int64_t l = 0; l < kLayers; ++l) {
    skew::LayerSkew L;
    L.n_head_kv = kHk;
    for (int64_t g = 0; g < kHk; ++g) {
      const auto a = skew::skew_matrix(random_rows(rng, 50 * kD), 50, kD);
      L.a.insert(L.a.end(), a.a.begin(), a.a.end());
      L.sigma.insert(L.sigma.end(), a.sigma.begin(), a.sigma.end());
      for (int32_t c : {1, 5, 9, 13}) L.cols.push_back(c);
    }
    set.layers.push_back(std::move(L));
  }
  return set;
}

TEST(PartialKeys, ColumnsAreTheTopScoresOfTheRotatedPromptAndRowsAreRotatedKeysAtThoseColumns) {
  std::mt19937 rng(1);
  const skew::SkewSet set = make_skew(rng);
  MemoryLedger ledger;
  const PartialKeysShape shape{kHeads, 128, 2, 64};
  PartialKeys pk(set, shape, ledger);
  EXPECT_EQ(ledger.current(Tier::kDevice, Category::kKv), PartialKeys::bytes(set, shape));
  EXPECT_EQ(PartialKeys::bytes(set, shape), 2u * kLayers * kHk * 128 * 4 * 4);
  const int64_t n = 80;
  std::vector<std::vector<float>> qs, ks;
  for (int64_t l = 0; l < kLayers; ++l) {
    qs.push_back(random_rows(rng, n * kHeads * kD));
    ks.push_back(random_rows(rng, n * kHk * kD));
    pk.observe(1, static_cast<uint32_t>(l), qs.back().data(), ks.back().data(), 40);  // two passes
    pk.observe(1, static_cast<uint32_t>(l), qs.back().data() + 40 * kHeads * kD,
               ks.back().data() + 40 * kHk * kD, 40);
  }
  pk.choose_columns(1);
  std::vector<float> rot(kD);
  for (uint32_t l = 0; l < kLayers; ++l) {
    for (uint32_t g = 0; g < kHk; ++g) {
      const float* a = set.layers[l].head_a(g, kD);
      std::vector<double> score(kD, 0.0);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t j = 0; j < kHeads / kHk; ++j) {
          skew::rotate_rows(&qs[l][static_cast<size_t>((t * kHeads + g * (kHeads / kHk) + j) * kD)], 1, kD, a,
                            rot.data());
          skew::add_abs_column_sums(rot.data(), 1, kD, score.data());
        }
        skew::rotate_rows(&ks[l][static_cast<size_t>((t * kHk + g) * kD)], 1, kD, a, rot.data());
        skew::add_abs_column_sums(rot.data(), 1, kD, score.data());
      }
      const auto want = skew::top_columns(score, 4);
      const auto got = pk.columns(1, l, g);
      EXPECT_EQ(std::vector<int32_t>(got.begin(), got.end()), want) << "layer " << l << " head " << g;
    }
    pk.write(1, l, 10, ks[l].data(), n);
    for (uint32_t g = 0; g < kHk; ++g) {
      const auto cols = pk.columns(1, l, g);
      for (int64_t t = 0; t < n; ++t) {
        skew::rotate_rows(&ks[l][static_cast<size_t>((t * kHk + g) * kD)], 1, kD, set.layers[l].head_a(g, kD),
                          rot.data());
        for (int64_t c = 0; c < 4; ++c)
          EXPECT_NEAR(pk.rows(1, l, g)[(10 + t) * 4 + c],
                      rot[static_cast<size_t>(cols[static_cast<size_t>(c)])], 1e-4);
      }
    }
  }
}

TEST(PartialKeys, ShortPromptsUseTheOfflineColumns) {
  std::mt19937 rng(2);
  const skew::SkewSet set = make_skew(rng);
  MemoryLedger ledger;
  PartialKeys pk(set, {kHeads, 64, 1, 64}, ledger);
  for (uint32_t l = 0; l < kLayers; ++l) {
    const auto q = random_rows(rng, 20 * kHeads * kD), k = random_rows(rng, 20 * kHk * kD);
    pk.observe(0, l, q.data(), k.data(), 20);
  }
  pk.choose_columns(0);
  for (uint32_t l = 0; l < kLayers; ++l)
    for (uint32_t g = 0; g < kHk; ++g) {
      const auto c = pk.columns(0, l, g);
      EXPECT_EQ(std::vector<int32_t>(c.begin(), c.end()), (std::vector<int32_t>{1, 5, 9, 13}));
    }
}

// A7 (CPU gather): the rows fetched for a speculation are the pool's rows at the chosen slots, bit
// for bit, and the current token is always in the attention set.
TEST(RowGather, A7GatheredRowsAreThePoolRowsBitForBitAndTheCurrentTokenIsAttended) {
  std::mt19937 rng(3);
  const int64_t T = 300, k = 4;
  std::vector<uint16_t> plane(static_cast<size_t>(T * kD));  // [T, d] f16 bits of one KV head
  for (uint16_t& x : plane) x = static_cast<uint16_t>(rng());
  const auto pk_rows = random_rows(rng, T * k);
  const auto qp = random_rows(rng, 3 * k);  // one KV head with 3 query heads
  const float* pk_ptr = pk_rows.data();
  const int64_t n_tokens = T, cap = 60;
  policy::SpecInput in;
  in.n_seq = 1;
  in.n_head = 3;
  in.n_head_kv = 1;
  in.k_cols = k;
  in.qp = qp.data();
  in.pk = {&pk_ptr, 1};
  in.n_tokens = {&n_tokens, 1};
  in.cap = {&cap, 1};
  policy::SpecResult r;
  policy::speculate(in, 2.0f, r);
  const auto chosen = r.rows(0, 0, 1);
  ASSERT_FALSE(chosen.empty());
  std::vector<uint16_t> staged(chosen.size() * kD);
  gather_rows(reinterpret_cast<const uint8_t*>(plane.data()), kD * 2, chosen,
              reinterpret_cast<uint8_t*>(staged.data()));
  for (size_t i = 0; i < chosen.size(); ++i)
    EXPECT_EQ(std::memcmp(&staged[i * kD], &plane[static_cast<size_t>(chosen[i]) * kD], kD * 2), 0) << i;

  std::vector<int32_t> rows;
  attention_rows(chosen, static_cast<int32_t>(T), rows);  // the current token's slot is T
  EXPECT_EQ(rows.size(), chosen.size() + 1);
  EXPECT_EQ(rows.back(), T);
  EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()));
  attention_rows(chosen, chosen[0], rows);  // already there: not twice
  EXPECT_EQ(rows, std::vector<int32_t>(chosen.begin(), chosen.end()));
  const std::vector<int32_t> some = {2, 7, 9};
  attention_rows(some, 5, rows);  // a reused slot in the middle
  EXPECT_EQ(rows, (std::vector<int32_t>{2, 5, 7, 9}));
}

}  // namespace
}  // namespace kvtier::kv
