// InfiniGen's KV-side pieces: the partial key cache (spec infinigen.md §5.1–5.2, §7.3, §15.2) and
// the gather of chosen rows with the current token always attended (§7.1–7.2, A7).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "backend/cpu/spec_scores.h"
#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "kv/partial_keys.h"
#include "kv/row_gather.h"
#include "kv/speculation_observer.h"
#include "kv/tiered_kv.h"
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
  EXPECT_EQ(PartialKeys::bytes(set, shape), 2u * kLayers * kHk * 128 * 4 * 2);  // f16 rows
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
        for (int64_t c = 0; c < 4; ++c) {  // stored as f16: within half a unit of the last place
          const float want = rot[static_cast<size_t>(cols[static_cast<size_t>(c)])];
          EXPECT_NEAR(f16_to_f32(pk.rows(1, l, g)[(10 + t) * 4 + c]), want, 1e-4 + std::abs(want) * 0x1p-11f);
        }
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
  std::vector<uint16_t> pk_rows;  // [T, k] f16
  for (const float x : random_rows(rng, T * k)) pk_rows.push_back(f32_to_f16(x));
  const auto qp = random_rows(rng, 3 * k);  // one KV head with 3 query heads
  const uint16_t* pk_ptr = pk_rows.data();
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
  in.group_scores = cpu::spec_scores_ref;
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

// The executor (TieredKv with selection infinigen): a decode step's layers >= 2 attend exactly the rows
// policy::speculate chooses from the look-ahead query (here a fake model hook's) against the partial
// keys of the prompt's stored (f16) keys, plus the current token; layers 0-1 attend every row.
class LookaheadCompute final : public KvCompute {
 public:
  std::vector<std::vector<float>> q;  // [layer] -> [n_head, d] the look-ahead's query of that layer
  void project_kv(uint32_t, const float*, std::span<const int64_t>, float*, float*) override {
    FAIL() << "not used";
  }
  void rope_q(uint32_t, const float*, int64_t, int64_t, float*) override { FAIL() << "not used"; }
  void project_q(uint32_t layer, const float*, std::span<const int64_t> positions, float* out) override {
    ASSERT_EQ(positions.size(), 1u);
    std::copy(q[layer].begin(), q[layer].end(), out);
  }
  int64_t max_rows() const override { return 1 << 20; }
};

float f16_round(float x) {
  return f16_to_f32(f32_to_f16(x));
}

// Softmax attention of one query head over the given key rows (f16-rounded K and V, [n_rows, d]).
std::vector<float> attend_rows(const float* q, const std::vector<const float*>& ks,
                               const std::vector<const float*>& vs, float scale) {
  std::vector<double> s(ks.size());
  double m = -1e300;
  for (size_t j = 0; j < ks.size(); ++j) {
    double dot = 0;
    for (int64_t i = 0; i < kD; ++i) dot += double{q[i]} * f16_round(ks[j][i]);
    s[j] = dot * scale;
    m = std::max(m, s[j]);
  }
  double z = 0;
  for (double& x : s) z += (x = std::exp(x - m));
  std::vector<float> o(kD, 0.0f);
  for (int64_t i = 0; i < kD; ++i) {
    double acc = 0;
    for (size_t j = 0; j < ks.size(); ++j) acc += s[j] / z * f16_round(vs[j][i]);
    o[static_cast<size_t>(i)] = static_cast<float>(acc);
  }
  return o;
}

// A skew set of `layers` layers of kHk KV heads of size d (4 partial columns).
std::shared_ptr<skew::SkewSet> random_skew(std::mt19937& rng, uint32_t layers, int64_t d) {
  auto skew = std::make_shared<skew::SkewSet>();
  skew->head_dim = d;
  skew->partial_ratio = 0.25f;
  skew->partial_columns = 4;
  for (uint32_t l = 0; l < layers; ++l) {
    skew::LayerSkew Ls;
    Ls.n_head_kv = kHk;
    for (int64_t g = 0; g < kHk; ++g) {
      const auto a = skew::skew_matrix(random_rows(rng, 50 * d), 50, d);
      Ls.a.insert(Ls.a.end(), a.a.begin(), a.a.end());
      Ls.sigma.insert(Ls.sigma.end(), a.sigma.begin(), a.sigma.end());
      for (int32_t c : {1, 5, 9, 13}) Ls.cols.push_back(c);
    }
    skew->layers.push_back(std::move(Ls));
  }
  return skew;
}

// The executor under test: a TieredKv with selection infinigen on the layer placement (128-row blocks,
// 256 positions) over L layers of kHk KV heads, a skew whose offline columns are 1, 5, 9, 13 of every
// head, and a fake look-ahead query per layer. pass() runs one pass of n tokens of sequence 0 through
// every layer with random q, k and v rows (kept in q, k, v: every position's rows per layer).
struct InfinigenDriver {
  static constexpr float kScale = 0.25f;
  uint32_t n_layer;
  std::shared_ptr<skew::SkewSet> skew;
  ThreadPool pool{2};
  MemoryLedger ledger;
  std::unique_ptr<TieredKv> kv;
  LookaheadCompute hook;
  std::vector<std::vector<float>> q, k, v;  // [layer] [positions, heads, kD] f32 rows written so far

  // o: the knobs and retention of the test (placement, selection and skew are set here).
  InfinigenDriver(std::mt19937& rng, uint32_t layers, KvOptions o)
      : n_layer(layers), skew(random_skew(rng, layers, kD)), q(layers), k(layers), v(layers) {
    KvGeometry geo;
    geo.n_head_kv.assign(layers, kHk);
    geo.head_dim_k = geo.head_dim_v = kD;
    geo.block_tokens = 128;  // 128 rows x 32 bytes: one 4 KiB page
    o.placement.placement = policy::Placement::kLayer;
    o.selection = policy::Selection::kInfinigen;
    o.skew = skew;
    kv = std::make_unique<TieredKv>(geo, 256, kHeads, ledger, pool, cpu::best_isa(), o);
    kv->set_compute(&hook);
    for (uint32_t l = 0; l < layers; ++l) hook.q.push_back(random_rows(rng, kHeads * kD));
  }

  // on_layer(l, the pass's q rows [n, kHeads, kD], the attention output [n, kHeads, kD]) after each layer.
  template <class OnLayer>
  void pass(std::mt19937& rng, int64_t n, OnLayer&& on_layer) {
    const LayerAttention la{kScale, 0.0f, 0};
    std::vector<float> x(4, 0.0f);  // the layer input the look-ahead would project (the fake ignores it)
    kv->begin_pass({0, n});
    for (uint32_t l = 0; l < n_layer; ++l) {
      const auto qn = random_rows(rng, n * kHeads * kD), kn = random_rows(rng, n * kHk * kD),
                 vn = random_rows(rng, n * kHk * kD);
      q[l].insert(q[l].end(), qn.begin(), qn.end());
      k[l].insert(k[l].end(), kn.begin(), kn.end());
      v[l].insert(v[l].end(), vn.begin(), vn.end());
      LayerRows rows;
      rows.k = kn.data();
      rows.v = vn.data();
      rows.x = x.data();
      kv->write(l, rows);
      std::vector<float> out(static_cast<size_t>(n * kHeads * kD), 0.0f);
      kv->attend(l, qn.data(), kHeads, la, out.data());
      on_layer(l, qn, out);
    }
    kv->end_pass();
  }
};

void decode_steps_attend_the_speculated_rows(policy::InfinigenGroup rule) {
  SCOPED_TRACE(std::string(policy::infinigen_group_name(rule)));
  constexpr uint32_t L = 4;
  constexpr int64_t kPrompt = 200, kCap = 128;
  constexpr float kScale = InfinigenDriver::kScale;
  std::mt19937 rng(3);
  KvOptions o;
  o.knobs.infinigen_group = rule;
  o.knobs.infinigen_alpha = 1.0;
  o.knobs.infinigen_budget = 0.25;
  InfinigenDriver run(rng, L, o);
  const std::vector<std::vector<float>>& q = run.q;
  const std::vector<std::vector<float>>& k = run.k;
  const std::vector<std::vector<float>>& v = run.v;
  const LookaheadCompute& hook = run.hook;
  const skew::SkewSet* skew = run.skew.get();
  std::vector<std::vector<float>> out(L);
  for (int64_t pass_n : {kPrompt, int64_t{1}})
    run.pass(rng, pass_n,
             [&](uint32_t l, const std::vector<float>&, std::vector<float>& o_l) { out[l] = o_l; });
  // The reference speculation: the partial keys of the prompt's f16 keys, columns from its q and k.
  MemoryLedger ref_ledger;
  PartialKeys pk(*skew, PartialKeysShape{kHeads, 256, 1, 64}, ref_ledger);
  for (uint32_t l = 2; l < L; ++l) pk.observe(0, l, q[l].data(), k[l].data(), kPrompt);
  pk.choose_columns(0);
  const InfinigenStats st = run.kv->stats().infinigen;
  EXPECT_EQ(st.layer_steps, 2u);
  uint64_t fetched = 0;
  for (uint32_t l = 0; l < L; ++l) {
    std::vector<float> k16(k[l].begin(), k[l].begin() + kPrompt * kHk * kD);
    for (float& e : k16) e = f16_round(e);
    pk.write(0, l, 0, k16.data(), kPrompt);
    std::vector<float> qp(kHeads * 4);
    for (int64_t h = 0; h < kHeads; ++h)
      policy::partial_rows(hook.q[l].data() + h * kD, 1, kD,
                           pk.projection(0, l, static_cast<uint32_t>(h / 3)), 4, qp.data() + h * 4);
    const uint16_t* pks[kHk] = {pk.rows(0, l, 0), pk.rows(0, l, 1)};
    const int64_t T[1] = {kPrompt};
    const int64_t cap[1] = {policy::speculation_cap(0.25, kPrompt)};
    ASSERT_LT(cap[0], kCap);
    policy::SpecInput in{1, kHeads, kHk, 4, kScale, qp.data(), pks, T, cap, cpu::spec_scores_ref};
    in.group = o.knobs.infinigen_group;  // the executor's rule (GQA: 3 query heads per KV head)
    in.head_scores = cpu::spec_head_scores_ref;
    policy::SpecResult r;
    policy::speculate(in, 1.0f, r);
    if (l >= 2) {
      EXPECT_LT(r.chosen[0], kPrompt) << "layer " << l << ": the selection must drop rows here";
      fetched += static_cast<uint64_t>(r.chosen[0] * kHk);
    }
    for (int64_t h = 0; h < kHeads; ++h) {
      const int64_t g = h / 3;
      std::vector<const float*> ks, vs;
      auto add = [&](int64_t row) {
        ks.push_back(k[l].data() + (row * kHk + g) * kD);
        vs.push_back(v[l].data() + (row * kHk + g) * kD);
      };
      if (l >= 2) {
        for (int32_t row : r.rows(0, g, kHk)) add(row);
      } else {
        for (int64_t row = 0; row < kPrompt; ++row) add(row);
      }
      add(kPrompt);  // the current token
      const auto ref = attend_rows(q[l].data() + (kPrompt * kHeads + h) * kD, ks, vs, kScale);
      for (int64_t i = 0; i < kD; ++i)
        EXPECT_NEAR(out[l][static_cast<size_t>(h * kD + i)], ref[static_cast<size_t>(i)], 2e-5f)
            << "layer " << l << " head " << h << " element " << i;
    }
  }
  EXPECT_EQ(st.rows_fetched, fetched);
  EXPECT_EQ(st.rows_total, 2u * kPrompt * kHk);
  EXPECT_EQ(st.selective_loads, 2u);
}

TEST(InfinigenExecutor, DecodeStepsAttendTheSpeculatedRowsPlusTheCurrentToken) {
  decode_steps_attend_the_speculated_rows(policy::InfinigenGroup::kRelative);
  decode_steps_attend_the_speculated_rows(policy::InfinigenGroup::kMax);
}

std::string disk_dir() {
  const auto d = std::filesystem::path(KVTIER_BINARY_DIR) / "test_tmp" / "infinigen_pool_disk";
  std::filesystem::create_directories(d);
  return d.string();
}

// The pool tests' engine: L layers of kHk KV heads of size d in 128-row blocks, and the layer placement
// with InfiniGen's selection and the pool retention of `slots` slots for the 2 pooled layers' K and V
// f16 rows (alpha, budget and skew are each test's own).
KvGeometry pool_geometry(uint32_t layers, int64_t d) {
  KvGeometry geo;
  geo.n_head_kv.assign(layers, kHk);
  geo.head_dim_k = geo.head_dim_v = d;
  geo.block_tokens = 128;
  return geo;
}

KvOptions pool_options(policy::PoolEviction eviction, int64_t slots, int64_t d) {
  KvOptions o;
  o.placement.placement = policy::Placement::kLayer;
  o.selection = policy::Selection::kInfinigen;
  o.retention = policy::Retention::kPool;
  o.knobs.pool_eviction = eviction;
  o.knobs.pool_limit = slots * (2 * kHk) * 2 * d * 2;
  return o;
}

// The bounded pool (retention pool, FIFO, every live row chosen): once full, each new token's K and V
// take the slot of the oldest position, so a decode step of a pooled layer (>= 2) attends exactly the last
// C positions and itself; a wrong slot for K or V (or a stale row) changes the output. Layers 0-1 attend
// everything. A prompt longer than the pool (2.3 C here) is prefilled in chunks that evict between them
// (docs/infinigen.md): a query at position p of a chunk at p0 attends positions max(0, p0 - C) .. p. On a
// disk home the victims' slots are rewritten through their I/O pages, with the same results.
struct PoolCase {
  bool disk;
  int64_t prompt, chunk;
};

class PoolSlots : public ::testing::TestWithParam<PoolCase> {};

TEST_P(PoolSlots, KeepEachTokensKeyAndValueTogether) {
  const PoolCase pc = GetParam();
  constexpr uint32_t L = 4;
  constexpr int64_t kSteps = 60, kC = 128, kCtx = 512, kTurn = 40;
  constexpr float kScale = 0.25f;
  std::mt19937 rng(5);
  const KvGeometry geo = pool_geometry(L, kD);
  KvOptions o = pool_options(policy::PoolEviction::kFifo, kC, kD);
  o.knobs.infinigen_alpha = std::numeric_limits<double>::infinity();
  o.knobs.infinigen_budget = 1.0;
  o.skew = random_skew(rng, L, kD);
  if (pc.disk) o.disk_dir = disk_dir();
  ThreadPool pool(2);
  MemoryLedger ledger;
  TieredKv kv(geo, kCtx, kHeads, ledger, pool, cpu::best_isa(), o);
  if (pc.disk) {
    EXPECT_NE(kv.stats().home.find("disk file"), std::string::npos) << kv.stats().home;
  }
  LookaheadCompute hook;
  kv.set_compute(&hook);
  for (uint32_t l = 0; l < L; ++l) hook.q.push_back(random_rows(rng, kHeads * kD));
  std::vector<std::vector<float>> k(L), v(L);  // [layer] every position's rows
  const LayerAttention la{kScale, 0.0f, 0};
  std::vector<float> x(4, 0.0f);
  int64_t checked = 0;
  std::vector<std::pair<int64_t, int64_t>> passes;  // (pos0, n)
  for (int64_t p = 0; p < pc.prompt; p += pc.chunk) passes.emplace_back(p, std::min(pc.chunk, pc.prompt - p));
  // decode steps, a second prompt of kTurn tokens (a chat turn: its rows evict, the pool is full), steps
  for (int64_t s = 0; s < kSteps / 2; ++s) passes.emplace_back(pc.prompt + s, 1);
  passes.emplace_back(pc.prompt + kSteps / 2, kTurn);
  for (int64_t s = kSteps / 2; s < kSteps; ++s) passes.emplace_back(pc.prompt + kTurn + s, 1);
  uint64_t live_total = 0;  // rows the decode steps' speculations see: min(position, C) per pooled head
  for (const auto& [pos0, n] : passes) {
    if (n == 1) live_total += static_cast<uint64_t>(2 * kHk * std::min(kC, pos0));
    kv.begin_pass({0, n});
    for (uint32_t l = 0; l < L; ++l) {
      const auto qn = random_rows(rng, n * kHeads * kD), kn = random_rows(rng, n * kHk * kD),
                 vn = random_rows(rng, n * kHk * kD);
      k[l].insert(k[l].end(), kn.begin(), kn.end());
      v[l].insert(v[l].end(), vn.begin(), vn.end());
      LayerRows rows;
      rows.k = kn.data();
      rows.v = vn.data();
      rows.x = x.data();
      kv.write(l, rows);
      std::vector<float> out(static_cast<size_t>(n * kHeads * kD), 0.0f);
      kv.attend(l, qn.data(), kHeads, la, out.data());
      // FIFO: the live rows are the last min(pos0, C) positions before the pass, then the pass's own
      const int64_t first = l >= 2 ? std::max<int64_t>(0, pos0 - kC) : 0;
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t h = 0; h < kHeads; ++h) {
          const int64_t g = h / (kHeads / kHk);
          std::vector<const float*> ks, vs;
          for (int64_t row = first; row <= pos0 + t; ++row) {
            ks.push_back(k[l].data() + (row * kHk + g) * kD);
            vs.push_back(v[l].data() + (row * kHk + g) * kD);
          }
          const auto ref = attend_rows(qn.data() + (t * kHeads + h) * kD, ks, vs, kScale);
          for (int64_t i = 0; i < kD; ++i)
            ASSERT_NEAR(out[static_cast<size_t>((t * kHeads + h) * kD + i)], ref[static_cast<size_t>(i)],
                        1e-4f)
                << "layer " << l << " position " << pos0 + t << " head " << h << " element " << i;
        }
        ++checked;
      }
    }
    kv.end_pass();
    const InfinigenStats st = kv.stats().infinigen;
    ASSERT_LE(st.pool_live_max, kC);  // never more live rows than slots
  }
  EXPECT_EQ(checked, (pc.prompt + kSteps + kTurn) * L);
  const InfinigenStats st = kv.stats().infinigen;
  const int64_t written = pc.prompt + kSteps + kTurn, evicted = written - kC;
  ASSERT_GE(pc.prompt + kSteps / 2, kC);  // the pool is full when the second prompt comes
  const int64_t prefill_evicted = std::max<int64_t>(0, pc.prompt - kC) + kTurn;
  EXPECT_EQ(st.pool_slots, kC);
  EXPECT_EQ(st.pool_live_max, kC);
  EXPECT_EQ(st.pool_evictions, static_cast<uint64_t>(evicted * 2 * kHk));
  EXPECT_EQ(st.pool_prefill_evictions, static_cast<uint64_t>(prefill_evicted * 2 * kHk));
  EXPECT_EQ(st.pool_max_evicted_pos, evicted - 1);
  EXPECT_EQ(st.layer_pool_min_live[2], evicted);
  EXPECT_EQ(st.layer_pool_min_live[0], -1);  // layers 0-1 are not pooled
  // every decode step speculated over the C live slots
  EXPECT_EQ(st.rows_total, live_total);
  // rows that were evicted cannot come back
  EXPECT_THROW(kv.truncate(0, written - 5), Error);
}

INSTANTIATE_TEST_SUITE_P(InfinigenExecutor, PoolSlots,
                         ::testing::Values(PoolCase{false, 100, 100}, PoolCase{true, 100, 100},
                                           PoolCase{false, 300, 37}, PoolCase{true, 300, 37},
                                           PoolCase{true, 300, 300}),
                         [](const auto& info) {
                           return std::string(info.param.disk ? "Disk" : "Host") + "Prompt" +
                                  std::to_string(info.param.prompt) + "Chunk" +
                                  std::to_string(info.param.chunk);
                         });

// Spec §15.13 [D] (--kv-pool-prefill weight): a prompt larger than the pool evicts, under Counter and LRU,
// the slot whose row has the smallest cumulative prefill attention weight (the softmax probability the
// prefill queries gave it, summed over queries and the KV head's query heads), from the older half. A
// reference model of the pool (slots, positions, masses from a double-precision softmax) replays a 300-token
// prompt in chunks of 50 into a pool of 128 slots; every query of pooled layer 2 must attend exactly the rows
// the reference keeps. FIFO evicts by age alone (the PoolSlots cases above), and the default rule at prefill
// (order: the lowest slot of the older half, as FIFO while slots follow positions) keeps other rows: the test
// tells them apart (checked below; with order it fails).
struct RefSlot {
  int64_t pos = -1;
  double mass = 0;
};

class PoolPrefillMass : public ::testing::TestWithParam<policy::PoolEviction> {};

TEST_P(PoolPrefillMass, APromptLargerThanThePoolEvictsTheLeastAttendedRows) {
  constexpr uint32_t L = 4;  // layers 2 and 3 pooled (pool_options sizes the limit for two)
  constexpr int64_t kC = 128, kCtx = 512, kPrompt = 300, kChunk = 50;
  constexpr float kScale = 0.25f;
  std::mt19937 rng(21);
  const KvGeometry geo = pool_geometry(L, kD);
  KvOptions o = pool_options(GetParam(), kC, kD);
  o.knobs.pool_prefill = policy::PoolPrefill::kWeight;
  o.knobs.infinigen_alpha = std::numeric_limits<double>::infinity();
  o.knobs.infinigen_budget = 1.0;
  o.max_new_rows = kChunk;
  o.skew = random_skew(rng, L, kD);
  ThreadPool pool(2);
  MemoryLedger ledger;
  TieredKv kv(geo, kCtx, kHeads, ledger, pool, cpu::best_isa(), o);
  LookaheadCompute hook;
  kv.set_compute(&hook);
  for (uint32_t l = 0; l < L; ++l) hook.q.push_back(random_rows(rng, kHeads * kD));
  std::vector<float> k, v;  // layer 2's rows of every position [pos, kHk, kD]
  std::vector<std::vector<RefSlot>> ref(kHk, std::vector<RefSlot>(kC));
  int64_t live = 0, differs_from_lowest_slot = 0;
  const LayerAttention la{kScale, 0.0f, 0};
  std::vector<float> x(4, 0.0f);
  for (int64_t pos0 = 0; pos0 < kPrompt; pos0 += kChunk) {
    const int64_t n = kChunk;
    kv.begin_pass({0, n});
    for (uint32_t l = 0; l < L; ++l) {
      // a few rows far more attended than the rest: their keys along the queries' common direction
      auto qn = random_rows(rng, n * kHeads * kD), kn = random_rows(rng, n * kHk * kD),
           vn = random_rows(rng, n * kHk * kD);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t h = 0; h < kHeads; ++h) qn[static_cast<size_t>((t * kHeads + h) * kD)] = 3.0f;
        if (rng() % 7 == 0)
          for (int64_t g = 0; g < kHk; ++g) kn[static_cast<size_t>((t * kHk + g) * kD)] = 4.0f;
      }
      LayerRows rows;
      rows.k = kn.data();
      rows.v = vn.data();
      rows.x = x.data();
      kv.write(l, rows);
      std::vector<float> out(static_cast<size_t>(n * kHeads * kD), 0.0f);
      kv.attend(l, qn.data(), kHeads, la, out.data());
      if (l != 2) continue;
      k.insert(k.end(), kn.begin(), kn.end());
      v.insert(v.end(), vn.begin(), vn.end());
      for (int64_t g = 0; g < kHk; ++g) {
        std::vector<RefSlot>& slots = ref[static_cast<size_t>(g)];
        const std::vector<RefSlot> before(slots.begin(), slots.begin() + live);
        // the pass's rows take their slots first (victims by the masses before this pass) ...
        std::vector<int64_t> slot_of(static_cast<size_t>(n));
        int64_t lv = live;
        for (int64_t t = 0; t < n; ++t) {
          const int64_t pos = pos0 + t;
          int64_t s = lv;
          if (lv < kC) {
            ++lv;
          } else {
            for (const bool only_old : {true, false}) {
              s = -1;
              for (int64_t j = 0; j < kC; ++j) {
                const RefSlot& r = slots[static_cast<size_t>(j)];
                if (only_old && r.pos >= pos / 2) continue;
                if (s < 0 || r.mass < slots[static_cast<size_t>(s)].mass) s = j;
              }
              if (s >= 0) break;
            }
            // the order rule: the lowest slot of the older half (of all slots when none is that old)
            int64_t lowest = 0;
            while (lowest < kC && slots[static_cast<size_t>(lowest)].pos >= pos / 2) ++lowest;
            if (lowest == kC) lowest = 0;
            differs_from_lowest_slot += lowest != s;
          }
          slots[static_cast<size_t>(s)] = RefSlot{pos, 0.0};
          slot_of[static_cast<size_t>(t)] = s;
        }
        // ... while the pass's queries attend the rows live before it and the pass's own (causally)
        std::vector<double> mass(static_cast<size_t>(live + n), 0.0);
        for (int64_t t = 0; t < n; ++t) {
          std::vector<const float*> ks, vs;
          for (const RefSlot& r : before) {
            ks.push_back(k.data() + (r.pos * kHk + g) * kD);
            vs.push_back(v.data() + (r.pos * kHk + g) * kD);
          }
          for (int64_t u = 0; u <= t; ++u) {
            ks.push_back(k.data() + ((pos0 + u) * kHk + g) * kD);
            vs.push_back(v.data() + ((pos0 + u) * kHk + g) * kD);
          }
          for (int64_t h = g * (kHeads / kHk); h < (g + 1) * (kHeads / kHk); ++h) {
            const float* qh = qn.data() + (t * kHeads + h) * kD;
            const auto want = attend_rows(qh, ks, vs, kScale);
            for (int64_t i = 0; i < kD; ++i)
              ASSERT_NEAR(out[static_cast<size_t>((t * kHeads + h) * kD + i)], want[static_cast<size_t>(i)],
                          1e-4f)
                  << "position " << pos0 + t << " head " << h << " element " << i;
            std::vector<double> sc(ks.size());
            double m = -1e300, z = 0;
            for (size_t j = 0; j < ks.size(); ++j) {
              double dot = 0;
              for (int64_t i = 0; i < kD; ++i) dot += double{qh[i]} * f16_round(ks[j][i]);
              m = std::max(m, sc[j] = dot * kScale);
            }
            for (double& e : sc) z += (e = std::exp(e - m));
            for (size_t j = 0; j < ks.size(); ++j) mass[j] += sc[j] / z;
          }
        }
        for (int64_t j = 0; j < live; ++j)  // rows kept through the pass
          if (slots[static_cast<size_t>(j)].pos < pos0)
            slots[static_cast<size_t>(j)].mass += mass[static_cast<size_t>(j)];
        for (int64_t t = 0; t < n; ++t) {
          RefSlot& r = slots[static_cast<size_t>(slot_of[static_cast<size_t>(t)])];
          if (r.pos == pos0 + t) r.mass = mass[static_cast<size_t>(live + t)];
        }
        if (g + 1 == kHk) live = lv;
      }
    }
    kv.end_pass();
  }
  const InfinigenStats st = kv.stats().infinigen;
  EXPECT_EQ(st.pool_slots, kC);
  EXPECT_EQ(st.pool_prefill_evictions, static_cast<uint64_t>((kPrompt - kC) * 2 * kHk));
  EXPECT_GT(differs_from_lowest_slot, 20) << "the weights must choose other victims than the slot order";
}

INSTANTIATE_TEST_SUITE_P(InfinigenExecutor, PoolPrefillMass,
                         ::testing::Values(policy::PoolEviction::kCounter, policy::PoolEviction::kLru),
                         [](const auto& info) {
                           return std::string(policy::pool_eviction_name(info.param));
                         });

// A8, second clause: a slot the pool reuses holds the new token's partial key, not the evicted one's.
// FIFO pool of 32 slots; a 40-token prompt (below the 64 tokens that choose columns, so the offline
// columns 1, 5, 9, 13) then decode steps. At position 50 (slot 50 mod 32 = 18, reused twice over) layer
// 2's key of each KV head is planted along that head's speculation direction, so that the next step's
// partial scores rank it first by far: with alpha 1 the speculation takes that slot alone. A stale
// partial-key row (the evicted position's) would leave the slot at a random score.
class SpecRecorder final : public SpeculationObserver {
 public:
  void on_speculation(SeqId, uint32_t layer, int64_t position, int64_t, const policy::SpecResult& r,
                      int64_t b, int64_t n_head_kv) override {
    std::vector<std::vector<int32_t>> rows;
    for (int64_t g = 0; g < n_head_kv; ++g) {
      const auto x = r.rows(b, g, n_head_kv);
      rows.emplace_back(x.begin(), x.end());
    }
    seen[{layer, position}] = rows;
  }
  std::map<std::pair<uint32_t, int64_t>, std::vector<std::vector<int32_t>>> seen;
};

TEST(InfinigenExecutor, A8AReusedPoolSlotHoldsTheNewTokensPartialKey) {
  constexpr uint32_t L = 4;  // layers 2 and 3 pooled: pool_options sizes the limit for two
  constexpr int64_t kC = 32, kPrompt = 40, kPlant = 50, kSteps = 14;
  std::mt19937 rng(7);
  KvOptions o = pool_options(policy::PoolEviction::kFifo, kC, kD);
  o.knobs.infinigen_alpha = 1.0;
  o.knobs.infinigen_budget = 0.5;  // a cap below every row (budget 1 takes every row)
  o.knobs.infinigen_group = policy::InfinigenGroup::kMax;
  o.skew = random_skew(rng, L, kD);
  SpecRecorder rec;
  o.speculation_observer = &rec;
  ThreadPool pool(2);
  MemoryLedger ledger;
  TieredKv kv(pool_geometry(L, kD), 256, kHeads, ledger, pool, cpu::best_isa(), o);
  LookaheadCompute hook;
  kv.set_compute(&hook);
  for (uint32_t l = 0; l < L; ++l) hook.q.push_back(random_rows(rng, kHeads * kD));
  // Layer 2's planted key of KV head g: w = B_g qp_j of its first query head j (B = A[:, cols], qp_j = q_j
  // B), scaled up, so that head j's partial score k·B·qp_j = (B qp_j)·k, and so the group's maximum (kMax),
  // is far above every other row's.
  const skew::LayerSkew& sk = o.skew->layers[2];
  constexpr int64_t G = kHeads / kHk;
  std::vector<float> planted(kHk * kD, 0.0f);
  for (int64_t g = 0; g < kHk; ++g) {
    const float* a = sk.head_a(static_cast<uint32_t>(g), kD);
    const int32_t* cols = sk.head_cols(static_cast<uint32_t>(g), 4);
    std::vector<double> w(kD, 0.0);
    for (int64_t j = g * G; j < g * G + 1; ++j) {
      for (int64_t c = 0; c < 4; ++c) {
        double qp = 0;  // partial query column c of head j: q_j · A[:, cols[c]]
        for (int64_t i = 0; i < kD; ++i)
          qp += hook.q[2][static_cast<size_t>(j * kD + i)] * a[i * kD + cols[c]];
        for (int64_t i = 0; i < kD; ++i) w[static_cast<size_t>(i)] += qp * a[i * kD + cols[c]];
      }
    }
    double norm = 0;
    for (double x : w) norm += x * x;
    for (int64_t i = 0; i < kD; ++i)
      planted[static_cast<size_t>(g * kD + i)] =
          static_cast<float>(200.0 * w[static_cast<size_t>(i)] / std::sqrt(norm));
  }
  const LayerAttention la{0.25f, 0.0f, 0};
  std::vector<float> x(4, 0.0f);
  auto pass = [&](int64_t pos0, int64_t n) {
    kv.begin_pass({0, n});
    for (uint32_t l = 0; l < L; ++l) {
      auto kn = random_rows(rng, n * kHk * kD);
      const auto qn = random_rows(rng, n * kHeads * kD), vn = random_rows(rng, n * kHk * kD);
      if (l == 2 && pos0 == kPlant) kn = planted;
      LayerRows rows;
      rows.k = kn.data();
      rows.v = vn.data();
      rows.x = x.data();
      kv.write(l, rows);
      std::vector<float> out(static_cast<size_t>(n * kHeads * kD));
      kv.attend(l, qn.data(), kHeads, la, out.data());
    }
    kv.end_pass();
  };
  pass(0, kPrompt);
  for (int64_t p = kPrompt; p < kPrompt + kSteps; ++p) pass(p, 1);
  // FIFO: position p took slot p mod C (the prompt's last 8 tokens already evicted positions 0-7)
  const int32_t slot = kPlant % kC;
  const auto after = rec.seen.at({2u, kPlant + 1});
  for (int64_t g = 0; g < kHk; ++g)
    EXPECT_EQ(after[static_cast<size_t>(g)], std::vector<int32_t>{slot}) << "KV head " << g;
  // Before the planted token was written the same slot held position 18's random row: not singled out.
  const auto before = rec.seen.at({2u, kPlant});
  EXPECT_NE(before[0], std::vector<int32_t>{slot});
  EXPECT_EQ(kv.stats().infinigen.pool_live_max, kC);
}

// Selective loads with a bounded pool (alpha 1, a 10 % budget; rows of 128 bytes, so a 4 KiB I/O page holds
// 32 slots and a pool of 256 slots spans 8 of them): a disk home gives the very outputs and pool figures of
// a host home, for every eviction policy, through a prompt 2.5x the pool and decode steps whose victims lie
// in pages no chosen row brought (the load adds them: a store rewrites the victim's whole I/O page).
class PoolDiskHome : public ::testing::TestWithParam<policy::PoolEviction> {};

TEST_P(PoolDiskHome, MatchesTheHostHomeBitForBit) {
  constexpr uint32_t L = 4;
  constexpr int64_t kDh = 64, kC = 256, kPrompt = 640, kChunk = 96, kSteps = 80, kCtx = 1024;
  struct Run {
    std::vector<float> out;  // every attend() output, in order
    InfinigenStats st;
  };
  auto run = [&](bool disk) {
    std::mt19937 rng(11);
    const KvGeometry geo = pool_geometry(L, kDh);
    KvOptions o = pool_options(GetParam(), kC, kDh);
    o.knobs.infinigen_alpha = 1.0;
    o.knobs.infinigen_budget = 0.1;
    o.skew = random_skew(rng, L, kDh);
    if (disk) o.disk_dir = disk_dir();
    ThreadPool pool(2);
    MemoryLedger ledger;
    TieredKv kv(geo, kCtx, kHeads, ledger, pool, cpu::best_isa(), o);
    LookaheadCompute hook;
    kv.set_compute(&hook);
    for (uint32_t l = 0; l < L; ++l) hook.q.push_back(random_rows(rng, kHeads * kDh));
    Run r;
    const LayerAttention la{0.125f, 0.0f, 0};
    std::vector<float> x(4, 0.0f);
    std::vector<std::pair<int64_t, int64_t>> passes;
    for (int64_t p = 0; p < kPrompt; p += kChunk) passes.emplace_back(p, std::min(kChunk, kPrompt - p));
    for (int64_t s = 0; s < kSteps; ++s) passes.emplace_back(kPrompt + s, 1);
    for (const auto& [pos0, n] : passes) {
      kv.begin_pass({0, n});
      for (uint32_t l = 0; l < L; ++l) {
        hook.q[l] = random_rows(rng, kHeads * kDh);  // a new look-ahead query each step
        const auto qn = random_rows(rng, n * kHeads * kDh), kn = random_rows(rng, n * kHk * kDh),
                   vn = random_rows(rng, n * kHk * kDh);
        LayerRows rows;
        rows.k = kn.data();
        rows.v = vn.data();
        rows.x = x.data();
        kv.write(l, rows);
        std::vector<float> out(static_cast<size_t>(n * kHeads * kDh), 0.0f);
        kv.attend(l, qn.data(), kHeads, la, out.data());
        r.out.insert(r.out.end(), out.begin(), out.end());
      }
      kv.end_pass();
    }
    r.st = kv.stats().infinigen;
    if (disk) {
      EXPECT_NE(kv.stats().home.find("disk file"), std::string::npos);
    }
    return r;
  };
  const Run host = run(false), disk = run(true);
  ASSERT_EQ(host.out.size(), disk.out.size());
  EXPECT_EQ(0, std::memcmp(host.out.data(), disk.out.data(), host.out.size() * sizeof(float)));
  EXPECT_EQ(host.st.pool_evictions, disk.st.pool_evictions);
  EXPECT_EQ(host.st.pool_evictions, static_cast<uint64_t>((kPrompt + kSteps - kC) * 2 * kHk));
  EXPECT_EQ(host.st.pool_prefill_evictions, disk.st.pool_prefill_evictions);
  EXPECT_EQ(host.st.pool_prefill_evictions, static_cast<uint64_t>((kPrompt - kC) * 2 * kHk));
  EXPECT_EQ(host.st.rows_fetched, disk.st.rows_fetched);
  EXPECT_EQ(host.st.layer_pool_min_live, disk.st.layer_pool_min_live);
  EXPECT_EQ(host.st.pool_live_max, kC);
  EXPECT_LT(host.st.rows_fetched, host.st.rows_total / 4);  // the loads were selective
}

INSTANTIATE_TEST_SUITE_P(InfinigenExecutor, PoolDiskHome,
                         ::testing::Values(policy::PoolEviction::kCounter, policy::PoolEviction::kFifo,
                                           policy::PoolEviction::kLru),
                         [](const auto& info) {
                           return std::string(policy::pool_eviction_name(info.param));
                         });

}  // namespace
}  // namespace kvtier::kv
