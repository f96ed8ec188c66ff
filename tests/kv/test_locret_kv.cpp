// Locret retention on the KV store alone (spec locret.md §7 B), with a context-free scorer (a hash of
// layer, KV head and position, as B5 asks) and a toy RoPE model hook: a budget covering the context is
// bit-identical to the resident placement (B1); the rows kept after every pass equal a direct
// simulation of the spec's algorithm, and with n_s = 0 the global top-b of every score seen so far
// (B5: an evicted position never comes back); the last n_s positions survive every non-final chunk
// and a rigged scorer evicts them on the final one while the n_loc tail stays (B3); positions rise
// strictly and stored scores are the scorer's (B4); each KV head keeps its own set (B6); outputs
// equal attention over the simulated rows at compact positions (B7, keys re-rotated after moves);
// rows held and the ledger's bytes are bounded by b + n_loc + B whatever the context (B2).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <vector>

#include "core/error.h"
#include "kv/locret_kv.h"
#include "kv/resident_kv.h"
#include "kv/token_spans.h"
#include "locret_toys.h"

namespace kvtier::kv {
namespace {

KvGeometry geometry(cpu::KvDtype dt = cpu::KvDtype::kF32, int64_t window0 = 0) {
  KvGeometry g;
  g.n_head_kv = {2, 2};
  if (window0 > 0) g.window = {window0, 0};  // layer 0 with a sliding window of its own
  g.head_dim_k = kDk;
  g.head_dim_v = kDv;
  g.block_tokens = 32;
  g.dtype = dt;
  return g;
}

KvOptions locret(int64_t budget, int64_t chunk, int64_t n_s, int64_t n_loc, std::shared_ptr<UnitScorer> sc) {
  KvOptions o;
  o.retention = policy::Retention::kLocret;
  o.knobs.budget = budget;
  o.knobs.stabilizers = n_s;
  o.knobs.local_tail = n_loc;
  o.max_new_rows = chunk;
  o.scorer = std::move(sc);
  return o;
}

// One simulated (layer, KV head): its rows in position order.
struct SimHead {
  std::vector<int64_t> pos;
  std::vector<float> score;
  std::vector<std::vector<float>> kpre, v;
};

// The spec's eviction (§3.4) of one head: the last n_protect rows (and the first n_sink rows,
// --locret-sinks) at +INF, the keep best by (key, later position), in position order. joins(p), when
// given (--locret-span): the token at position p continues the span of the token at p - 1; a row's key
// is then the best score of the held rows at consecutive positions joined to it.
void sim_evict(SimHead& s, int64_t keep, int64_t n_protect, int64_t n_sink = 0,
               const std::function<bool(int64_t)>& joins = {}) {
  const auto n = static_cast<int64_t>(s.pos.size());
  if (n <= keep) return;
  std::vector<int64_t> idx(n);
  for (int64_t i = 0; i < n; ++i) idx[i] = i;
  auto joined = [&](int64_t i) { return joins && i > 0 && s.pos[i - 1] == s.pos[i] - 1 && joins(s.pos[i]); };
  auto span_score = [&](int64_t i) {
    float best = s.score[i];
    for (int64_t j = i; joined(j); --j) best = std::max(best, s.score[j - 1]);
    for (int64_t j = i + 1; j < n && joined(j); ++j) best = std::max(best, s.score[j]);
    return best;
  };
  auto key = [&](int64_t i) { return i >= n - n_protect || i < n_sink ? INFINITY : span_score(i); };
  std::sort(idx.begin(), idx.end(),
            [&](int64_t a, int64_t b) { return key(a) != key(b) ? key(a) > key(b) : s.pos[a] > s.pos[b]; });
  idx.resize(keep);
  std::sort(idx.begin(), idx.end());
  SimHead t;
  for (int64_t i : idx) {
    t.pos.push_back(s.pos[i]), t.score.push_back(s.score[i]), t.kpre.push_back(s.kpre[i]),
        t.v.push_back(s.v[i]);
  }
  s = t;
}

struct Driver {
  LocretKv& kv;
  HashScorer& scorer;
  int64_t b, n_s;
  std::mt19937 rng{5};
  std::vector<std::vector<SimHead>> sim = std::vector<std::vector<SimHead>>(2, std::vector<SimHead>(2));
  int64_t length = 0;
  int64_t plan_end = 0;
  double max_err = 0;

  bool original = false;  // --locret-positions original: rows and queries at their true positions
  // One pass of n tokens; checks outputs against attention over the simulated rows at compact
  // positions (original: at their true positions).
  void pass(int64_t n) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    if (static_cast<int64_t>(sim[0][0].pos.size()) + n > cap) {  // out of room: evict as a non-final chunk
      const int64_t keep = std::min(b, cap - n);
      for (auto& layer : sim) {
        for (SimHead& s : layer) sim_evict(s, keep, std::min(n_s, keep), n_sink, joins);
      }
    }
    const std::span<const int32_t> toks = tokens.empty()
                                              ? std::span<const int32_t>()
                                              : std::span(tokens).subspan(static_cast<size_t>(length), n);
    const PassPositions pp = kv.begin_pass({0, n, toks});
    const int64_t held = static_cast<int64_t>(sim[0][0].pos.size());
    EXPECT_EQ(pp.pos0, original ? length : held);  // compact: the pass continues from the rows held
    for (uint32_t l = 0; l < 2; ++l) {
      ToyLayerRows tl = toy_layer_rows(n, pp.pos0, rng, nd);
      auto &q_pre = tl.q_pre, &k_pre = tl.k_pre, &v = tl.v, &q = tl.q, &k = tl.k;
      std::vector<float> o(n * kHead * kDv);
      LayerRows rows;
      rows.k = k.data(), rows.v = v.data(), rows.q_pre = q_pre.data(), rows.k_pre = k_pre.data();
      kv.write(l, rows);
      kv.attend(l, q.data(), kHead, {0.25f, 0.0f, 0}, o.data());
      for (int64_t h = 0; h < 2; ++h) {
        SimHead& s = sim[l][h];
        for (int64_t t = 0; t < n; ++t) {
          s.pos.push_back(length + t);
          s.score.push_back(scorer.value(l, h, length + t));
          s.kpre.emplace_back(&k_pre[(t * 2 + h) * kDk], &k_pre[(t * 2 + h + 1) * kDk]);
          s.v.emplace_back(&v[(t * 2 + h) * kDv], &v[(t * 2 + h + 1) * kDv]);
        }
        for (int64_t t = 0; t < n; ++t) {  // attention at compact (or true) positions, in double
          for (int64_t g = 0; g < 2; ++g) {
            std::vector<float> qr(kDk);
            toy_rope(&q_pre[(t * kHead + h * 2 + g) * kDk], pp.pos0 + t, qr.data());
            const int64_t visible = held + t + 1;
            std::vector<double> sc(visible);
            double m = -INFINITY, z = 0;
            for (int64_t j = 0; j < visible; ++j) {
              std::vector<float> kr(kDk);
              toy_rope(s.kpre[j].data(), original ? s.pos[j] : j, kr.data());
              double d = 0;
              for (int64_t i = 0; i < kDk; ++i) d += double{qr[i]} * kr[i];
              sc[j] = d * 0.25;
              m = std::max(m, sc[j]);
            }
            for (double x : sc) z += std::exp(x - m);
            for (int64_t i = 0; i < kDv; ++i) {
              double acc = 0;
              for (int64_t j = 0; j < visible; ++j) acc += std::exp(sc[j] - m) / z * s.v[j][i];
              max_err = std::max(max_err, std::abs(acc - o[(t * kHead + h * 2 + g) * kDv + i]));
            }
          }
        }
      }
    }
    kv.end_pass();
    length += n;
    if (length <= plan_end) {  // a chunk of the planned prefill evicts
      const bool final_chunk = length == plan_end;
      for (auto& layer : sim) {
        for (SimHead& s : layer) sim_evict(s, b, final_chunk ? 0 : n_s, n_sink, joins);
      }
    }
  }
  void prefill(int64_t n, int64_t chunk) {
    const std::vector<int64_t> plan = kv.plan_prefill(0, n, chunk);
    plan_end = length + std::max<int64_t>(0, n - kv_local_tail);
    for (int64_t m : plan) pass(m);
  }
  int64_t kv_local_tail = 0;
  int64_t n_sink = 0;                  // --locret-sinks
  std::vector<int32_t> tokens;         // [positions] token ids handed to each pass (--locret-span)
  std::function<bool(int64_t)> joins;  // --locret-span: whether the token at p continues the one at p - 1
  int64_t cap = int64_t{1} << 40;      // rows per (layer, KV head): b + n_loc + B
  // The cache holds exactly the simulated rows (positions and scores) in every (layer, KV head).
  void expect_same_rows() {
    const auto held = static_cast<int64_t>(sim[0][0].pos.size());
    ASSERT_EQ(kv.rows(0), held);
    for (uint32_t l = 0; l < 2; ++l) {
      for (uint32_t h = 0; h < 2; ++h) {
        for (int64_t r = 0; r < held; ++r) {
          ASSERT_EQ(kv.position(0, l, h, r), sim[l][h].pos[r])
              << "layer " << l << " head " << h << " row " << r;
          ASSERT_EQ(kv.score(0, l, h, r), sim[l][h].score[r]);
          if (r > 0) {
            ASSERT_LT(kv.position(0, l, h, r - 1), kv.position(0, l, h, r));  // B4
          }
        }
      }
    }
  }
};

TEST(LocretKv, ABudgetCoveringTheContextIsBitIdenticalToResident) {
  ThreadPool pool(2);
  for (const auto positions : {policy::LocretPositions::kCompact, policy::LocretPositions::kOriginal})
    for (cpu::KvDtype dt : {cpu::KvDtype::kF32, cpu::KvDtype::kF16}) {
      const KvGeometry g = geometry(dt);
      MemoryLedger l0, l1;
      ResidentKv res(g, 300, kHead, l0, pool, cpu::best_isa());
      auto sc = std::make_shared<HashScorer>();
      ToyCompute tc;
      KvOptions o = locret(300, 40, 10, 20, sc);
      o.knobs.locret_positions = positions;
      LocretKv loc(g, 300, kHead, l1, pool, cpu::best_isa(), o);
      loc.set_compute(&tc);
      const std::vector<int64_t> plan = loc.plan_prefill(0, 150, 40);
      EXPECT_EQ(plan, (std::vector<int64_t>{40, 40, 40, 10, 20}));  // 130 evicting, then the 20-token tail
      std::vector<int64_t> sizes = plan;
      for (int i = 0; i < 5; ++i) sizes.push_back(1);
      std::vector<float> out[2];
      KvCache* caches[2] = {&res, &loc};
      for (int c = 0; c < 2; ++c) {
        std::mt19937 rng(9);
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (int64_t n : sizes) {
          const PassPositions pp = caches[c]->begin_pass({0, n});
          for (uint32_t l = 0; l < 2; ++l) {
            std::vector<float> q(n * kHead * kDk), k(n * 2 * kDk), v(n * 2 * kDv);
            for (auto* x : {&q, &k, &v}) {
              for (float& e : *x) e = nd(rng);
            }
            LayerRows rows;
            rows.k = k.data(), rows.v = v.data(), rows.q_pre = q.data(), rows.k_pre = k.data();
            std::vector<float> o(n * kHead * kDv);
            (void)pp;
            caches[c]->write(l, rows);
            caches[c]->attend(l, q.data(), kHead, {0.25f, 0.0f, 0}, o.data());
            out[c].insert(out[c].end(), o.begin(), o.end());
          }
          caches[c]->end_pass();
        }
      }
      ASSERT_EQ(out[0].size(), out[1].size());
      EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)), 0);
      EXPECT_EQ(loc.evictions(), 0u);
      EXPECT_EQ(loc.rows(0), 155);
    }
}

TEST(LocretKv, KeepsWhatADirectSimulationOfTheSpecKeeps) {
  ThreadPool pool(2);
  for (int levels : {0, 3}) {  // 3 levels: many ties, broken by the later position
    for (const auto& [n_s, n_loc] : std::vector<std::pair<int64_t, int64_t>>{{6, 9}, {0, 0}, {15, 3}}) {
      const int64_t b = 20, chunk = 16;
      auto sc = std::make_shared<HashScorer>(levels);
      ToyCompute tc;
      MemoryLedger ledger;
      LocretKv kv(geometry(), 4096, kHead, ledger, pool, cpu::best_isa(), locret(b, chunk, n_s, n_loc, sc));
      kv.set_compute(&tc);
      Driver d{kv, *sc, b, n_s};
      d.kv_local_tail = n_loc;
      const std::vector<int64_t> plan = kv.plan_prefill(0, 131, chunk);
      d.plan_end = 131 - n_loc;
      std::set<int64_t> ever_evicted[2][2];
      int64_t done = 0;
      for (int64_t m : plan) {
        d.pass(m);
        done += m;
        d.expect_same_rows();
        if (HasFatalFailure()) return;
        const bool in_plan = done <= 131 - n_loc;
        const bool final_chunk = done == 131 - n_loc;
        if (in_plan) {
          EXPECT_EQ(kv.rows(0), std::min(b, done)) << "B2 after " << done;
        }
        for (uint32_t l = 0; l < 2; ++l) {
          for (uint32_t h = 0; h < 2; ++h) {
            std::set<int64_t> held;
            for (int64_t r = 0; r < kv.rows(0); ++r) held.insert(kv.position(0, l, h, r));
            if (in_plan && !final_chunk) {  // B3: the last min(n_s, b) positions survive
              for (int64_t p = done - std::min(n_s, b); p < done; ++p) EXPECT_TRUE(held.count(p)) << p;
            }
            if (n_s == 0 && in_plan) {  // B5: the global top-min(b, seen) of the scores seen so far
              std::vector<std::pair<float, int64_t>> all;
              for (int64_t p = 0; p < done; ++p) all.emplace_back(sc->value(l, h, p), p);
              std::sort(all.begin(), all.end(), std::greater<>());
              std::set<int64_t> top;
              for (int64_t i = 0; i < std::min(b, done); ++i) top.insert(all[i].second);
              EXPECT_EQ(held, top) << "after " << done;
            }
            for (int64_t p : ever_evicted[l][h])
              EXPECT_FALSE(held.count(p)) << "position " << p << " came back";
            for (int64_t p = 0; p < done; ++p) {
              if (!held.count(p)) ever_evicted[l][h].insert(p);
            }
          }
        }
      }
      // B2: after prefill min(b, n - n_loc) + n_loc rows, then one more per decoded token.
      EXPECT_EQ(kv.rows(0), std::min<int64_t>(b, 131 - n_loc) + n_loc);
      for (int i = 0; i < 3; ++i) d.pass(1);
      EXPECT_EQ(kv.rows(0), std::min<int64_t>(b, 131 - n_loc) + n_loc + 3);
      d.expect_same_rows();
      // B6: the KV heads of a layer keep different positions (hash scores differ per head).
      bool differ = false;
      for (int64_t r = 0; r < kv.rows(0); ++r) differ |= kv.position(0, 0, 0, r) != kv.position(0, 0, 1, r);
      EXPECT_TRUE(differ);
      EXPECT_LT(d.max_err, 2e-4) << "outputs vs attention over the simulated rows at compact positions";
      EXPECT_GT(kv.evictions(), 0u);
    }
  }
}

// --locret-sinks: the prompt's first positions stay through every eviction, the final chunk's and a
// decode overflow's included, and the rest is what the spec's simulation keeps with them at +INF
// (hash scores evict some of those positions without sinks, so the check can fail).
TEST(LocretKv, SinksStayThroughEveryEviction) {
  ThreadPool pool(2);
  for (int64_t n_sink : {0, 5}) {
    const int64_t b = 20, chunk = 16, n_s = 6, n_loc = 9;
    auto sc = std::make_shared<HashScorer>(3);
    ToyCompute tc;
    MemoryLedger ledger;
    KvOptions o = locret(b, chunk, n_s, n_loc, sc);
    o.knobs.locret_sinks = n_sink;
    LocretKv kv(geometry(), 4096, kHead, ledger, pool, cpu::best_isa(), o);
    kv.set_compute(&tc);
    Driver d{kv, *sc, b, n_s};
    d.kv_local_tail = n_loc;
    d.n_sink = n_sink;
    d.cap = b + n_loc + chunk;
    d.prefill(131, chunk);
    d.expect_same_rows();
    for (int i = 0; i < 2 * chunk; ++i) d.pass(1);  // past b + n_loc + B rows: evicts before a step
    d.expect_same_rows();
    if (HasFatalFailure()) return;
    bool all_first = true;
    for (uint32_t l = 0; l < 2; ++l)
      for (uint32_t h = 0; h < 2; ++h)
        for (int64_t r = 0; r < 5; ++r) all_first = all_first && kv.position(0, l, h, r) == r;
    EXPECT_EQ(all_first, n_sink == 5) << "sinks " << n_sink;
    EXPECT_LT(d.max_err, 2e-4);
    EXPECT_GT(kv.evictions(), 4u);
  }
  MemoryLedger ledger;
  KvOptions o = locret(20, 16, 6, 9, std::make_shared<HashScorer>(3));
  o.knobs.locret_sinks = 14;  // 14 + 6 stabilizers leave nothing to choose in a budget of 20
  EXPECT_THROW(
      policy::check_knobs(policy::KvPolicy{policy::Placement::kResident, policy::Representation::kF16,
                                           policy::Selection::kAll, policy::Retention::kLocret, o.knobs}),
      Error);
}

// --locret-span number|word: a number (a run of digit tokens) or a word ranks by the best score of
// its held tokens at consecutive positions, so it is kept or evicted whole (but where the budget cuts
// it: ties go to the later rows), through every eviction and after evictions broke a run; the rows
// kept are a direct simulation's, and differ from the token rule's.
TEST(LocretKv, SpansAreRankedByTheirBestScore) {
  ThreadPool pool(2);
  const std::vector<uint8_t> edges = toy_token_edges();
  const std::vector<int32_t> tokens = toy_tokens(200, 11);
  std::vector<int64_t> kept[3];
  for (const policy::LocretSpan span :
       {policy::LocretSpan::kToken, policy::LocretSpan::kNumber, policy::LocretSpan::kWord}) {
    const int64_t b = 24, chunk = 16, n_s = 6, n_loc = 9;
    auto sc = std::make_shared<HashScorer>(3);
    ToyCompute tc;
    MemoryLedger ledger;
    KvOptions o = locret(b, chunk, n_s, n_loc, sc);
    o.knobs.locret_span = span;
    o.token_edges = std::make_shared<const std::vector<uint8_t>>(edges);
    LocretKv kv(geometry(), 4096, kHead, ledger, pool, cpu::best_isa(), o);
    kv.set_compute(&tc);
    Driver d{kv, *sc, b, n_s};
    d.kv_local_tail = n_loc;
    d.cap = b + n_loc + chunk;
    d.tokens = tokens;
    if (span != policy::LocretSpan::kToken) {
      d.joins = [&](int64_t p) {
        return p > 0 && continues_span(span, edges[tokens[p - 1]], edges[tokens[p]]);
      };
    }
    d.prefill(131, chunk);
    d.expect_same_rows();
    for (int i = 0; i < 2 * chunk; ++i) d.pass(1);  // decode overflows evict too
    d.expect_same_rows();
    if (HasFatalFailure()) return;
    EXPECT_GT(kv.evictions(), 4u);
    EXPECT_LT(d.max_err, 2e-4);
    for (uint32_t l = 0; l < 2; ++l)
      for (uint32_t h = 0; h < 2; ++h)
        for (int64_t r = 0; r < kv.rows(0); ++r)
          kept[static_cast<int>(span)].push_back(kv.position(0, l, h, r));
  }
  EXPECT_NE(kept[0], kept[1]);  // the rule changes what is kept
  EXPECT_NE(kept[1], kept[2]);
  // A pass without its token ids cannot be linked: refused with a message.
  ThreadPool p1(1);
  MemoryLedger ledger;
  KvOptions o = locret(24, 16, 6, 9, std::make_shared<HashScorer>(3));
  o.knobs.locret_span = policy::LocretSpan::kWord;
  o.token_edges = std::make_shared<const std::vector<uint8_t>>(edges);
  LocretKv kv(geometry(), 4096, kHead, ledger, p1, cpu::best_isa(), o);
  EXPECT_THROW(kv.begin_pass({0, 4}), Error);
  const std::vector<int32_t> bad = {0, 1, 9, 2};  // id 9 is outside the table
  EXPECT_THROW(kv.begin_pass({0, 4, bad}), Error);
  o.token_edges = nullptr;
  EXPECT_THROW(LocretKv(geometry(), 4096, kHead, ledger, p1, cpu::best_isa(), o), Error);
}

// --locret-sliding: a layer with a sliding window of its own keeps its most recent rows after every
// eviction (recent, the default: the positions held are the last ones, contiguous) or the heads' best
// like a global layer (scored); the global layer is scored either way.
TEST(LocretKv, ASlidingWindowLayerKeepsItsMostRecentRowsUnlessScored) {
  ThreadPool pool(2);
  for (const policy::LocretSliding mode : {policy::LocretSliding::kRecent, policy::LocretSliding::kScored}) {
    auto sc = std::make_shared<HashScorer>(3);
    ToyCompute tc;
    MemoryLedger ledger;
    KvOptions o = locret(20, 16, 6, 9, sc);
    o.knobs.locret_sinks = 2;  // not kept on the sliding layer under recent: its window hides them
    o.knobs.locret_sliding = mode;
    LocretKv kv(geometry(cpu::KvDtype::kF32, 12), 4096, kHead, ledger, pool, cpu::best_isa(), o);
    kv.set_compute(&tc);
    std::mt19937 rng(3);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    int64_t length = 0;
    bool contiguous[2] = {true, true};  // [layer] the positions held were the last ones after every pass
    std::vector<int64_t> plan = kv.plan_prefill(0, 131, 16);
    plan.insert(plan.end(), 40, 1);  // decode steps past b + n_loc + B rows: evictions before a step
    for (int64_t n : plan) {
      const PassPositions pp = kv.begin_pass({0, n});
      for (uint32_t l = 0; l < 2; ++l) {
        ToyLayerRows tl = toy_layer_rows(n, pp.pos0, rng, nd);
        LayerRows rows;
        rows.k = tl.k.data(), rows.v = tl.v.data(), rows.q_pre = tl.q_pre.data(),
        rows.k_pre = tl.k_pre.data();
        std::vector<float> out(n * kHead * kDv);
        kv.write(l, rows);
        kv.attend(l, tl.q.data(), kHead, {0.25f, 0.0f, l == 0 ? 12 : 0}, out.data());
      }
      kv.end_pass();
      length += n;
      const int64_t held = kv.rows(0);
      for (uint32_t l = 0; l < 2; ++l)
        for (uint32_t h = 0; h < 2; ++h)
          for (int64_t r = 0; r < held; ++r)
            contiguous[l] = contiguous[l] && kv.position(0, l, h, r) == length - held + r;
    }
    EXPECT_GT(kv.evictions(), 5u);
    EXPECT_EQ(contiguous[0], mode == policy::LocretSliding::kRecent) << policy::locret_sliding_name(mode);
    EXPECT_FALSE(contiguous[1]) << policy::locret_sliding_name(mode);
  }
  EXPECT_EQ(policy::parse_locret_sliding("scored"), policy::LocretSliding::kScored);
  EXPECT_THROW(policy::parse_locret_sliding("window"), Error);
}

TEST(LocretKv, TheFinalChunkMayEvictTheStabilizersButNotTheLocalTail) {
  ThreadPool pool(2);
  auto sc = std::make_shared<HashScorer>(0, true);  // the most recent units score lowest
  ToyCompute tc;
  MemoryLedger ledger;
  const int64_t b = 12, n_s = 5, n_loc = 4;
  LocretKv kv(geometry(), 4096, kHead, ledger, pool, cpu::best_isa(), locret(b, 8, n_s, n_loc, sc));
  kv.set_compute(&tc);
  const std::vector<int64_t> plan = kv.plan_prefill(0, 44, 8);  // 40 evicting in 5 chunks, 4 tail
  int64_t done = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const int64_t n = plan[i];
    kv.begin_pass({0, n});
    for (uint32_t l = 0; l < 2; ++l) {
      std::vector<float> q(n * kHead * kDk, 0.1f), k(n * 2 * kDk, 0.1f), v(n * 2 * kDv, 0.1f),
          o(n * kHead * kDv);
      LayerRows rows;
      rows.k = k.data(), rows.v = v.data(), rows.q_pre = q.data(), rows.k_pre = k.data();
      kv.write(l, rows);
      kv.attend(l, q.data(), kHead, {0.25f, 0.0f, 0}, o.data());
    }
    kv.end_pass();
    done += n;
    std::set<int64_t> held;
    for (int64_t r = 0; r < kv.rows(0); ++r) held.insert(kv.position(0, 1, 1, r));
    if (done < 40) {  // non-final: the oldest b - n_s (best by the rigged score) and the last n_s
      for (int64_t p = done - n_s; p < done; ++p) EXPECT_TRUE(held.count(p)) << done << ": " << p;
    } else if (done == 40) {  // final: plain top-b of the pool (0..6 and the last chunk's stabilizers
                              // 27..31 survived so far), so the new stabilizers 35..39 go
      EXPECT_EQ(held, (std::set<int64_t>{0, 1, 2, 3, 4, 5, 6, 27, 28, 29, 30, 31}));
    } else {
      EXPECT_EQ(kv.rows(0), b + n_loc);
      for (int64_t p = 40; p < 44; ++p) EXPECT_TRUE(held.count(p)) << "tail position " << p;
    }
  }
}

TEST(LocretKv, MemoryIsBoundedByTheBudgetWhateverTheContext) {
  ThreadPool pool(2);
  ToyCompute tc;
  auto sc = std::make_shared<HashScorer>();
  const KvGeometry g = geometry(cpu::KvDtype::kF16);
  MemoryLedger small, large;
  LocretKv a(g, 1000, kHead, small, pool, cpu::best_isa(), locret(32, 16, 8, 8, sc));
  LocretKv kv(g, 1 << 20, kHead, large, pool, cpu::best_isa(), locret(32, 16, 8, 8, sc));
  kv.set_compute(&tc);
  EXPECT_EQ(small.current(Tier::kDevice, Category::kKv), large.current(Tier::kDevice, Category::kKv));
  // b + n_loc + B = 56 rows of (K, K before RoPE, V) f16 + position + score per (layer, KV head).
  EXPECT_EQ(large.current(Tier::kDevice, Category::kKv), 2u * 2u * 56u * (3u * 16u * 2u + 8u + 4u));
  Driver d{kv, *sc, 32, 8};
  d.kv_local_tail = 8;
  d.cap = 56;
  d.prefill(600, 16);
  EXPECT_EQ(kv.rows(0), 40);
  int64_t most = 0;
  for (int i = 0; i < 100; ++i) {  // decoding past the rows' room evicts to b first (never overflows)
    d.pass(1);
    most = std::max(most, kv.rows(0));
  }
  EXPECT_LE(most, 56);
  d.expect_same_rows();
  EXPECT_LT(d.max_err, 2e-3);  // f16 rows
  EXPECT_EQ(kv.positions(0), 700);
  EXPECT_EQ(large.peak(Tier::kDevice, Category::kKv), large.current(Tier::kDevice, Category::kKv));
}

// --locret-keys rerotate keeps no pre-RoPE copy: a moved key is its stored key turned by the distance
// it moved. Through many evictions (keys moved again and again) the outputs stay those of attention over
// the spec's rows at compact positions (RoPE from the pre-RoPE key, in double), within rounding; the
// rows kept are the same; the rows cost a third less with f16 K and V.
TEST(LocretKv, RerotatedKeysGiveTheSpecsAttentionWithoutPreRopeCopies) {
  ThreadPool pool(2);
  ToyCompute tc;
  auto sc = std::make_shared<HashScorer>();
  for (const cpu::KvDtype dt : {cpu::KvDtype::kF32, cpu::KvDtype::kF16}) {
    double err[2] = {0, 0};
    uint64_t bytes[2] = {0, 0};
    for (const policy::LocretKeys keys : {policy::LocretKeys::kPreRope, policy::LocretKeys::kRerotate}) {
      KvOptions o = locret(32, 16, 8, 8, sc);
      o.knobs.locret_keys = keys;
      MemoryLedger ledger;
      LocretKv kv(geometry(dt), 4096, kHead, ledger, pool, cpu::best_isa(), o);
      kv.set_compute(&tc);
      Driver d{kv, *sc, 32, 8};
      d.kv_local_tail = 8;
      d.cap = 56;
      d.prefill(600, 16);  // 37 evictions: an old key moves up to 36 times
      for (int i = 0; i < 30; ++i) d.pass(1);
      d.expect_same_rows();
      EXPECT_GT(kv.evictions(), 30u);
      const auto m = static_cast<size_t>(keys);
      err[m] = d.max_err;
      bytes[m] = ledger.current(Tier::kDevice, Category::kKv);
    }
    const double bound = dt == cpu::KvDtype::kF32 ? 2e-4 : 2e-3;
    EXPECT_LT(err[0], bound) << "prerope";
    EXPECT_LT(err[1], bound) << "rerotate";
    const uint64_t row = dt == cpu::KvDtype::kF32 ? 4u : 2u;
    // b + n_loc + B = 56 rows per (layer, KV head) of K, V (and K before RoPE) + position + score.
    EXPECT_EQ(bytes[0], 2u * 2u * 56u * (3u * 16u * row + 8u + 4u));
    EXPECT_EQ(bytes[1], 2u * 2u * 56u * (2u * 16u * row + 8u + 4u));
  }
}

// --locret-positions original (spec §8.1's option): a pass's tokens take their true positions, the kept
// rows keep theirs, and the outputs are attention over the spec's rows at their true positions (keys
// as the forward pass rotated them: nothing moves in angle), through many evictions and decode steps.
// The rows kept are the compact mode's (scores do not depend on positions), and no pre-RoPE copy is
// held: the rows cost what --locret-keys rerotate's do.
TEST(LocretKv, OriginalPositionsGiveAttentionOverTheKeptRowsAtTheirTruePositions) {
  ThreadPool pool(2);
  ToyCompute tc;
  auto sc = std::make_shared<HashScorer>();
  for (const cpu::KvDtype dt : {cpu::KvDtype::kF32, cpu::KvDtype::kF16}) {
    KvOptions o = locret(32, 16, 8, 8, sc);
    o.knobs.locret_positions = policy::LocretPositions::kOriginal;
    MemoryLedger ledger;
    LocretKv kv(geometry(dt), 4096, kHead, ledger, pool, cpu::best_isa(), o);
    kv.set_compute(&tc);
    Driver d{kv, *sc, 32, 8};
    d.original = true;
    d.kv_local_tail = 8;
    d.cap = 56;
    d.prefill(600, 16);
    for (int i = 0; i < 30; ++i) d.pass(1);  // decode overflows evict too
    d.expect_same_rows();
    EXPECT_GT(kv.evictions(), 30u);
    EXPECT_EQ(kv.positions(0), 630);
    EXPECT_EQ(kv.position(0, 1, 1, kv.rows(0) - 1), 629);  // the last row at its true position
    EXPECT_LT(d.max_err, dt == cpu::KvDtype::kF32 ? 2e-4 : 2e-3);
    const uint64_t row = dt == cpu::KvDtype::kF32 ? 4u : 2u;
    EXPECT_EQ(ledger.current(Tier::kDevice, Category::kKv), 2u * 2u * 56u * (2u * 16u * row + 8u + 4u));
  }
}

TEST(LocretKv, TruncationIntoEvictedRowsIsAClearErrorAndTheTailCanGo) {
  ThreadPool pool(2);
  ToyCompute tc;
  auto sc = std::make_shared<HashScorer>();
  MemoryLedger ledger;
  LocretKv kv(geometry(), 4096, kHead, ledger, pool, cpu::best_isa(), locret(16, 8, 4, 6, sc));
  kv.set_compute(&tc);
  Driver d{kv, *sc, 16, 4};
  d.kv_local_tail = 6;
  d.prefill(60, 8);
  d.pass(1);
  EXPECT_EQ(kv.rows(0), 16 + 6 + 1);
  kv.truncate(0, 55);  // drops the decoded token and one tail token: allowed
  EXPECT_EQ(kv.rows(0), 17);
  EXPECT_EQ(kv.positions(0), 55);
  EXPECT_THROW(kv.truncate(0, 30), Error);
  kv.truncate(0, 0);
  EXPECT_EQ(kv.rows(0), 0);
}

TEST(LocretKv, NeedsAScorerAndStabilizersBelowTheBudget) {
  ThreadPool pool(2);
  MemoryLedger ledger;
  EXPECT_THROW(LocretKv(geometry(), 100, kHead, ledger, pool, cpu::best_isa(), locret(16, 8, 4, 6, nullptr)),
               Error);
  EXPECT_THROW(LocretKv(geometry(), 100, kHead, ledger, pool, cpu::best_isa(),
                        locret(16, 8, 16, 6, std::make_shared<HashScorer>())),
               Error);
}

}  // namespace
}  // namespace kvtier::kv

namespace kvtier::kv {
namespace {

std::vector<int64_t> kept_rows(const std::vector<float>& sc, int64_t keep, int64_t n_protect, int64_t pool,
                               int64_t n_sink = 0, const std::vector<uint8_t>& link = {}) {
  const auto n = static_cast<int64_t>(sc.size());
  std::vector<int64_t> order(sc.size());
  std::vector<uint8_t> mask(sc.size());
  std::vector<float> span_best(sc.size());
  const LocretMark m{sc.data(), link.empty() ? nullptr : link.data(), n, keep, n_protect, n_sink, pool};
  locret_mark_keep(m, span_best, order, mask);
  std::vector<int64_t> out;
  for (int64_t r = 0; r < n; ++r)
    if (mask[static_cast<size_t>(r)]) out.push_back(r);
  return out;
}

// --locret-pool: a unit ranks by the best score within pool / 2 units of it, so a high-scoring unit's
// neighbours (the rest of a number's digits, say) stay with it; the stabilizers stay protected and lend
// no score to their neighbours; pool 1 is the paper's rule.
TEST(LocretMarkKeep, PooledScoresKeepTheNeighboursOfAHighScoringUnit) {
  //                              0     1     2     3    4     5     6     7     8     9
  const std::vector<float> sc = {0.1f, 0.2f, 0.0f, 9.0f, 0.0f, 0.3f, 0.4f, 0.5f, 8.0f, 0.6f};
  EXPECT_EQ(kept_rows(sc, 3, 0, 1), (std::vector<int64_t>{3, 8, 9}));
  // pool 3: rows 2-4 share 9.0, rows 7-9 share 8.0 (ties: the later row first)
  EXPECT_EQ(kept_rows(sc, 3, 0, 3), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(kept_rows(sc, 6, 0, 3), (std::vector<int64_t>{2, 3, 4, 7, 8, 9}));
  // the last 2 rows protected: row 8's score no longer reaches row 7 through them
  EXPECT_EQ(kept_rows(sc, 5, 2, 3), (std::vector<int64_t>{2, 3, 4, 8, 9}));
  // pool 5 around row 3: rows 1-5
  EXPECT_EQ(kept_rows(sc, 5, 0, 5), (std::vector<int64_t>{1, 2, 3, 4, 5}));
}

// --locret-sinks: the first rows are kept whatever their scores, beside the stabilizers, and the rest
// of the budget goes by score as before.
TEST(LocretMarkKeep, SinksKeepTheFirstRowsWhateverTheirScores) {
  //                              0     1     2     3    4     5     6     7     8     9
  const std::vector<float> sc = {0.1f, 0.2f, 0.0f, 9.0f, 0.0f, 0.3f, 0.4f, 0.5f, 8.0f, 0.6f};
  EXPECT_EQ(kept_rows(sc, 4, 0, 1, 2), (std::vector<int64_t>{0, 1, 3, 8}));
  EXPECT_EQ(kept_rows(sc, 4, 1, 1, 2), (std::vector<int64_t>{0, 1, 3, 9}));     // row 9 a stabilizer
  EXPECT_EQ(kept_rows(sc, 5, 0, 3, 1), (std::vector<int64_t>{0, 2, 3, 4, 9}));  // pooled: 2-4, then 7-9 ties
  EXPECT_EQ(kept_rows(sc, 3, 0, 1, 0), (std::vector<int64_t>{3, 8, 9}));        // none: the paper's rule
}

// --locret-span word|number: the rows of one span (linked to the row before) rank by the span's best
// score, so a span is kept or evicted whole; rows outside spans keep their own scores.
TEST(LocretMarkKeep, LinkedRowsRankByTheBestScoreOfTheirSpan) {
  //                              0     1     2     3    4     5     6     7     8     9
  const std::vector<float> sc = {0.1f, 0.2f, 0.0f, 9.0f, 0.0f, 0.3f, 0.4f, 0.5f, 8.0f, 0.6f};
  // spans {2, 3, 4} and {6, 7}; the others alone
  const std::vector<uint8_t> link = {0, 0, 0, 1, 1, 0, 0, 1, 0, 0};
  EXPECT_EQ(kept_rows(sc, 3, 0, 1, 0, link), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(kept_rows(sc, 5, 0, 1, 0, link), (std::vector<int64_t>{2, 3, 4, 8, 9}));
  EXPECT_EQ(kept_rows(sc, 7, 0, 1, 0, link), (std::vector<int64_t>{2, 3, 4, 6, 7, 8, 9}));
  // without links: the paper's rule
  EXPECT_EQ(kept_rows(sc, 5, 0, 1, 0, std::vector<uint8_t>(10, 0)), (std::vector<int64_t>{3, 6, 7, 8, 9}));
  // the stabilizers (7-9) stay, and a span cut by the budget keeps its later rows (ties)
  EXPECT_EQ(kept_rows(sc, 5, 3, 1, 0, link), (std::vector<int64_t>{3, 4, 7, 8, 9}));
  // a protected row lends its span its real score: row 3 protected, row 2 ranks by 0.5, above row 1
  EXPECT_EQ(kept_rows({0.1f, 0.45f, 0.4f, 0.5f}, 2, 1, 1, 0, {0, 0, 0, 1}), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(kept_rows({0.1f, 0.45f, 0.4f, 0.5f}, 2, 1, 1, 0, {0, 0, 0, 0}), (std::vector<int64_t>{1, 3}));
  // with pooling: span scores are what the pool takes the maximum of
  EXPECT_EQ(kept_rows(sc, 6, 0, 3, 0, link), (std::vector<int64_t>{1, 2, 3, 4, 5, 9}));
}

}  // namespace
}  // namespace kvtier::kv
