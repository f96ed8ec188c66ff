// H2O retention on the KV store alone: the attention mass of each key against a direct softmax (every
// ISA, f16 and f32 rows, causal mask, window, soft-cap); an H2oKv whose budget covers the context is
// bit-identical to the resident placement; with a small budget, the rows kept and the outputs match a
// direct simulation of H2O (recent rows + the best-scored older ones per KV head, evicted after each
// pass); memory stays within budget + pass; truncation into evicted rows is a clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "backend/cpu/attention_mass.h"
#include "core/error.h"
#include "core/half.h"
#include "kv/h2o_kv.h"
#include "kv/resident_kv.h"

namespace kvtier::kv {
namespace {

constexpr int64_t kDk = 16, kDv = 16;
constexpr uint32_t kHead = 4;

std::vector<cpu::Isa> isas() {
  std::vector<cpu::Isa> out{cpu::Isa::kScalar};
  if (cpu::best_isa() >= cpu::Isa::kAvx2) out.push_back(cpu::Isa::kAvx2);
  if (cpu::best_isa() >= cpu::Isa::kAvx512) out.push_back(cpu::Isa::kAvx512);
  return out;
}

TEST(KeyMass, MatchesADirectSoftmax) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  ThreadPool pool(2);
  const int64_t hk = 2, G = 2, n_keys = 75, n_q = 9, pos0 = 66;  // queries at 66..74, keys 0..74
  for (cpu::Isa isa : isas()) {
    for (cpu::KvDtype dt : {cpu::KvDtype::kF32, cpu::KvDtype::kF16}) {
      for (const auto& [window, softcap] :
           std::vector<std::pair<int64_t, float>>{{0, 0.0f}, {20, 0.0f}, {0, 5.0f}}) {
        std::vector<float> k(hk * n_keys * kDk), v(hk * n_keys * kDv), q(n_q * hk * G * kDk);
        for (auto* x : {&k, &v, &q}) {
          for (float& e : *x) e = nd(rng);
        }
        std::vector<uint16_t> k16(k.size()), v16(v.size());
        for (size_t i = 0; i < k.size(); ++i) k16[i] = f32_to_f16(k[i]), k[i] = f16_to_f32(k16[i]);
        for (size_t i = 0; i < v.size(); ++i) v16[i] = f32_to_f16(v[i]);
        const bool f16 = dt == cpu::KvDtype::kF16;
        cpu::AttnParams ap;
        ap.head_dim_k = kDk;
        ap.head_dim_v = kDv;
        ap.q_per_kv = G;
        ap.scale = 0.3f;
        ap.softcap = softcap;
        ap.window = window;
        ap.kv_dtype = dt;
        cpu::KvSpan span{0,
                         n_keys,
                         f16 ? static_cast<const void*>(k16.data()) : k.data(),
                         f16 ? static_cast<const void*>(v16.data()) : v.data(),
                         n_keys * kDk,
                         n_keys * kDv};
        const cpu::AttnQueries aq{q.data(), hk * G * kDk, n_q, hk * G, pos0};
        std::vector<float> o(n_q * hk * G * kDv), lse(n_q * hk * G);
        std::vector<uint8_t> scratch(cpu::attention_scratch_bytes(ap, pool.size()));
        cpu::attend(pool, isa, ap, aq, std::span(&span, 1), {o.data(), hk * G * kDv, lse.data(), hk * G},
                    scratch);
        std::vector<float> mass(hk * 80, 0.0f);
        cpu::accumulate_key_mass(pool, isa, ap, aq, span, lse.data(), hk * G, mass.data(), 80);
        for (int64_t h = 0; h < hk; ++h) {
          std::vector<double> ref(n_keys, 0.0);
          for (int64_t t = 0; t < n_q; ++t) {
            for (int64_t g = 0; g < G; ++g) {
              std::vector<double> s(n_keys, -INFINITY);
              double m = -INFINITY;
              for (int64_t j = 0; j <= pos0 + t; ++j) {
                if (window > 0 && pos0 + t - j >= window) continue;
                double d = 0;
                for (int64_t i = 0; i < kDk; ++i)
                  d += double{q[(t * hk * G + h * G + g) * kDk + i]} * k[(h * n_keys + j) * kDk + i];
                d *= 0.3;
                if (softcap > 0) d = softcap * std::tanh(d / softcap);
                s[j] = d;
                m = std::max(m, d);
              }
              double z = 0;
              for (double x : s) z += std::exp(x - m);
              for (int64_t j = 0; j < n_keys; ++j) ref[j] += std::exp(s[j] - m) / z;
            }
          }
          double total = 0;
          for (int64_t j = 0; j < n_keys; ++j) {
            EXPECT_NEAR(mass[h * 80 + j], ref[j], 2e-5) << "isa " << static_cast<int>(isa) << " key " << j;
            total += mass[h * 80 + j];
          }
          EXPECT_NEAR(total, double(n_q * G), 1e-3);  // each query row's probabilities sum to 1
          EXPECT_EQ(mass[h * 80 + 77], 0.0f);         // beyond the span: untouched
        }
      }
    }
  }
}

KvGeometry geometry(std::vector<int64_t> window = {}) {
  KvGeometry g;
  g.n_head_kv = {2, 2};
  g.head_dim_k = kDk;
  g.head_dim_v = kDv;
  g.block_tokens = 32;
  g.dtype = cpu::KvDtype::kF32;
  g.window = window;
  return g;
}

KvOptions h2o(int64_t budget, int64_t max_new, double recent = 0.5) {
  KvOptions o;
  o.retention = policy::Retention::kH2o;
  o.knobs.budget = budget;
  o.knobs.h2o_recent = recent;
  o.max_new_rows = max_new;
  return o;
}

struct Rows {
  std::vector<float> q, k, v;  // [n][heads][d]
};

// Random rows for a pass (same stream for every cache fed with the same seed).
Rows rows(std::mt19937& rng, int64_t n, int64_t hk) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Rows r{std::vector<float>(n * kHead * kDk), std::vector<float>(n * hk * kDk),
         std::vector<float>(n * hk * kDv)};
  for (auto* x : {&r.q, &r.k, &r.v}) {
    for (float& e : *x) e = nd(rng);
  }
  return r;
}

std::vector<float> run(KvCache& kv, const std::vector<int64_t>& sizes, uint32_t seed = 11) {
  std::mt19937 rng(seed);
  std::vector<float> out;
  for (int64_t n : sizes) {
    kv.begin_pass({0, n});
    for (uint32_t l = 0; l < kv.geometry().n_layer(); ++l) {
      const Rows r = rows(rng, n, kv.geometry().n_head_kv[l]);
      std::vector<float> o(n * kHead * kDv);
      kv.write(l, {r.k.data(), r.v.data()});
      kv.attend(l, r.q.data(), kHead, {0.25f, 0.0f, kv.geometry().window_of(l)}, o.data());
      out.insert(out.end(), o.begin(), o.end());
    }
    kv.end_pass();
  }
  return out;
}

TEST(H2oKv, ABudgetCoveringTheContextIsBitIdenticalToResident) {
  ThreadPool pool(2);
  for (const auto& win : std::vector<std::vector<int64_t>>{{}, {40, 0}}) {  // a sliding layer too
    for (cpu::KvDtype dt : {cpu::KvDtype::kF32, cpu::KvDtype::kF16}) {
      KvGeometry g = geometry(win);
      g.dtype = dt;
      const std::vector<int64_t> sizes{50, 50, 27, 1, 1, 1, 1};
      MemoryLedger l0, l1;
      ResidentKv res(g, 200, kHead, l0, pool, cpu::best_isa());
      H2oKv h(g, 200, kHead, l1, pool, cpu::best_isa(), h2o(200, 50));
      const auto a = run(res, sizes), b = run(h, sizes);
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << "window " << win.size();
      if (!win.empty()) {
        EXPECT_LT(h.rows(0, 0), 131);  // the sliding layer dropped what its window hides
      }
      EXPECT_EQ(h.rows(0, 1), 131);
    }
  }
}

// H2O simulated directly: per KV head a list of (position, k, v, score); attention over the list in
// double (rows of this pass visible causally), scores += probabilities, then eviction.
struct SimHead {
  std::vector<int64_t> pos;
  std::vector<std::vector<float>> k, v;
  std::vector<double> score;
};

TEST(H2oKv, KeepsTheRecentRowsAndTheHeavyHittersAsADirectSimulationDoes) {
  ThreadPool pool(2);
  const int64_t budget = 24, recent = 8;
  const std::vector<int64_t> sizes{16, 16, 16, 5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 7, 1, 1};
  MemoryLedger ledger;
  const KvGeometry g = geometry();
  H2oKv kv(g, 200, kHead, ledger, pool, cpu::best_isa(), h2o(budget, 16, double(recent) / budget));

  std::mt19937 rng(11);
  std::vector<float> got, want;
  std::vector<std::vector<SimHead>> sim(2, std::vector<SimHead>(2));
  int64_t pos0 = 0;
  for (int64_t n : sizes) {
    kv.begin_pass({0, n});
    for (uint32_t l = 0; l < 2; ++l) {
      const Rows r = rows(rng, n, 2);
      std::vector<float> o(n * kHead * kDv);
      kv.write(l, {r.k.data(), r.v.data()});
      kv.attend(l, r.q.data(), kHead, {0.25f, 0.0f, 0}, o.data());
      got.insert(got.end(), o.begin(), o.end());
      for (int64_t h = 0; h < 2; ++h) {
        SimHead& s = sim[l][h];
        const size_t old = s.pos.size();
        for (int64_t t = 0; t < n; ++t) {
          s.pos.push_back(pos0 + t);
          s.k.emplace_back(r.k.begin() + (t * 2 + h) * kDk, r.k.begin() + (t * 2 + h + 1) * kDk);
          s.v.emplace_back(r.v.begin() + (t * 2 + h) * kDv, r.v.begin() + (t * 2 + h + 1) * kDv);
          s.score.push_back(0.0);
        }
        std::vector<double> delta(s.pos.size(), 0.0);
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t gq = 0; gq < 2; ++gq) {
            const float* q = r.q.data() + (t * kHead + h * 2 + gq) * kDk;
            const size_t visible = old + static_cast<size_t>(t) + 1;
            std::vector<double> sc(visible);
            double m = -INFINITY, z = 0;
            for (size_t j = 0; j < visible; ++j) {
              double d = 0;
              for (int64_t i = 0; i < kDk; ++i) d += double{q[i]} * s.k[j][i];
              sc[j] = d * 0.25;
              m = std::max(m, sc[j]);
            }
            for (double x : sc) z += std::exp(x - m);
            for (int64_t i = 0; i < kDv; ++i) {
              double acc = 0;
              for (size_t j = 0; j < visible; ++j) acc += std::exp(sc[j] - m) / z * s.v[j][i];
              o[(t * kHead + h * 2 + gq) * kDv + i] = static_cast<float>(acc);
            }
            for (size_t j = 0; j < visible; ++j) delta[j] += std::exp(sc[j] - m) / z;
          }
        }
        for (size_t j = 0; j < delta.size(); ++j) s.score[j] += delta[j];
        if (static_cast<int64_t>(s.pos.size()) > budget) {  // evict: recent + best-scored older rows
          const size_t cand = s.pos.size() - recent;
          std::vector<size_t> order(cand);
          for (size_t j = 0; j < cand; ++j) order[j] = j;
          std::stable_sort(order.begin(), order.end(),
                           [&](size_t a, size_t b) { return s.score[a] > s.score[b]; });
          std::vector<bool> keep(s.pos.size(), false);
          for (size_t j = cand; j < keep.size(); ++j) keep[j] = true;
          for (int64_t j = 0; j < budget - recent; ++j) keep[order[j]] = true;
          SimHead t;
          for (size_t j = 0; j < keep.size(); ++j) {
            if (!keep[j]) continue;
            t.pos.push_back(s.pos[j]), t.k.push_back(s.k[j]), t.v.push_back(s.v[j]),
                t.score.push_back(s.score[j]);
          }
          s = t;
        }
      }
      want.insert(want.end(), o.begin(), o.end());
    }
    kv.end_pass();
    pos0 += n;
    for (uint32_t l = 0; l < 2; ++l) {
      ASSERT_LE(kv.rows(0, l), budget);
      for (uint32_t h = 0; h < 2; ++h) {
        const SimHead& s = sim[l][h];
        ASSERT_EQ(kv.rows(0, l), static_cast<int64_t>(s.pos.size())) << "after position " << pos0;
        for (int64_t r = 0; r < kv.rows(0, l); ++r) {
          ASSERT_EQ(kv.position(0, l, h, r), s.pos[r]) << "layer " << l << " head " << h << " at " << pos0;
          EXPECT_NEAR(kv.score(0, l, h, r), s.score[r], 1e-4);
        }
      }
    }
  }
  ASSERT_EQ(got.size(), want.size());
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(double{got[i]} - want[i]));
  EXPECT_LT(worst, 1e-5);
  // The heads kept different positions (eviction is per KV head).
  bool differ = false;
  for (int64_t r = 0; r < kv.rows(0, 0); ++r) differ |= kv.position(0, 0, 0, r) != kv.position(0, 0, 1, r);
  EXPECT_TRUE(differ);
}

TEST(H2oKv, TruncationOnlyWithinTheRecentRows) {
  ThreadPool pool(1);
  MemoryLedger ledger;
  H2oKv kv(geometry(), 200, kHead, ledger, pool, cpu::Isa::kScalar, h2o(24, 16, 0.5));
  run(kv, {16, 16, 16});
  // The newest position where the two KV heads of some layer disagree: truncating at or below it
  // would drop different positions per head.
  int64_t differ = -1;
  for (uint32_t l = 0; l < 2; ++l) {
    for (int64_t r = 0; r < kv.rows(0, l); ++r) {
      if (kv.position(0, l, 0, r) != kv.position(0, l, 1, r))
        differ = std::max({differ, kv.position(0, l, 0, r), kv.position(0, l, 1, r)});
    }
  }
  ASSERT_GE(differ, 0) << "the heads kept the same positions";
  ASSERT_LT(differ, 36);  // never inside the recent rows 36..47
  EXPECT_THROW(kv.truncate(0, differ), Error);
  EXPECT_NO_THROW(kv.truncate(0, 44));  // inside the 12 recent rows, which every head holds
  EXPECT_EQ(kv.positions(0), 44);
  EXPECT_EQ(kv.rows(0, 0), 20);
  EXPECT_NO_THROW(kv.truncate(0, 0));
  EXPECT_EQ(kv.rows(0, 1), 0);
}

TEST(H2oKv, OffloadedPlacementsAndMissingBudgetAreClearErrors) {
  KvOptions o = h2o(24, 16);
  o.placement.placement = policy::Placement::kLayer;
  EXPECT_THROW(check_placement_options(o), Error);
  ThreadPool pool(1);
  MemoryLedger ledger;
  EXPECT_THROW(H2oKv(geometry(), 200, kHead, ledger, pool, cpu::Isa::kScalar, h2o(0, 16)), Error);
}

}  // namespace
}  // namespace kvtier::kv
