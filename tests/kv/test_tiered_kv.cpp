// Offloaded placements against the resident one, on the KV store alone (no model): the same writes
// and queries must give bit-identical attention outputs for every placement, group size, prefetch
// depth, static-head count, home tier (host, disk), budget and injected copy delay; faults on the
// disk tier must surface as errors.
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "kv/resident_kv.h"
#include "kv/tiered_kv.h"

namespace kvtier::kv {
namespace {

struct Case {
  std::vector<uint32_t> n_head_kv;
  uint32_t n_head;
  uint32_t dk, dv;
};

// A sequence of passes: chunked prefill of `prompt` tokens in chunks of `chunk`, then `decode` steps.
std::vector<std::pair<int64_t, int64_t>> passes(int64_t prompt, int64_t chunk, int64_t decode) {
  std::vector<std::pair<int64_t, int64_t>> p;
  for (int64_t s = 0; s < prompt; s += chunk) p.push_back({s, std::min(chunk, prompt - s)});
  for (int64_t i = 0; i < decode; ++i) p.push_back({prompt + i, 1});
  return p;
}

// Runs all passes through `kv` and returns every attention output, concatenated.
std::vector<float> run(KvCache& kv, const Case& c, const std::vector<std::pair<int64_t, int64_t>>& ps,
                       uint32_t seed, const LayerAttention& la) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> out;
  for (auto [pos0, n] : ps) {
    EXPECT_EQ(kv.begin_pass({0, n}).pos0, pos0);
    for (uint32_t l = 0; l < c.n_head_kv.size(); ++l) {
      const uint32_t hk = c.n_head_kv[l];
      std::vector<float> k(n * hk * c.dk), v(n * hk * c.dv), q(n * c.n_head * c.dk),
          o(n * c.n_head * c.dv, -7.0f);
      for (auto* vec : {&k, &v, &q}) {
        for (float& x : *vec) x = nd(rng);
      }
      LayerAttention lal = la;  // a geometry with per-layer windows gives each layer its own
      if (!kv.geometry().window.empty()) lal.window = kv.geometry().window_of(l);
      kv.write(l, {k.data(), v.data()});
      kv.attend(l, q.data(), c.n_head, lal, o.data());
      out.insert(out.end(), o.begin(), o.end());
    }
    kv.end_pass();
  }
  return out;
}

KvGeometry geometry(const Case& c) {
  KvGeometry g;
  g.n_head_kv = c.n_head_kv;
  g.head_dim_k = c.dk;
  g.head_dim_v = c.dv;
  g.block_tokens = 128;  // whole 4 KiB pages of the home tier for every case's rows
  return g;
}

std::string disk_dir() {
  const auto d = std::filesystem::path(KVTIER_BINARY_DIR) / "test_tmp" / "kv_disk";
  std::filesystem::create_directories(d);
  return d.string();
}

void expect_bit_identical(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t first = a.size();
  for (size_t i = 0; i < a.size() && first == a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) first = i;
  }
  EXPECT_EQ(first, a.size()) << what << ": first difference at output element " << first << " of " << a.size()
                             << " (" << (first < a.size() ? a[first] : 0) << " vs "
                             << (first < a.size() ? b[first] : 0) << ")";
}

TEST(TieredKv, EveryConfigurationMatchesResidentBitForBit) {
  const Case cases[] = {
      {{4, 4, 4}, 8, 32, 32},  // GQA, uniform
      {{4, 2, 4}, 8, 16, 32},  // per-layer KV heads, dk != dv
      {{3, 3}, 9, 64, 64},     // SmolLM2-like heads (3 KV)
  };
  const LayerAttention las[] = {{0.125f, 0.0f, 0}, {0.2f, 30.0f, 50}};  // plain; softcap + sliding window
  ThreadPool pool(2);
  const cpu::Isa isa = cpu::best_isa();
  const auto ps = passes(150, 37, 5);  // chunks not aligned to blocks or tiles, then decode
  const int64_t cap = 200;
  for (const auto& c : cases) {
    for (const auto& la : las) {
      MemoryLedger ledger_r;
      ResidentKv resident(geometry(c), cap, c.n_head, ledger_r, pool, isa);
      const auto ref = run(resident, c, ps, 42, la);
      struct Config {
        policy::Placement p;
        uint32_t group, depth, statics;
        bool disk;
        uint32_t delay;
      };
      const Config configs[] = {
          {policy::Placement::kLayer, 0, 1, 0, false, 0},
          {policy::Placement::kLayer, 0, 2, 0, true, 0},
          {policy::Placement::kHeadInfer, 1, 1, 0, false, 0},
          {policy::Placement::kHeadInfer, 2, 1, 0, true, 0},
          {policy::Placement::kHeadInfer, 0, 1, 0, false, 0},
          {policy::Placement::kHeadInfer, 1, 3, 0, true, 200},
          {policy::Placement::kHeadInfer, 1, 1, 3, false, 0},
          {policy::Placement::kHeadInfer, 1, 2, 5, true, 100},
          // deeper than the units of a pass (2 or 3 layers): prefetches stop at each unit's own next
          // visit, after this pass's store of it (the fuzzer found loads of unstored pages)
          {policy::Placement::kLayer, 0, 4, 0, false, 200},
          {policy::Placement::kLayer, 0, 3, 0, true, 0},
      };
      for (const auto& cf : configs) {
        if (cf.group > 1 && c.n_head_kv[1] % cf.group != 0) continue;
        TieredOptions o;
        o.placement.placement = cf.p;
        o.placement.group = cf.group;
        o.placement.prefetch_depth = cf.depth;
        o.placement.static_heads = cf.statics;
        o.disk_dir = cf.disk ? disk_dir() : "";
        o.max_new_rows = 37;
        o.copy_delay_us = cf.delay;
        MemoryLedger ledger;
        TieredKv tiered(geometry(c), cap, c.n_head, ledger, pool, isa, o);
        const auto got = run(tiered, c, ps, 42, la);
        const std::string what = std::string(policy::placement_name(cf.p)) +
                                 " g=" + std::to_string(cf.group) + " depth=" + std::to_string(cf.depth) +
                                 " static=" + std::to_string(cf.statics) + (cf.disk ? " disk" : " host") +
                                 " heads=" + std::to_string(c.n_head_kv[1]);
        expect_bit_identical(ref, got, what);
        const auto st = tiered.stats();
        EXPECT_GT(st.transfer.bytes_stored, 0u) << what;
        EXPECT_GT(st.transfer.bytes_loaded, 0u) << what;
        // After the first pass every load was prefetched.
        EXPECT_LE(st.sync_loads, 0u) << what;
      }
    }
  }
}

TEST(TieredKv, AdaptiveGroupShrinksWithTheBudgetAndStaysExact) {
  const Case c{{4, 4}, 8, 32, 32};
  ThreadPool pool(1);
  const cpu::Isa isa = cpu::best_isa();
  const int64_t cap = 1024;
  const auto ps = passes(900, 300, 3);
  MemoryLedger lr;
  ResidentKv resident(geometry(c), cap, c.n_head, lr, pool, isa);
  const auto ref = run(resident, c, ps, 7, {0.15f, 0, 0});
  // Planes of 1024 rows x 64 B = 64 KiB; two buffers of g heads x (K, V) planes: 1 MiB for g = 4.
  cpu::AttnParams ap;
  ap.head_dim_k = 32;
  ap.head_dim_v = 32;
  ap.q_per_kv = 2;
  const uint64_t fixed = 300ull * 4 * (32 + 32) * 2 + cpu::attention_scratch_bytes(ap, pool.size());
  uint32_t last_group = 99;
  for (uint64_t buffers_kib : {1024u, 512u, 256u}) {  // g = 4, 2, 1 fit
    TieredOptions o;
    o.placement.placement = policy::Placement::kHeadInfer;
    o.max_new_rows = 300;
    o.kv_mem = fixed + buffers_kib * 1024;
    MemoryLedger ledger;
    TieredKv tiered(geometry(c), cap, c.n_head, ledger, pool, isa, o);
    expect_bit_identical(ref, run(tiered, c, ps, 7, {0.15f, 0, 0}), "kv_mem " + std::to_string(o.kv_mem));
    const uint32_t g = tiered.stats().group;
    EXPECT_EQ(g, buffers_kib / 256) << "kv_mem " << o.kv_mem;
    EXPECT_LE(g, last_group);
    last_group = g;
    EXPECT_LE(ledger.peak(Tier::kDevice), o.kv_mem);
  }
  EXPECT_EQ(last_group, 1u);
}

TEST(TieredKv, BudgetThatCannotFitFailsBeforeStarting) {
  const Case c{{4, 4}, 8, 32, 32};
  ThreadPool pool(1);
  TieredOptions o;
  o.placement.placement = policy::Placement::kLayer;
  o.kv_mem = 100000;
  MemoryLedger ledger;
  try {
    TieredKv tiered(geometry(c), 4096, c.n_head, ledger, pool, cpu::best_isa(), o);
    FAIL() << "expected a budget error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBudget);
    const std::string m = e.what();
    EXPECT_NE(m.find("--kv-mem 100000 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("headinfer"), std::string::npos) << m;
  }
}

TEST(TieredKv, DiskWriteFailureStopsTheRunWithAnError) {
  const Case c{{2, 2}, 4, 32, 32};
  ThreadPool pool(1);
  TieredOptions o;
  o.placement.placement = policy::Placement::kHeadInfer;
  o.placement.group = 1;
  o.disk_dir = disk_dir();
  o.max_new_rows = 64;
  o.disk_faults.fail_after_bytes = 20000;
  o.disk_faults.error = ENOSPC;
  MemoryLedger ledger;
  TieredKv tiered(geometry(c), 512, c.n_head, ledger, pool, cpu::best_isa(), o);
  try {
    run(tiered, c, passes(400, 64, 0), 1, {0.1f, 0, 0});
    FAIL() << "expected an I/O error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("No space left on device"), std::string::npos) << e.what();
  }
}

TEST(TieredKv, DiskTierLeavesNoFileBehind) {
  const Case c{{2}, 2, 32, 32};
  ThreadPool pool(1);
  const auto dir = disk_dir();
  auto count = [&] { return std::distance(std::filesystem::directory_iterator(dir), {}); };
  const auto before = count();
  {
    TieredOptions o;
    o.placement.placement = policy::Placement::kLayer;
    o.disk_dir = dir;
    MemoryLedger ledger;
    TieredKv tiered(geometry(c), 256, c.n_head, ledger, pool, cpu::best_isa(), o);
    run(tiered, c, passes(100, 50, 1), 3, {0.1f, 0, 0});
    EXPECT_EQ(count(), before);  // unnamed while in use
    EXPECT_GT(ledger.peak(Tier::kDisk), 0u);
  }
  EXPECT_EQ(count(), before);
}

TEST(TieredKv, TruncateThenContinueMatchesResident) {
  const Case c{{2, 2}, 4, 32, 32};
  ThreadPool pool(1);
  const auto isa = cpu::best_isa();
  MemoryLedger lr, lt;
  ResidentKv resident(geometry(c), 300, c.n_head, lr, pool, isa);
  TieredOptions o;
  o.placement.placement = policy::Placement::kHeadInfer;
  o.placement.group = 1;
  o.max_new_rows = 64;
  TieredKv tiered(geometry(c), 300, c.n_head, lt, pool, isa, o);
  run(resident, c, passes(200, 64, 2), 5, {0.1f, 0, 0});
  run(tiered, c, passes(200, 64, 2), 5, {0.1f, 0, 0});
  resident.truncate(0, 130);
  tiered.truncate(0, 130);
  std::vector<std::pair<int64_t, int64_t>> more = {{130, 50}, {180, 1}, {181, 1}};
  expect_bit_identical(run(resident, c, more, 9, {0.1f, 0, 0}), run(tiered, c, more, 9, {0.1f, 0, 0}),
                       "after truncate");
}

TEST(TieredKv, SlidingRetentionReusesHomePagesAndIsExact) {
  const Case c{{2, 2, 2}, 4, 64, 64};
  KvGeometry g = geometry(c);
  g.window = {0, 100, 100};  // layer 0 global; layers 1-2 see 100 keys
  ThreadPool pool(2);
  const auto isa = cpu::best_isa();
  const auto ps = passes(400, 37, 40);  // 440 positions: sliding layers reuse their 3 pages
  const LayerAttention la{0.125f, 0.0f, 0};
  MemoryLedger lr;
  ResidentKv resident(g, 600, c.n_head, lr, pool, isa);
  const auto ref = run(resident, c, ps, 11, la);
  struct Config {
    policy::Placement p;
    uint32_t group, depth, statics;
    bool disk;
  };
  const Config configs[] = {{policy::Placement::kLayer, 0, 1, 0, false},
                            {policy::Placement::kLayer, 0, 2, 0, true},
                            {policy::Placement::kHeadInfer, 1, 1, 0, true},
                            {policy::Placement::kHeadInfer, 1, 2, 3, false}};
  for (const auto& cf : configs) {
    TieredOptions o;
    o.placement.placement = cf.p;
    o.placement.group = cf.group;
    o.placement.prefetch_depth = cf.depth;
    o.placement.static_heads = cf.statics;
    o.disk_dir = cf.disk ? disk_dir() : "";
    o.max_new_rows = 37;
    TieredOptions full = o;
    o.retention = policy::Retention::kSliding;
    const std::string what = std::string(policy::placement_name(cf.p)) + (cf.disk ? " disk" : " host");
    MemoryLedger lt, lf;
    TieredKv tiered(g, 600, c.n_head, lt, pool, isa, o);
    { TieredKv unlimited(g, 600, c.n_head, lf, pool, isa, full); }
    expect_bit_identical(ref, run(tiered, c, ps, 11, la), what);
    const Tier home = cf.disk ? Tier::kDisk : Tier::kHost;
    // Home pages of 128 rows: 5 for layer 0 (600 positions), for layers 1-2 what window - 1 + chunk =
    // 136 positions touch at most: ceil(135 / 128) + 1 = 3.
    EXPECT_LT(lt.peak(home, Category::kKv), lf.peak(home, Category::kKv)) << what;
    const TieredLayout lay = tiered_layout(g, 600, c.n_head, 2, o);
    EXPECT_EQ(lay.home_pages, (std::vector<uint32_t>{5, 3, 3})) << what;
    // Something was loaded (the window's pages) through the paged home tier.
    EXPECT_GT(tiered.stats().transfer.bytes_loaded, 0u);
  }
  // A short step back and on stays exact; a step back past freed pages is a clear error.
  TieredOptions o;
  o.placement.placement = policy::Placement::kHeadInfer;
  o.placement.group = 1;
  o.max_new_rows = 37;
  o.retention = policy::Retention::kSliding;
  MemoryLedger lt;
  TieredKv tiered(g, 600, c.n_head, lt, pool, isa, o);
  MemoryLedger lr2;
  ResidentKv resident2(g, 600, c.n_head, lr2, pool, isa);
  run(tiered, c, ps, 11, la);
  run(resident2, c, ps, 11, la);
  try {
    tiered.truncate(0, 100);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("sliding retention already freed"), std::string::npos) << e.what();
  }
  tiered.truncate(0, 430);
  resident2.truncate(0, 430);
  const std::vector<std::pair<int64_t, int64_t>> more = {{430, 30}, {460, 1}, {461, 1}};
  expect_bit_identical(run(resident2, c, more, 5, la), run(tiered, c, more, 5, la), "after truncate");
}

TEST(TieredKv, TwoInterleavedSequencesShareTheHomeAndMatchRunningAlone) {
  const Case c{{2, 2}, 4, 64, 64};
  ThreadPool pool(2);
  const auto isa = cpu::best_isa();
  const LayerAttention la{0.125f, 0.0f, 0};
  // Sequence a: 300 tokens in chunks of 37 then decode; b: 150 then decode, different keys (seed).
  const auto pa = passes(300, 37, 3), pb = passes(150, 37, 3);
  auto alone = [&](const std::vector<std::pair<int64_t, int64_t>>& ps, uint32_t seed) {
    MemoryLedger l;
    ResidentKv r(geometry(c), 512, c.n_head, l, pool, isa);
    return run(r, c, ps, seed, la);
  };
  const auto ref_a = alone(pa, 1), ref_b = alone(pb, 2);
  for (const bool disk : {false, true}) {
    for (const auto p : {policy::Placement::kLayer, policy::Placement::kHeadInfer}) {
      TieredOptions o;
      o.placement.placement = p;
      o.placement.group = p == policy::Placement::kHeadInfer ? 1 : 0;
      o.max_new_rows = 37;
      o.max_seqs = 2;
      o.disk_dir = disk ? disk_dir() : "";
      MemoryLedger l;
      TieredKv kv(geometry(c), 512, c.n_head, l, pool, isa, o);
      // Interleave pass by pass (each sequence's passes in order, with its own random stream).
      std::mt19937 ra(1), rb(2);
      std::vector<float> got_a, got_b;
      auto one = [&](SeqId seq, std::pair<int64_t, int64_t> ps, std::mt19937& rng, std::vector<float>& out) {
        std::normal_distribution<float> nd(0.0f, 1.0f);
        const auto [pos0, n] = ps;
        EXPECT_EQ(kv.begin_pass({seq, n}).pos0, pos0);
        for (uint32_t lyr = 0; lyr < c.n_head_kv.size(); ++lyr) {
          const uint32_t hk = c.n_head_kv[lyr];
          std::vector<float> k(n * hk * c.dk), v(n * hk * c.dv), q(n * c.n_head * c.dk),
              o2(n * c.n_head * c.dv);
          for (auto* vec : {&k, &v, &q}) {
            for (float& x : *vec) x = nd(rng);
          }
          kv.write(lyr, {k.data(), v.data()});
          kv.attend(lyr, q.data(), c.n_head, la, o2.data());
          out.insert(out.end(), o2.begin(), o2.end());
        }
        kv.end_pass();
      };
      for (size_t i = 0; i < std::max(pa.size(), pb.size()); ++i) {
        if (i < pb.size()) one(1, pb[i], rb, got_b);
        if (i < pa.size()) one(0, pa[i], ra, got_a);
      }
      const std::string what = std::string(policy::placement_name(p)) + (disk ? " disk" : " host");
      expect_bit_identical(ref_a, got_a, what + " seq 0");
      expect_bit_identical(ref_b, got_b, what + " seq 1");
      kv.truncate(1, 0);
      EXPECT_EQ(kv.positions(1), 0);
      EXPECT_EQ(kv.positions(0), 303);
    }
  }
}

}  // namespace
}  // namespace kvtier::kv
