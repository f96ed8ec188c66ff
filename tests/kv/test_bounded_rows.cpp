// kv/bounded_rows: the storage and selection h2o and locret share.
#include "kv/bounded_rows.h"

#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "core/half.h"

namespace kvtier::kv {
namespace {

KvGeometry geometry(KvDtype dt) {
  KvGeometry g;
  g.n_head_kv = {2};
  g.head_dim_k = 4;
  g.head_dim_v = 2;
  g.dtype = dt;
  return g;
}

std::vector<uint8_t> keep_of(int64_t n, std::vector<int64_t> kept) {
  std::vector<uint8_t> k(static_cast<size_t>(n), 0);
  for (int64_t r : kept) k[static_cast<size_t>(r)] = 1;
  return k;
}

TEST(MarkBest, KeepsTheBestUnderTheCallersTieRule) {
  const std::vector<float> sc = {1.0f, 3.0f, 2.0f, 3.0f, 0.5f, 2.0f};
  std::vector<int64_t> order(sc.size());
  std::vector<uint8_t> keep(sc.size());
  // Ties to the older row: 3 (row 1), 3 (row 3), then 2 (row 2 before row 5).
  mark_best(6, 3, order, keep, [&](int64_t a, int64_t b) { return sc[a] != sc[b] ? sc[a] > sc[b] : a < b; });
  EXPECT_EQ(keep, keep_of(6, {1, 2, 3}));
  // Ties to the later row: row 5 instead of row 2.
  mark_best(6, 3, order, keep, [&](int64_t a, int64_t b) { return sc[a] != sc[b] ? sc[a] > sc[b] : a > b; });
  EXPECT_EQ(keep, keep_of(6, {1, 3, 5}));
  mark_best(6, 0, order, keep, [&](int64_t a, int64_t b) { return a < b; });
  EXPECT_EQ(keep, keep_of(6, {}));
  mark_best(4, 9, order, keep, [&](int64_t a, int64_t b) { return a < b; });
  EXPECT_EQ(std::vector<uint8_t>(keep.begin(), keep.begin() + 4), keep_of(4, {0, 1, 2, 3}));
}

TEST(BoundedRows, CompactKeepsOrderAndMovesEveryField) {
  const KvGeometry g = geometry(KvDtype::kF32);
  BoundedRows rows(g, 0, 5, false);
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t r = 0; r < 5; ++r) {
      const float x = static_cast<float>(10 * h + r);
      const std::vector<float> k(4, x), v(2, -x);
      rows.put(h, r, k.data(), nullptr, v.data(), 100 + r, x / 2);
    }
  }
  std::vector<int64_t> moved, from;
  EXPECT_EQ(rows.compact(1, 5, keep_of(5, {0, 2, 4}),
                         [&](int64_t w, int64_t r) {
                           moved.push_back(w);
                           from.push_back(r);
                         }),
            3);
  EXPECT_EQ(moved, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(from, (std::vector<int64_t>{2, 4}));
  const auto* k = reinterpret_cast<const float*>(rows.k.data());
  const auto* v = reinterpret_cast<const float*>(rows.v.data());
  const int64_t want[] = {0, 2, 4};
  for (int64_t w = 0; w < 3; ++w) {
    const size_t c = rows.cell(1, w);
    EXPECT_EQ(rows.pos[c], 100 + want[w]);
    EXPECT_EQ(rows.score[c], static_cast<float>(10 + want[w]) / 2);
    EXPECT_EQ(k[c * 4 + 3], static_cast<float>(10 + want[w]));
    EXPECT_EQ(v[c * 2 + 1], -static_cast<float>(10 + want[w]));
  }
  for (int64_t r = 0; r < 5; ++r) EXPECT_EQ(rows.pos[rows.cell(0, r)], 100 + r) << "head 0 untouched";
  const cpu::KvSpan s = rows.span(g, 7, 3);
  EXPECT_EQ(s.pos0, 7);
  EXPECT_EQ(s.n_tokens, 3);
  EXPECT_EQ(s.k_head_stride, 5 * 4);
  EXPECT_EQ(s.v_head_stride, 5 * 2);
}

TEST(BoundedRows, WithPreRopeKeysTheKeyBeforeRopeMovesAndTheRotatedOneIsTheCallers) {
  const KvGeometry g = geometry(KvDtype::kF16);
  BoundedRows rows(g, 0, 3, true);
  for (int64_t r = 0; r < 3; ++r) {
    const std::vector<float> k(4, 1.0f + r), kpre(4, 5.0f + r), v(2, 9.0f + r);
    rows.put(0, r, k.data(), kpre.data(), v.data(), r, 0.0f);
  }
  EXPECT_EQ(rows.compact(0, 3, keep_of(3, {2}), {}), 1);
  const auto* kpre = reinterpret_cast<const uint16_t*>(rows.kpre.data());
  const auto* k = reinterpret_cast<const uint16_t*>(rows.k.data());
  EXPECT_EQ(f16_to_f32(kpre[0]), 7.0f);
  EXPECT_EQ(f16_to_f32(k[0]), 1.0f) << "the rotated key is left for the caller to re-rotate";
}

TEST(BoundedRows, RowBytesAndBudgetError) {
  const KvGeometry g = geometry(KvDtype::kF16);
  EXPECT_EQ(bounded_row_bytes(g, false, 2), (4u + 2u) * 2u + 8u + 8u);
  EXPECT_EQ(bounded_row_bytes(g, true, 1), (8u + 2u) * 2u + 8u + 4u);
  KvOptions o;
  o.knobs.budget = 64;
  o.kv_mem = 1000;
  EXPECT_NO_THROW(check_bounded_budget("h2o", {600, 400}, o, "--kv-budget"));
  try {
    check_bounded_budget("h2o", {600, 401}, o, "--kv-budget");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBudget);
    const std::string m = e.what();
    EXPECT_NE(m.find("1001 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("lower --kv-budget"), std::string::npos) << m;
  }
}

TEST(KvGeometryHeads, MaxQueryHeadsPerKvHeadAndIndivisibleHeads) {
  KvGeometry g = geometry(KvDtype::kF16);
  g.n_head_kv = {2, 4, 1};
  EXPECT_EQ(g.max_q_per_kv(8), 8u);
  EXPECT_EQ(g.max_head_kv(), 4u);
  EXPECT_THROW(g.max_q_per_kv(6), Error);
}

}  // namespace
}  // namespace kvtier::kv
