// The KIVI representation in the KV stores: a key group is quantised exactly when all its positions
// have left the residual window (checked against attention over independently quantised rows), the
// offloaded placements give the resident placement's bits, a residual window as long as the context
// gives the f16 bits, f16 blocks are freed once quantised, and truncation into the quantised part is
// refused.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "backend/cpu/kv_quant.h"
#include "core/error.h"
#include "core/half.h"
#include "kv/footprint.h"
#include "kv/resident_kv.h"
#include "kv/tiered_kv.h"
#include "policy/kivi.h"

namespace kvtier::kv {
namespace {

constexpr int64_t kBt = 128;

std::vector<std::pair<int64_t, int64_t>> passes(int64_t prompt, int64_t chunk, int64_t decode) {
  std::vector<std::pair<int64_t, int64_t>> p;
  for (int64_t s = 0; s < prompt; s += chunk) p.push_back({s, std::min(chunk, prompt - s)});
  for (int64_t i = 0; i < decode; ++i) p.push_back({prompt + i, 1});
  return p;
}

KvGeometry geometry(std::vector<uint32_t> heads, uint32_t dk, uint32_t dv) {
  KvGeometry g;
  g.n_head_kv = std::move(heads);
  g.head_dim_k = dk;
  g.head_dim_v = dv;
  g.block_tokens = kBt;
  return g;
}

KvOptions kivi_options(policy::Representation r, int64_t group, int64_t residual) {
  KvOptions o;
  o.representation = r;
  o.knobs.kivi_group = group;
  o.knobs.kivi_residual = residual;
  return o;
}

// Runs the passes through `kv` (random rows from `seed`) and returns every attention output.
std::vector<float> run(KvCache& kv, uint32_t n_head, const std::vector<std::pair<int64_t, int64_t>>& ps,
                       uint32_t seed, const LayerAttention& la) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const KvGeometry& g = kv.geometry();
  std::vector<float> out;
  for (auto [pos0, n] : ps) {
    EXPECT_EQ(kv.begin_pass({0, n}).pos0, pos0);
    for (uint32_t l = 0; l < g.n_layer(); ++l) {
      const uint32_t hk = g.n_head_kv[l];
      std::vector<float> k(n * hk * g.head_dim_k), v(n * hk * g.head_dim_v), q(n * n_head * g.head_dim_k),
          o(n * n_head * g.head_dim_v, -7.0f);
      for (auto* vec : {&k, &v, &q}) {
        for (float& x : *vec) x = nd(rng);
      }
      for (size_t i = 3; i < k.size(); i += g.head_dim_k) k[i] *= 10.0f;  // an outlier channel
      kv.write(l, {k.data(), v.data()});
      kv.attend(l, q.data(), n_head, la, o.data());
      out.insert(out.end(), o.begin(), o.end());
    }
    kv.end_pass();
  }
  return out;
}

void expect_bit_identical(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  size_t first = a.size();
  for (size_t i = 0; i < a.size() && first == a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) first = i;
  }
  EXPECT_EQ(first, a.size()) << what << ": first difference at output element " << first << " of "
                             << a.size();
}

std::string disk_dir() {
  const auto d = std::filesystem::path(KVTIER_BINARY_DIR) / "test_tmp" / "kivi_disk";
  std::filesystem::create_directories(d);
  return d.string();
}

// The reference: the same rows, quantised here by group as the policy rule says, attended as f32.
TEST(KiviKv, AGroupIsQuantisedExactlyWhenItLeavesTheResidualWindow) {
  const uint32_t hk = 2, n_head = 4, dk = 32, dv = 32;
  const int64_t G = 16, R = 40, cap = 300;
  const auto ps = passes(150, 37, 40);
  ThreadPool pool(2);
  for (auto rep : {policy::Representation::kKivi4, policy::Representation::kKivi2}) {
    MemoryLedger ledger;
    const KvGeometry geo = geometry({hk}, dk, dv);
    const KvOptions opt = kivi_options(rep, G, R);
    ResidentKv kv(geo, cap, n_head, ledger, pool, cpu::best_isa(), opt);
    const cpu::KiviFormat f = kivi_format_of(geo, opt);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<uint16_t> k16(hk * cap * dk), v16(hk * cap * dv);  // [h][cap, d] f16
    std::vector<float> kref(k16.size()), vref(v16.size());         // what attention must see
    int64_t quantised = 0;                                         // positions quantised in kref/vref
    int passes_with_quantised = 0;
    for (auto [pos0, n] : ps) {
      ASSERT_EQ(kv.begin_pass({0, n}).pos0, pos0);
      std::vector<float> k(n * hk * dk), v(n * hk * dv), q(n * n_head * dk), o(n * n_head * dv);
      for (auto* vec : {&k, &v, &q}) {
        for (float& x : *vec) x = nd(rng);
      }
      for (int64_t t = 0; t < n; ++t) {
        for (uint32_t h = 0; h < hk; ++h) {
          for (uint32_t i = 0; i < dk; ++i) {
            const uint16_t x = f32_to_f16(k[(t * hk + h) * dk + i]);
            k16[(h * cap + pos0 + t) * dk + i] = x;
            kref[(h * cap + pos0 + t) * dk + i] = f16_to_f32(x);
          }
          for (uint32_t i = 0; i < dv; ++i) {
            const uint16_t x = f32_to_f16(v[(t * hk + h) * dv + i]);
            v16[(h * cap + pos0 + t) * dv + i] = x;
            vref[(h * cap + pos0 + t) * dv + i] = f16_to_f32(x);
          }
        }
      }
      // The pass attends with the groups quantised when the previous pass ended.
      const int64_t qend = policy::kivi_quantised_end(pos0, R, G);
      for (; quantised < qend; quantised += G) {
        for (uint32_t h = 0; h < hk; ++h) {
          std::vector<uint8_t> kb(cpu::kivi_block_bytes(f, cpu::KiviPlane::kKey, dk));
          std::vector<uint8_t> vb(cpu::kivi_block_bytes(f, cpu::KiviPlane::kValue, dv));
          const int64_t t0 = quantised % kBt;
          cpu::kivi_quantize_keys(f, dk, &k16[(h * cap + quantised) * dk], dk, t0 / G, kb.data());
          cpu::kivi_quantize_values(f, dv, &v16[(h * cap + quantised) * dv], dv, t0, G, vb.data());
          cpu::kivi_dequant_ref(f, cpu::KiviPlane::kKey, dk, kb.data(), t0, G,
                                &kref[(h * cap + quantised) * dk]);
          cpu::kivi_dequant_ref(f, cpu::KiviPlane::kValue, dv, vb.data(), t0, G,
                                &vref[(h * cap + quantised) * dv]);
        }
      }
      passes_with_quantised += qend > 0;
      const LayerAttention la{0.17f, 0.0f, 0};
      kv.write(0, {k.data(), v.data()});
      kv.attend(0, q.data(), n_head, la, o.data());
      // Reference: f32 spans per block, as ResidentKv hands them.
      std::vector<cpu::KvSpan> spans;
      for (int64_t b = 0; b * kBt < pos0 + n; ++b) {
        cpu::KvSpan s;
        s.pos0 = b * kBt;
        s.n_tokens = std::min(kBt, pos0 + n - s.pos0);
        s.k = kref.data() + s.pos0 * dk;
        s.v = vref.data() + s.pos0 * dv;
        s.k_head_stride = cap * dk;
        s.v_head_stride = cap * dv;
        spans.push_back(s);
      }
      cpu::AttnParams ap;
      ap.head_dim_k = dk;
      ap.head_dim_v = dv;
      ap.q_per_kv = n_head / hk;
      ap.scale = la.scale;
      ap.kv_dtype = cpu::KvDtype::kF32;
      std::vector<float> o_ref(o.size());
      std::vector<uint8_t> scratch(cpu::attention_scratch_bytes(ap, pool.size()));
      cpu::attend(pool, cpu::best_isa(), ap, {q.data(), n_head * dk, n, n_head, pos0}, spans,
                  {o_ref.data(), n_head * dv, nullptr, 0}, scratch);
      expect_bit_identical(o, o_ref, "pass at " + std::to_string(pos0));
      kv.end_pass();
    }
    EXPECT_GT(passes_with_quantised, 30);
    // 190 positions, 144 quantised: block 0 holds quantised positions only, its f16 block is freed;
    // block 1 has both.
    const uint64_t f16_block = geo.block_bytes(0);
    const uint64_t q_block = hk * (cpu::kivi_block_bytes(f, cpu::KiviPlane::kKey, dk) +
                                   cpu::kivi_block_bytes(f, cpu::KiviPlane::kValue, dv));
    EXPECT_EQ(kv.kv_bytes_in_use(), f16_block + 2 * ((q_block + 63) / 64 * 64));
  }
}

TEST(KiviKv, OffloadedPlacementsMatchResidentBitForBit) {
  const auto ps = passes(300, 37, 36);
  ThreadPool pool(2);
  const cpu::Isa isa = cpu::best_isa();
  const LayerAttention las[] = {{0.125f, 0.0f, 0}, {0.2f, 30.0f, 200}};
  for (auto rep : {policy::Representation::kKivi4, policy::Representation::kKivi2}) {
    for (const auto& la : las) {
      const KvGeometry geo = geometry({2, 2, 2}, 64, 32);
      const KvOptions base = kivi_options(rep, 32, 48);
      MemoryLedger lr;
      ResidentKv resident(geo, 400, 6, lr, pool, isa, base);
      const auto ref = run(resident, 6, ps, 3, la);
      struct Config {
        policy::Placement p;
        uint32_t group, depth;
        bool disk;
      };
      for (const Config& c :
           {Config{policy::Placement::kLayer, 0, 1, false}, Config{policy::Placement::kLayer, 0, 2, true},
            Config{policy::Placement::kHeadInfer, 1, 1, false},
            Config{policy::Placement::kHeadInfer, 1, 2, true}}) {
        KvOptions o = base;
        o.placement.placement = c.p;
        o.placement.group = c.group;
        o.placement.prefetch_depth = c.depth;
        if (c.disk) o.disk_dir = disk_dir();
        MemoryLedger lt;
        TieredKv tiered(geo, 400, 6, lt, pool, isa, o);
        const auto got = run(tiered, 6, ps, 3, la);
        expect_bit_identical(got, ref,
                             std::string(policy::placement_name(c.p)) + (c.disk ? " disk" : " host") +
                                 " depth " + std::to_string(c.depth) + " window " +
                                 std::to_string(la.window));
        // What the footprint predicts is what the cache holds.
        const KvFootprint fp = kv_footprint(o, geo, 400, 6, pool.size());
        EXPECT_EQ(lt.current(Tier::kDevice, Category::kKv), fp.device_kv);
        EXPECT_EQ(lt.current(c.disk ? Tier::kDisk : Tier::kHost, Category::kKv),
                  c.disk ? fp.disk_kv : fp.host_kv);
      }
      const KvFootprint fp = kv_footprint(base, geo, 400, 6, pool.size());
      EXPECT_EQ(lr.current(Tier::kDevice, Category::kKv), fp.device_kv);
    }
  }
}

TEST(KiviKv, AResidualWindowAsLongAsTheContextIsF16) {
  const auto ps = passes(200, 64, 20);
  ThreadPool pool(2);
  const KvGeometry geo = geometry({2, 2}, 32, 32);
  MemoryLedger l0;
  ResidentKv f16(geo, 256, 4, l0, pool, cpu::best_isa());
  const auto ref = run(f16, 4, ps, 5, {0.1f, 0.0f, 0});
  for (auto place : {policy::Placement::kResident, policy::Placement::kLayer}) {
    KvOptions o = kivi_options(policy::Representation::kKivi2, 32, 256);
    o.placement.placement = place;
    MemoryLedger l1;
    std::unique_ptr<KvCache> kv;
    if (place == policy::Placement::kResident) {
      kv = std::make_unique<ResidentKv>(geo, 256, 4, l1, pool, cpu::best_isa(), o);
    } else {
      kv = std::make_unique<TieredKv>(geo, 256, 4, l1, pool, cpu::best_isa(), o);
    }
    expect_bit_identical(run(*kv, 4, ps, 5, {0.1f, 0.0f, 0}), ref,
                         std::string(policy::placement_name(place)));
  }
  // And a shorter window does change the result (the comparison above can fail).
  KvOptions o = kivi_options(policy::Representation::kKivi2, 32, 64);
  MemoryLedger l2;
  ResidentKv q(geo, 256, 4, l2, pool, cpu::best_isa(), o);
  EXPECT_NE(run(q, 4, ps, 5, {0.1f, 0.0f, 0}), ref);
}

TEST(KiviKv, FewerHomeBytesAndTruncationIntoQuantisedRowsRefused) {
  ThreadPool pool(1);
  KvGeometry geo = geometry({3}, 64, 64);
  geo.block_tokens = 256;  // the default block
  KvOptions f16;
  f16.placement.placement = policy::Placement::kLayer;
  f16.max_new_rows = 64;
  KvOptions k4 = f16;
  k4.representation = policy::Representation::kKivi4;
  KvOptions k2 = f16;
  k2.representation = policy::Representation::kKivi2;
  const auto home = [&](const KvOptions& o) { return kv_footprint(o, geo, 8192, 9, 1).host_kv; };
  EXPECT_LT(home(k4), home(f16) * 0.4);  // 20 KiB pages for 64 KiB, plus two f16 blocks
  EXPECT_LT(home(k2), home(k4));
  // A key group must not straddle blocks.
  KvOptions bad = k4;
  bad.knobs.kivi_group = 48;
  EXPECT_THROW(kv_footprint(bad, geo, 8192, 9, 1), Error);

  for (auto place : {policy::Placement::kResident, policy::Placement::kLayer}) {
    KvOptions o = kivi_options(policy::Representation::kKivi4, 32, 32);
    o.placement.placement = place;
    MemoryLedger l;
    std::unique_ptr<KvCache> kv;
    if (place == policy::Placement::kResident) {
      kv = std::make_unique<ResidentKv>(geo, 512, 9, l, pool, cpu::best_isa(), o);
    } else {
      kv = std::make_unique<TieredKv>(geo, 512, 9, l, pool, cpu::best_isa(), o);
    }
    run(*kv, 9, passes(200, 100, 0), 1, {0.1f, 0.0f, 0});  // 160 positions quantised
    EXPECT_THROW(kv->truncate(0, 150), Error);
    kv->truncate(0, 170);  // within the f16 rows: allowed
    run(*kv, 9, {{170, 30}}, 2, {0.1f, 0.0f, 0});
    kv->truncate(0, 0);
    run(*kv, 9, passes(100, 50, 2), 1, {0.1f, 0.0f, 0});
    EXPECT_EQ(kv->positions(0), 102);
  }
}

}  // namespace
}  // namespace kvtier::kv
