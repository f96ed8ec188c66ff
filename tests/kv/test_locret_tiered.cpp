// Locret's retention on the offloaded placements (TieredKv, tiered_kv_locret.cpp) against LocretKv, the
// resident reference: the same inputs give bit-identical outputs and the same positions pass after pass,
// through evicting prefill chunks, the never-evicted tail and decode steps past the reserved rows (an
// eviction before the pass), for layer and headinfer (group sizes, static heads, prefetch depths, a
// delayed copy thread), host and disk homes, f32 and f16 rows. A decode step loads the rows held and no
// more; the home tier's size does not depend on the context; truncation follows LocretKv's rules.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kv/locret_kv.h"
#include "kv/tiered_kv.h"
#include "locret_toys.h"

namespace kvtier::kv {
namespace {

// window0 > 0: layer 0 has a sliding window of its own (Gemma-3's local layers), layer 1 is global.
KvGeometry geometry(cpu::KvDtype dt, int64_t window0 = 0) {
  KvGeometry g;
  g.n_head_kv = {2, 2};
  if (window0 > 0) g.window = {window0, 0};
  g.head_dim_k = kDk;
  g.head_dim_v = kDv;
  g.block_tokens = 128;  // whole 4 KiB pages of the home tier
  g.dtype = dt;
  return g;
}

std::string disk_dir() {
  const auto d = std::filesystem::path(KVTIER_BINARY_DIR) / "test_tmp" / "kv_disk";
  std::filesystem::create_directories(d);
  return d.string();
}

struct Case {
  int64_t budget, chunk, n_s, n_loc, prompt, decode;
};

KvOptions options(const Case& c, std::shared_ptr<UnitScorer> sc) {
  KvOptions o;
  o.retention = policy::Retention::kLocret;
  o.knobs.budget = c.budget;
  o.knobs.stabilizers = c.n_s;
  o.knobs.local_tail = c.n_loc;
  o.max_new_rows = c.chunk;
  o.scorer = std::move(sc);
  return o;
}

struct Trace {
  std::vector<float> out;      // every pass's attention outputs, layer by layer
  std::vector<int64_t> pos0;   // every pass's first (compact) position
  std::vector<int64_t> after;  // positions() after every pass
};

// A prompt prefilled by the cache's own plan, then decode steps; keys rotated at the pass's positions.
// on_step(step) runs after each decode step.
// tokens: the ids handed to the passes (--locret-span), by position; empty: none.
template <class OnStep>
Trace drive(KvCache& kv, const Case& c, OnStep on_step, int64_t window0 = 0,
            const std::vector<int32_t>& tokens = {}) {
  Trace tr;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<int64_t> sizes = kv.plan_prefill(0, c.prompt, c.chunk);
  const auto n_prefill = sizes.size();
  sizes.insert(sizes.end(), static_cast<size_t>(c.decode), 1);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    const int64_t at = kv.positions(0);  // tokens seen
    const std::span<const int32_t> toks =
        tokens.empty() ? std::span<const int32_t>() : std::span(tokens).subspan(static_cast<size_t>(at), n);
    const PassPositions pp = kv.begin_pass({0, n, toks});
    tr.pos0.push_back(pp.pos0);
    for (uint32_t l = 0; l < 2; ++l) {
      ToyLayerRows tl = toy_layer_rows(n, pp.pos0, rng, nd);
      auto &q_pre = tl.q_pre, &k_pre = tl.k_pre, &v = tl.v, &q = tl.q, &k = tl.k;
      LayerRows rows;
      rows.k = k.data(), rows.v = v.data(), rows.q_pre = q_pre.data(), rows.k_pre = k_pre.data();
      std::vector<float> o(n * kHead * kDv);
      kv.write(l, rows);
      kv.attend(l, q.data(), kHead, {0.25f, 0.0f, l == 0 ? window0 : 0}, o.data());
      tr.out.insert(tr.out.end(), o.begin(), o.end());
    }
    kv.end_pass();
    tr.after.push_back(kv.positions(0));
    if (i >= n_prefill) on_step(static_cast<int64_t>(i - n_prefill));
  }
  return tr;
}

struct Placement {
  policy::Placement p;
  uint32_t group, depth, statics;
  bool disk;
  uint32_t delay_us;
};

TEST(LocretTiered, OffloadedPlacementsGiveTheResidentBitsThroughEvictionsAndOverflow) {
  ThreadPool pool(2);
  const cpu::Isa isa = cpu::best_isa();
  const Case cases[] = {
      {24, 16, 6, 5, 90, 24},      // one home block; decode overflows b + n_loc + B after 17 steps
      {150, 64, 30, 20, 500, 70},  // several blocks (pages released after evictions); overflow at step 65
      {600, 64, 30, 20, 500, 4},   // the budget covers the context: nothing evicted
  };
  const Placement placements[] = {
      {policy::Placement::kLayer, 0, 1, 0, false, 0},    {policy::Placement::kLayer, 0, 1, 0, true, 0},
      {policy::Placement::kLayer, 0, 3, 0, false, 100},  {policy::Placement::kHeadInfer, 1, 1, 0, false, 0},
      {policy::Placement::kHeadInfer, 1, 2, 1, true, 0}, {policy::Placement::kHeadInfer, 2, 1, 0, true, 50},
  };
  for (const policy::LocretKeys keys : {policy::LocretKeys::kPreRope, policy::LocretKeys::kRerotate}) {
    for (cpu::KvDtype dt : {cpu::KvDtype::kF32, cpu::KvDtype::kF16}) {
      for (const Case& c : cases) {
        auto sc = std::make_shared<HashScorer>(4);  // 4 score levels: ties decided by position
        ToyCompute tc;
        MemoryLedger l0;
        KvOptions ro = options(c, sc);
        ro.knobs.locret_keys = keys;
        // --locret-sinks with rerotate (its first rows never move), none with prerope; with f16 rows a
        // sliding window of its own on layer 0 (--locret-sliding recent: its most recent rows kept)
        ro.knobs.locret_sinks = keys == policy::LocretKeys::kRerotate ? 3 : 0;
        const int64_t window0 = dt == cpu::KvDtype::kF16 ? 40 : 0;
        // with f16 rows --locret-span word (prerope) and number (rerotate), the token ids alongside
        const std::vector<int32_t> tokens = toy_tokens(static_cast<size_t>(c.prompt + c.decode), 3);
        if (dt == cpu::KvDtype::kF16) {
          ro.knobs.locret_span =
              keys == policy::LocretKeys::kPreRope ? policy::LocretSpan::kWord : policy::LocretSpan::kNumber;
          ro.token_edges = std::make_shared<const std::vector<uint8_t>>(toy_token_edges());
        }
        LocretKv ref(geometry(dt, window0), 4096, kHead, l0, pool, isa, ro);
        ref.set_compute(&tc);
        const Trace want = drive(
            ref, c, [](int64_t) {}, window0, tokens);
        for (const Placement& pl : placements) {
          KvOptions o = ro;
          o.placement.placement = pl.p;
          o.placement.group = pl.group;
          o.placement.prefetch_depth = pl.depth;
          o.placement.static_heads = pl.statics;
          o.disk_dir = pl.disk ? disk_dir() : "";
          o.copy_delay_us = pl.delay_us;
          MemoryLedger l1;
          TieredKv tiered(geometry(dt, window0), 4096, kHead, l1, pool, isa, o);
          tiered.set_compute(&tc);
          const Trace got = drive(
              tiered, c, [](int64_t) {}, window0, tokens);
          const std::string what =
              std::string(policy::placement_name(pl.p)) + " g=" + std::to_string(pl.group) +
              " depth=" + std::to_string(pl.depth) + " static=" + std::to_string(pl.statics) +
              (pl.disk ? " disk" : " host") + " b=" + std::to_string(c.budget) +
              (dt == cpu::KvDtype::kF16 ? " f16" : " f32") + " " +
              std::string(policy::locret_keys_name(keys)) +
              " sinks=" + std::to_string(ro.knobs.locret_sinks) + " window0=" + std::to_string(window0) +
              " span=" + std::string(policy::locret_span_name(ro.knobs.locret_span));
          EXPECT_EQ(got.pos0, want.pos0) << what;
          EXPECT_EQ(got.after, want.after) << what;
          ASSERT_EQ(got.out.size(), want.out.size()) << what;
          EXPECT_EQ(std::memcmp(got.out.data(), want.out.data(), got.out.size() * sizeof(float)), 0) << what;
          EXPECT_EQ(tiered.locret_evictions(), ref.evictions()) << what;
        }
        if (c.budget < c.prompt) {
          EXPECT_GT(ref.evictions(), 1u);
        } else {
          EXPECT_EQ(ref.evictions(), 0u);
        }
      }
    }
  }
}

TEST(LocretTiered, ADecodeStepLoadsTheRowsHeldAndNoMore) {
  ThreadPool pool(2);
  const Case c{150, 64, 30, 20, 900, 12};
  const KvGeometry g = geometry(cpu::KvDtype::kF16);
  const uint64_t row = (kDk + kDv) * 2;  // K and V bytes of one row of one head
  for (const bool disk : {false, true}) {
    ToyCompute tc;
    KvOptions o = options(c, std::make_shared<HashScorer>());
    o.placement.placement = policy::Placement::kLayer;
    o.disk_dir = disk ? disk_dir() : "";
    MemoryLedger ledger;
    TieredKv tiered(g, 4096, kHead, ledger, pool, cpu::best_isa(), o);
    tiered.set_compute(&tc);
    TieredStats prev;
    int64_t steps = 0, rows_held = 0;
    TieredStats start;
    drive(tiered, c, [&](int64_t step) {
      const TieredStats now = tiered.stats();
      if (step == 0) {  // from the end of the first step on (the prefill's bytes are not a step's)
        prev = start = now;
        return;
      }
      // Rows held before this step: b + n_loc after the prefill, one more per step before it.
      const int64_t held = c.budget + c.n_loc + step;
      // Its visits used the rows held of each of the 2 layers x 2 KV heads (K and V).
      EXPECT_EQ(now.payload_kv_bytes - prev.payload_kv_bytes, static_cast<uint64_t>(held) * 4 * row) << step;
      prev = now;
      rows_held += held;
      ++steps;
    });
    EXPECT_EQ(steps, c.decode - 1);
    // The loads the steps submitted (each step prefetches part of the next one) moved those rows in whole
    // 4 KiB pages of the 128-row blocks they lie in, never the 900 positions of the context.
    const uint64_t loaded = prev.transfer.bytes_loaded - start.transfer.bytes_loaded;
    EXPECT_GE(loaded, static_cast<uint64_t>(rows_held) * 4 * row / 2) << disk;
    EXPECT_LE(loaded, static_cast<uint64_t>(rows_held + steps * 2 * 128) * 4 * row) << disk;
    EXPECT_LT(loaded, static_cast<uint64_t>(steps * c.prompt) * 4 * row / 2) << disk;
  }
}

TEST(LocretTiered, TheHomeTierIsBoundedByTheBudgetWhateverTheContext) {
  ThreadPool pool(2);
  const Case c{150, 64, 30, 20, 0, 0};
  uint64_t host[2] = {0, 0}, device[2] = {0, 0};
  const int64_t capacity[2] = {1024, 1 << 20};
  for (int i = 0; i < 2; ++i) {
    KvOptions o = options(c, std::make_shared<HashScorer>());
    o.placement.placement = policy::Placement::kLayer;
    MemoryLedger ledger;
    TieredKv tiered(geometry(cpu::KvDtype::kF16), capacity[i], kHead, ledger, pool, cpu::best_isa(), o);
    host[i] = ledger.current(Tier::kHost, Category::kKv);
    device[i] =
        ledger.current(Tier::kDevice, Category::kStaging) + ledger.current(Tier::kDevice, Category::kKv);
    // kv_footprint predicts the same bytes
    const KvFootprint f = kv_footprint(o, geometry(cpu::KvDtype::kF16), capacity[i], kHead, pool.size());
    EXPECT_EQ(f.host_kv, host[i]);
  }
  EXPECT_EQ(host[0], host[1]);
  EXPECT_EQ(device[0], device[1]);
}

TEST(LocretTiered, TruncationFollowsLocretKv) {
  ThreadPool pool(2);
  const Case c{24, 16, 6, 5, 90, 3};
  ToyCompute tc;
  KvOptions o = options(c, std::make_shared<HashScorer>());
  o.placement.placement = policy::Placement::kHeadInfer;
  o.placement.group = 1;
  o.disk_dir = disk_dir();
  MemoryLedger ledger;
  TieredKv tiered(geometry(cpu::KvDtype::kF16), 4096, kHead, ledger, pool, cpu::best_isa(), o);
  tiered.set_compute(&tc);
  drive(tiered, c, [](int64_t) {});
  EXPECT_EQ(tiered.positions(0), 93);
  tiered.truncate(0, 88);  // the tail and the decoded tokens may go
  EXPECT_EQ(tiered.positions(0), 88);
  EXPECT_THROW(tiered.truncate(0, 80), Error);  // below the last eviction (at 85)
  tiered.truncate(0, 0);
  EXPECT_EQ(tiered.positions(0), 0);
  KvOptions bad = o;
  bad.scorer = nullptr;
  EXPECT_THROW(TieredKv(geometry(cpu::KvDtype::kF16), 4096, kHead, ledger, pool, cpu::best_isa(), bad),
               Error);
}

}  // namespace
}  // namespace kvtier::kv
