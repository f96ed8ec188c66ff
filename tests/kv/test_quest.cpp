// Quest selection on the KV store alone: page bounds really bound q.k; the selection is the
// best-bounded pages with the newest page always in it; a decode step equals a direct softmax over
// exactly the pages a brute-force ranking picks; a budget covering the context is bit-identical to no
// selection; prefill stays dense.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "core/error.h"
#include "kv/quest_index.h"
#include "kv/resident_kv.h"
#include "kv/tiered_kv.h"

namespace kvtier::kv {
namespace {

constexpr int64_t kD = 16;
constexpr uint32_t kHead = 4;  // 2 KV heads, GQA 2

TEST(QuestIndex, BoundsHoldAndTheNewestPageIsAlwaysSelected) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t page = 8, n = 100;
  QuestIndex idx(1, {2}, 128, page, kD);
  std::vector<float> k(n * 2 * kD);
  for (float& x : k) x = nd(rng);
  idx.update(0, 0, 0, 60, k.data());
  idx.update(0, 0, 60, 40, k.data() + 60 * 2 * kD);
  std::vector<float> q(kD);
  for (float& x : q) x = nd(rng);
  std::vector<PosRange> out(16);
  std::vector<int64_t> order(16);
  std::vector<float> bound(16);
  for (uint32_t h = 0; h < 2; ++h) {
    // Brute force: each page's largest q.k must not exceed its bound.
    const auto sel = idx.select(0, 0, h, q.data(), 1, n, 4 * page, out, order, bound);
    for (int64_t p = 0; p < idx.pages(n); ++p) {
      float best = -INFINITY;
      for (int64_t t = p * page; t < std::min(n, (p + 1) * page); ++t) {
        float d = 0;
        for (int64_t i = 0; i < kD; ++i) d += q[i] * k[(t * 2 + h) * kD + i];
        best = std::max(best, d);
      }
      EXPECT_LE(best, bound[p] + 1e-4f) << "page " << p;
    }
    int64_t total = 0;
    for (const PosRange& r : sel) total += r.n;
    EXPECT_EQ(total, 3 * page + (n - 12 * page));  // 3 full pages + the newest, partial one
    EXPECT_EQ(sel.back().pos0 + sel.back().n, n);  // the newest page is in
    for (size_t i = 1; i < sel.size(); ++i)
      EXPECT_GT(sel[i].pos0, sel[i - 1].pos0 + sel[i - 1].n);  // merged runs
    // The other three are the best-bounded of the older pages.
    std::vector<float> older(bound.begin(), bound.begin() + idx.pages(n) - 1);
    std::sort(older.rbegin(), older.rend());
    for (const PosRange& r : sel) {
      for (int64_t p = r.pos0 / page; p < (r.pos0 + r.n + page - 1) / page; ++p) {
        if (p != idx.pages(n) - 1) {
          EXPECT_GE(bound[p], older[2]);
        }
      }
    }
  }
}

KvGeometry geometry(cpu::KvDtype dt) {
  KvGeometry g;
  g.n_head_kv = {2, 2};
  g.head_dim_k = kD;
  g.head_dim_v = kD;
  g.block_tokens = 32;
  g.dtype = dt;
  return g;
}

KvOptions quest(int64_t budget, int64_t page) {
  KvOptions o;
  o.selection = policy::Selection::kQuest;
  o.knobs.budget = budget;
  o.knobs.quest_page = page;
  return o;
}

struct Pass {
  std::vector<float> q, k, v;
};

std::vector<Pass> make_passes(const std::vector<int64_t>& sizes, uint32_t layers) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<Pass> out;
  for (int64_t n : sizes) {
    for (uint32_t l = 0; l < layers; ++l) {
      Pass p{std::vector<float>(n * kHead * kD), std::vector<float>(n * 2 * kD),
             std::vector<float>(n * 2 * kD)};
      for (auto* x : {&p.q, &p.k, &p.v}) {
        for (float& e : *x) e = nd(rng);
      }
      out.push_back(p);
    }
  }
  return out;
}

std::vector<float> run(KvCache& kv, const std::vector<int64_t>& sizes, const std::vector<Pass>& ps) {
  std::vector<float> out;
  size_t i = 0;
  for (int64_t n : sizes) {
    kv.begin_pass({0, n});
    for (uint32_t l = 0; l < 2; ++l, ++i) {
      std::vector<float> o(n * kHead * kD);
      kv.write(l, {ps[i].k.data(), ps[i].v.data()});
      kv.attend(l, ps[i].q.data(), kHead, {0.25f, 0.0f, 0}, o.data());
      out.insert(out.end(), o.begin(), o.end());
    }
    kv.end_pass();
  }
  return out;
}

TEST(Quest, DecodeStepsAttendExactlyTheBestBoundedPages) {
  ThreadPool pool(2);
  const int64_t page = 8, budget = 40;  // 5 pages of up to 37
  const std::vector<int64_t> sizes{100, 96, 1, 1, 1, 1, 1, 1, 1, 1};
  const auto ps = make_passes(sizes, 2);
  MemoryLedger ledger;
  ResidentKv kv(geometry(cpu::KvDtype::kF32), 256, kHead, ledger, pool, cpu::best_isa(), quest(budget, page));
  const auto got = run(kv, sizes, ps);
  // Reference: dense prefill; at each decode step rank the pages by the bound over the KV head's two
  // query heads (min/max of the keys), keep the newest + the best 4 others, softmax over their keys.
  std::vector<std::vector<float>> K(2), V(2);  // [layer] -> [pos][2][kD]
  std::vector<float> want;
  int64_t pos0 = 0;
  size_t i = 0;
  for (int64_t n : sizes) {
    for (uint32_t l = 0; l < 2; ++l, ++i) {
      K[l].insert(K[l].end(), ps[i].k.begin(), ps[i].k.end());
      V[l].insert(V[l].end(), ps[i].v.begin(), ps[i].v.end());
      const int64_t end = pos0 + n;
      const int64_t np = (end + page - 1) / page;
      std::vector<float> o(n * kHead * kD);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t kh = 0; kh < 2; ++kh) {
          std::vector<bool> use(np, true);
          if (n == 1) {
            std::vector<std::pair<float, int64_t>> rank;
            for (int64_t p = 0; p + 1 < np; ++p) {
              float best = -INFINITY;
              for (int64_t g = 0; g < 2; ++g) {
                const float* q = ps[i].q.data() + (kh * 2 + g) * kD;
                float u = 0;
                for (int64_t d = 0; d < kD; ++d) {
                  float lo = INFINITY, hi = -INFINITY;
                  for (int64_t j = p * page; j < (p + 1) * page; ++j) {
                    lo = std::min(lo, K[l][(j * 2 + kh) * kD + d]);
                    hi = std::max(hi, K[l][(j * 2 + kh) * kD + d]);
                  }
                  u += std::max(q[d] * lo, q[d] * hi);
                }
                best = std::max(best, u);
              }
              rank.push_back({-best, p});
            }
            std::sort(rank.begin(), rank.end());
            std::fill(use.begin(), use.end(), false);
            use[np - 1] = true;
            for (int64_t r = 0; r < budget / page - 1; ++r) use[rank[r].second] = true;
          }
          for (int64_t g = 0; g < 2; ++g) {
            const float* q = ps[i].q.data() + (t * kHead + kh * 2 + g) * kD;
            std::vector<double> s;
            std::vector<int64_t> keys;
            for (int64_t j = 0; j <= pos0 + t; ++j) {
              if (!use[j / page]) continue;
              double d = 0;
              for (int64_t e = 0; e < kD; ++e) d += double{q[e]} * K[l][(j * 2 + kh) * kD + e];
              s.push_back(d * 0.25);
              keys.push_back(j);
            }
            const double m = *std::max_element(s.begin(), s.end());
            double z = 0;
            for (double x : s) z += std::exp(x - m);
            for (int64_t e = 0; e < kD; ++e) {
              double acc = 0;
              for (size_t r = 0; r < keys.size(); ++r)
                acc += std::exp(s[r] - m) / z * V[l][(keys[r] * 2 + kh) * kD + e];
              o[(t * kHead + kh * 2 + g) * kD + e] = static_cast<float>(acc);
            }
          }
        }
      }
      want.insert(want.end(), o.begin(), o.end());
    }
    pos0 += n;
  }
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t j = 0; j < got.size(); ++j) worst = std::max(worst, std::abs(double{got[j]} - want[j]));
  EXPECT_LT(worst, 1e-5);
}

TEST(Quest, ABudgetCoveringTheContextIsBitIdenticalToNoSelection) {
  ThreadPool pool(2);
  const std::vector<int64_t> sizes{70, 50, 1, 1, 1, 1};
  const auto ps = make_passes(sizes, 2);
  MemoryLedger l0, l1;
  ResidentKv plain(geometry(cpu::KvDtype::kF16), 128, kHead, l0, pool, cpu::best_isa());
  ResidentKv q(geometry(cpu::KvDtype::kF16), 128, kHead, l1, pool, cpu::best_isa(), quest(128, 16));
  const auto a = run(plain, sizes, ps), b = run(q, sizes, ps);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  // A smaller budget changes the decode steps only: the prefill outputs are the dense ones.
  MemoryLedger l2;
  ResidentKv small(geometry(cpu::KvDtype::kF16), 128, kHead, l2, pool, cpu::best_isa(), quest(32, 16));
  const auto c = run(small, sizes, ps);
  const size_t prefill = static_cast<size_t>(120 * kHead * kD * 2);
  EXPECT_EQ(std::memcmp(a.data(), c.data(), prefill * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(a.data() + prefill, c.data() + prefill, (a.size() - prefill) * sizeof(float)), 0);
}

TEST(Quest, PageMustDivideTheBlockAndKiviIsRefused) {
  ThreadPool pool(1);
  MemoryLedger ledger;
  EXPECT_THROW(
      ResidentKv(geometry(cpu::KvDtype::kF16), 128, kHead, ledger, pool, cpu::Isa::kScalar, quest(32, 12)),
      Error);
  KvOptions o = quest(32, 16);
  o.placement.placement = policy::Placement::kLayer;
  EXPECT_NO_THROW(check_placement_options(o));
  o.representation = policy::Representation::kKivi4;
  EXPECT_THROW(check_placement_options(o), Error);
}

std::string disk_dir() {
  const auto d = std::filesystem::path(KVTIER_BINARY_DIR) / "test_tmp" / "quest_disk";
  std::filesystem::create_directories(d);
  return d.string();
}

// layer and headinfer, host and disk homes: the decode steps attend the pages the resident placement
// attends (same selection; f32 rows, only the attention's tiling differs), prefill is bit-identical,
// the loads move the selected rows only, and a budget covering the context is bit-identical to the
// placement without quest.
TEST(Quest, OffloadedPlacementsLoadOnlyTheSelectedPagesAndMatchResident) {
  ThreadPool pool(2);
  const int64_t page = 8, budget = 40, cap = 256;
  const std::vector<int64_t> sizes{100, 96, 1, 1, 1, 1, 1, 1, 1, 1};
  const auto ps = make_passes(sizes, 2);
  KvGeometry geo = geometry(cpu::KvDtype::kF32);
  geo.block_tokens = 64;  // whole 4 KiB home pages: 64 rows x 16 x 4 bytes
  MemoryLedger lr;
  ResidentKv res(geo, cap, kHead, lr, pool, cpu::best_isa(), quest(budget, page));
  const auto want = run(res, sizes, ps);
  const size_t prefill = static_cast<size_t>(196 * kHead * kD * 2);
  for (const auto placement : {policy::Placement::kLayer, policy::Placement::kHeadInfer}) {
    for (const bool disk : {false, true}) {
      const std::string what = fmt::format(
          "{} {}", placement == policy::Placement::kLayer ? "layer" : "headinfer", disk ? "disk" : "host");
      auto options = [&](int64_t b) {
        KvOptions o = b > 0 ? quest(b, page) : KvOptions{};
        o.placement.placement = placement;
        if (placement == policy::Placement::kHeadInfer) o.placement.group = 1;
        if (disk) o.disk_dir = disk_dir();
        return o;
      };
      MemoryLedger l0, l1, l2;
      TieredKv plain(geo, cap, kHead, l0, pool, cpu::best_isa(), options(0));
      TieredKv sel(geo, cap, kHead, l1, pool, cpu::best_isa(), options(budget));
      TieredKv all(geo, cap, kHead, l2, pool, cpu::best_isa(), options(cap));
      const auto a = run(plain, sizes, ps), b = run(sel, sizes, ps), c = run(all, sizes, ps);
      ASSERT_EQ(b.size(), want.size()) << what;
      EXPECT_EQ(std::memcmp(b.data(), want.data(), prefill * sizeof(float)), 0) << what;
      double worst = 0;
      for (size_t j = prefill; j < b.size(); ++j) worst = std::max(worst, std::abs(double{b[j]} - want[j]));
      EXPECT_LT(worst, 1e-5) << what;
      EXPECT_EQ(std::memcmp(a.data(), c.data(), a.size() * sizeof(float)), 0) << what;
      const TieredStats st = sel.stats();
      EXPECT_EQ(st.quest.layer_steps, 8u * 2) << what;  // 8 decode steps x 2 layers, one sequence
      EXPECT_GE(st.quest.selective_loads, st.quest.layer_steps) << what;
      EXPECT_LT(st.quest.rows_fetched * 4, st.quest.rows_total) << what;  // 36 of 196..203 rows per head
      EXPECT_EQ(all.stats().quest.layer_steps, 0u) << what;
      if (!disk) {  // host: row-granular loads (a disk home rounds each page of 8 rows to a 4 KiB I/O)
        EXPECT_LT(st.transfer.bytes_loaded, plain.stats().transfer.bytes_loaded) << what;
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::kv
