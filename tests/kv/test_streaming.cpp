// Streaming retention (StreamingLLM: attention sinks + a recent window) on the KV store alone, with a
// toy RoPE as the model-side hook: outputs against a direct softmax over the kept keys with the sinks
// at positions within the cache; memory bounded by sinks + window + chunk; a window that covers the
// context is bit-identical to no retention; every offloaded placement gives the resident bits; a
// truncation back into dropped positions is a clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "kv/kv_compute.h"
#include "kv/resident_kv.h"
#include "kv/tiered_kv.h"
#include "policy/retention.h"

namespace kvtier::kv {
namespace {

constexpr int64_t kDk = 32, kDv = 32;
constexpr uint32_t kHead = 4;  // query heads; 2 KV heads per layer (GQA 2)
constexpr float kScale = 0.25f;

// x[h][2i], x[h][2i+1] rotated by pos * 10000^(-2i/d) (the "normal" RoPE of Llama).
void toy_rope(const float* in, int64_t heads, int64_t pos, float* out) {
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < kDk / 2; ++i) {
      const double th = static_cast<double>(pos) * std::pow(10000.0, -2.0 * static_cast<double>(i) / kDk);
      const auto c = static_cast<float>(std::cos(th)), s = static_cast<float>(std::sin(th));
      const float a = in[h * kDk + 2 * i], b = in[h * kDk + 2 * i + 1];
      out[h * kDk + 2 * i] = a * c - b * s;
      out[h * kDk + 2 * i + 1] = a * s + b * c;
    }
  }
}

class ToyCompute final : public KvCompute {
 public:
  void project_kv(uint32_t, const float*, std::span<const int64_t>, float*, float*) override {
    FAIL() << "streaming does not recompute K/V";
  }
  void rope_q(uint32_t, const float* q_pre, int64_t n, int64_t position, float* out) override {
    for (int64_t t = 0; t < n; ++t) toy_rope(q_pre + t * kHead * kDk, kHead, position, out + t * kHead * kDk);
  }
  int64_t max_rows() const override { return 1 << 20; }
};

KvGeometry geometry(cpu::KvDtype dt, int64_t block = 128) {
  KvGeometry g;
  g.n_head_kv = {2, 2};
  g.head_dim_k = kDk;
  g.head_dim_v = kDv;
  g.block_tokens = static_cast<uint32_t>(block);
  g.dtype = dt;
  return g;
}

// Everything one run wrote and got back, for the reference.
struct Trace {
  std::vector<std::vector<float>> q_pre, q, k, v;  // [layer] -> [pos][heads][d]
  std::vector<float> out;                          // every attention output, in call order
};

// Passes of the given sizes through every layer; K/V/q from a seeded generator (q and k rotated by the
// toy RoPE at their positions, q before RoPE handed along as a kNeedPreRope policy asks).
Trace run(KvCache& kv, const std::vector<int64_t>& sizes, uint32_t seed = 7) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Trace tr;
  const uint32_t L = kv.geometry().n_layer();
  tr.q_pre.resize(L), tr.q.resize(L), tr.k.resize(L), tr.v.resize(L);
  for (int64_t n : sizes) {
    const PassPositions p = kv.begin_pass({0, n});
    for (uint32_t l = 0; l < L; ++l) {
      const int64_t hk = kv.geometry().n_head_kv[l];
      std::vector<float> qp(n * kHead * kDk), q(qp.size()), kp(n * hk * kDk), k(kp.size()), v(n * hk * kDv),
          o(n * kHead * kDv, -7.0f);
      for (auto* x : {&qp, &kp, &v}) {
        for (float& e : *x) e = nd(rng);
      }
      for (int64_t t = 0; t < n; ++t) {
        toy_rope(qp.data() + t * kHead * kDk, kHead, p.position(t), q.data() + t * kHead * kDk);
        toy_rope(kp.data() + t * hk * kDk, hk, p.position(t), k.data() + t * hk * kDk);
      }
      LayerRows rows{k.data(), v.data(), nullptr, qp.data(), kp.data()};
      kv.write(l, rows);
      kv.attend(l, q.data(), kHead, {kScale, 0.0f, 0}, o.data());
      tr.q_pre[l].insert(tr.q_pre[l].end(), qp.begin(), qp.end());
      tr.q[l].insert(tr.q[l].end(), q.begin(), q.end());
      tr.k[l].insert(tr.k[l].end(), k.begin(), k.end());
      tr.v[l].insert(tr.v[l].end(), v.begin(), v.end());
      tr.out.insert(tr.out.end(), o.begin(), o.end());
    }
    kv.end_pass();
  }
  return tr;
}

// The outputs StreamingLLM defines, by a direct softmax in double over the keys of f32 rows.
std::vector<float> reference(const Trace& tr, const std::vector<int64_t>& sizes, int64_t S, int64_t W) {
  std::vector<float> out;
  const size_t L = tr.q.size();
  int64_t pos0 = 0;
  std::vector<float> qs(kHead * kDk);
  for (int64_t n : sizes) {
    for (size_t l = 0; l < L; ++l) {
      const int64_t hk = 2;
      for (int64_t t = pos0; t < pos0 + n; ++t) {
        toy_rope(tr.q_pre[l].data() + t * kHead * kDk, kHead, S + W - 1, qs.data());
        for (int64_t h = 0; h < kHead; ++h) {
          const int64_t kh = h / (kHead / hk);
          std::vector<double> s;
          std::vector<int64_t> keys;
          const bool plain = t <= S + W - 1;
          for (int64_t j = 0; j <= t; ++j) {
            const bool sink = !plain && j < S;
            if (!plain && !sink && j < t - W + 1) continue;
            const float* qv = sink ? qs.data() + h * kDk : tr.q[l].data() + (t * kHead + h) * kDk;
            const float* kv = tr.k[l].data() + (j * hk + kh) * kDk;
            double d = 0;
            for (int64_t i = 0; i < kDk; ++i) d += static_cast<double>(qv[i]) * kv[i];
            s.push_back(d * kScale);
            keys.push_back(j);
          }
          double m = -1e300, z = 0;
          for (double x : s) m = std::max(m, x);
          for (double x : s) z += std::exp(x - m);
          for (int64_t i = 0; i < kDv; ++i) {
            double acc = 0;
            for (size_t r = 0; r < keys.size(); ++r)
              acc += std::exp(s[r] - m) / z * tr.v[l][(keys[r] * hk + kh) * kDv + i];
            out.push_back(static_cast<float>(acc));
          }
        }
      }
    }
    pos0 += n;
  }
  return out;
}

KvOptions streaming_options(int64_t sinks, int64_t window, int64_t max_new) {
  KvOptions o;
  o.retention = policy::Retention::kStreaming;
  o.knobs.sinks = sinks;
  o.knobs.window = window;
  o.max_new_rows = max_new;
  return o;
}

std::vector<int64_t> sizes(int64_t prompt, int64_t chunk, int64_t decode) {
  std::vector<int64_t> s;
  for (int64_t p = 0; p < prompt; p += chunk) s.push_back(std::min(chunk, prompt - p));
  for (int64_t i = 0; i < decode; ++i) s.push_back(1);
  return s;
}

std::string disk_dir() {
  const auto d = std::filesystem::path(KVTIER_BINARY_DIR) / "test_tmp" / "kv_stream";
  std::filesystem::create_directories(d);
  return d.string();
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(Streaming, PolicyArithmetic) {
  EXPECT_EQ(policy::streaming_plain_queries(0, 100, 4, 60), 64);  // positions 0..63 lost nothing
  EXPECT_EQ(policy::streaming_plain_queries(64, 10, 4, 60), 0);
  EXPECT_EQ(policy::streaming_plain_queries(60, 10, 4, 60), 4);
  EXPECT_EQ(policy::streaming_free_blocks(63, 4, 60, 32).last, 0);  // the query at 63 sees everything
  const auto r = policy::streaming_free_blocks(300, 4, 60, 32);     // window [241, 300]
  EXPECT_EQ(r.first, 1);
  EXPECT_EQ(r.last, 7);  // blocks 1..6 (positions 32..223) wholly between sinks and window
  EXPECT_EQ(policy::streaming_sink_blocks(0, 32), 0);
  EXPECT_EQ(policy::streaming_sink_blocks(33, 32), 2);
}

TEST(Streaming, MatchesADirectSoftmaxOverSinksAndWindow) {
  ThreadPool pool(2);
  ToyCompute hook;
  for (const auto& [S, W] : std::vector<std::pair<int64_t, int64_t>>{{4, 60}, {0, 50}, {40, 150}}) {
    const auto sz = sizes(700, 96, 12);
    MemoryLedger ledger;
    ResidentKv kv(geometry(cpu::KvDtype::kF32, 32), 800, kHead, ledger, pool, cpu::best_isa(),
                  streaming_options(S, W, 96));
    EXPECT_EQ(kv.needs(), kNeedPreRope);
    kv.set_compute(&hook);
    const Trace tr = run(kv, sz);
    const auto ref = reference(tr, sz, S, W);
    ASSERT_EQ(ref.size(), tr.out.size());
    double worst = 0;
    for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(double{ref[i]} - tr.out[i]));
    EXPECT_LT(worst, 2e-5) << "sinks " << S << " window " << W;
    // Bounded: per (layer, group) the sink blocks and the window + chunk's blocks, not 800 positions.
    const int64_t per = policy::streaming_blocks(S, W, 96, 32, 25);
    EXPECT_LE(static_cast<int64_t>(kv.blocks_in_use()), 2 * per) << S << " " << W;
    EXPECT_LT(per, 25);
  }
}

TEST(Streaming, AWindowCoveringTheContextIsBitIdenticalToNoRetention) {
  ThreadPool pool(2);
  ToyCompute hook;
  const auto sz = sizes(300, 64, 20);
  MemoryLedger l0, l1;
  ResidentKv plain(geometry(cpu::KvDtype::kF16), 320, kHead, l0, pool, cpu::best_isa());
  ResidentKv stream(geometry(cpu::KvDtype::kF16), 320, kHead, l1, pool, cpu::best_isa(),
                    streaming_options(4, 316, 64));
  stream.set_compute(&hook);
  EXPECT_TRUE(same_bits(run(plain, sz).out, run(stream, sz).out));
}

TEST(Streaming, EveryOffloadedPlacementGivesTheResidentBits) {
  ThreadPool pool(2);
  ToyCompute hook;
  const auto sz = sizes(1900, 100, 10);
  MemoryLedger lr;
  ResidentKv res(geometry(cpu::KvDtype::kF16), 2000, kHead, lr, pool, cpu::best_isa(),
                 streaming_options(4, 200, 100));
  res.set_compute(&hook);
  const auto ref = run(res, sz).out;
  struct Config {
    policy::Placement p;
    uint32_t group, depth, statics;
    bool disk;
  };
  for (const Config& c :
       {Config{policy::Placement::kLayer, 0, 1, 0, false}, Config{policy::Placement::kLayer, 0, 2, 0, true},
        Config{policy::Placement::kHeadInfer, 1, 1, 0, true},
        Config{policy::Placement::kHeadInfer, 1, 2, 1, false}}) {
    KvOptions o = streaming_options(4, 200, 100);
    o.placement.placement = c.p;
    o.placement.group = c.group;
    o.placement.prefetch_depth = c.depth;
    o.placement.static_heads = c.statics;
    o.disk_dir = c.disk ? disk_dir() : "";
    MemoryLedger ledger;
    TieredKv kv(geometry(cpu::KvDtype::kF16), 2000, kHead, ledger, pool, cpu::best_isa(), o);
    kv.set_compute(&hook);
    const std::string what = std::string(policy::placement_name(c.p)) + (c.disk ? " disk" : " host") +
                             " depth " + std::to_string(c.depth) + " static " + std::to_string(c.statics);
    EXPECT_TRUE(same_bits(ref, run(kv, sz).out)) << what;
    // The home tier holds the sink block and the window's pages, not the context's.
    KvOptions full = o;
    full.retention = policy::Retention::kNone;
    MemoryLedger full_ledger;
    TieredKv unbounded(geometry(cpu::KvDtype::kF16), 2000, kHead, full_ledger, pool, cpu::best_isa(), full);
    const Tier home = c.disk ? Tier::kDisk : Tier::kHost;
    EXPECT_LT(ledger.peak(home, Category::kKv), full_ledger.peak(home, Category::kKv) / 2) << what;
    EXPECT_GT(kv.stats().transfer.bytes_loaded, 0u) << what;
  }
}

TEST(Streaming, TruncatingIntoDroppedPositionsIsAClearError) {
  ThreadPool pool(1);
  ToyCompute hook;
  MemoryLedger ledger;
  ResidentKv kv(geometry(cpu::KvDtype::kF16, 32), 400, kHead, ledger, pool, cpu::Isa::kScalar,
                streaming_options(4, 40, 64));
  kv.set_compute(&hook);
  run(kv, sizes(300, 64, 0));
  try {
    kv.truncate(0, 100);  // the query at 100 would attend 61..99, dropped
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("streaming retention already dropped"), std::string::npos)
        << e.what();
  }
  // The query at 290 would attend 251..290: 251..255 lay in a block freed when the sequence reached 300.
  EXPECT_THROW(kv.truncate(0, 290), Error);
  EXPECT_NO_THROW(kv.truncate(0, 295));  // its window 256..295 is all kept
  EXPECT_EQ(kv.positions(0), 295);
  EXPECT_NO_THROW(kv.truncate(0, 0));
}

}  // namespace
}  // namespace kvtier::kv
