// Blocked attention against a naive double-precision softmax, and its exactness contract: results
// independent of head grouping, threads, query batching and where the span bytes live.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/attention.h"
#include "core/half.h"

namespace kvtier::cpu {
namespace {

struct Problem {
  int64_t n_kv = 2, G = 3, dk = 24, dv = 16, n_ctx, n_q = 37;
  KvDtype dtype = KvDtype::kF32;
  std::vector<float> q;  // [n_q, n_kv * G, dk]
  std::vector<float> k;  // [n_kv][n_ctx, dk]
  std::vector<float> v;  // [n_kv][n_ctx, dv]
  std::vector<uint16_t> k16, v16;

  explicit Problem(uint64_t seed, KvDtype dt = KvDtype::kF32, int64_t ctx = 150, int64_t kv_heads = 2,
                   int64_t group = 3)
      : n_kv(kv_heads), G(group), n_ctx(ctx), dtype(dt) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    q.resize(static_cast<size_t>(n_q * n_kv * G * dk));
    k.resize(static_cast<size_t>(n_kv * n_ctx * dk));
    v.resize(static_cast<size_t>(n_kv * n_ctx * dv));
    for (auto& x : q) x = nd(rng);
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    if (dt == KvDtype::kF16) {
      for (auto& x : k) x = f16_to_f32(f32_to_f16(x));
      for (auto& x : v) x = f16_to_f32(f32_to_f16(x));
      for (float x : k) k16.push_back(f32_to_f16(x));
      for (float x : v) v16.push_back(f32_to_f16(x));
    }
  }
  const void* kp() const { return dtype == KvDtype::kF32 ? static_cast<const void*>(k.data()) : k16.data(); }
  const void* vp() const { return dtype == KvDtype::kF32 ? static_cast<const void*>(v.data()) : v16.data(); }
  size_t esz() const { return kv_dtype_bytes(dtype); }

  // Spans cutting [0, n_ctx) at the given boundaries (all views of the same arrays).
  std::vector<KvSpan> spans(const std::vector<int64_t>& cuts) const {
    std::vector<KvSpan> out;
    int64_t a = 0;
    auto add = [&](int64_t b) {
      if (b <= a) return;
      KvSpan s;
      s.pos0 = a;
      s.n_tokens = b - a;
      s.k = static_cast<const uint8_t*>(kp()) + static_cast<size_t>(a * dk) * esz();
      s.v = static_cast<const uint8_t*>(vp()) + static_cast<size_t>(a * dv) * esz();
      s.k_head_stride = n_ctx * dk;
      s.v_head_stride = n_ctx * dv;
      out.push_back(s);
      a = b;
    };
    for (int64_t c : cuts) add(c);
    add(n_ctx);
    return out;
  }
};

AttnParams params(const Problem& p, int64_t window = 0, float softcap = 0.0f) {
  AttnParams a;
  a.head_dim_k = p.dk;
  a.head_dim_v = p.dv;
  a.q_per_kv = p.G;
  a.scale = 1.0f / std::sqrt(static_cast<float>(p.dk));
  a.window = window;
  a.softcap = softcap;
  a.kv_dtype = p.dtype;
  return a;
}

struct Result {
  std::vector<float> o, lse;
};

// Queries [t0, t1) of heads [h0, h1) at positions pos0 + t.
Result run(const Problem& p, const AttnParams& a, const std::vector<KvSpan>& spans, int threads, Isa isa,
           int64_t pos0, int64_t h0 = 0, int64_t h1 = -1, int64_t t0 = 0, int64_t t1 = -1,
           Result* into = nullptr) {
  const int64_t H = p.n_kv * p.G;
  if (h1 < 0) h1 = H;
  if (t1 < 0) t1 = p.n_q;
  Result local;
  Result& r = into ? *into : local;
  if (r.o.empty()) {
    r.o.assign(static_cast<size_t>(p.n_q * H * p.dv), 0.0f);
    r.lse.assign(static_cast<size_t>(p.n_q * H), 0.0f);
  }
  ThreadPool pool(threads);
  std::vector<uint8_t> scratch(attention_scratch_bytes(a, threads));
  // Spans seen from KV head h0 / G on.
  std::vector<KvSpan> sp = spans;
  const int64_t kv0 = h0 / p.G;
  for (auto& s : sp) {
    s.k = static_cast<const uint8_t*>(s.k) + static_cast<size_t>(kv0 * s.k_head_stride) * p.esz();
    s.v = static_cast<const uint8_t*>(s.v) + static_cast<size_t>(kv0 * s.v_head_stride) * p.esz();
  }
  AttnQueries q{p.q.data() + t0 * H * p.dk + h0 * p.dk, H * p.dk, t1 - t0, h1 - h0, pos0 + t0};
  AttnOutput out{r.o.data() + t0 * H * p.dv + h0 * p.dv, H * p.dv, r.lse.data() + t0 * H + h0, H};
  attend(pool, isa, a, q, sp, out, scratch);
  return r;
}

Result naive(const Problem& p, const AttnParams& a, int64_t pos0) {
  const int64_t H = p.n_kv * p.G;
  Result r;
  r.o.assign(static_cast<size_t>(p.n_q * H * p.dv), 0.0f);
  r.lse.assign(static_cast<size_t>(p.n_q * H), -std::numeric_limits<float>::infinity());
  for (int64_t t = 0; t < p.n_q; ++t) {
    const int64_t qp = pos0 + t;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t j = h / p.G;
      std::vector<double> s;
      std::vector<int64_t> pos;
      for (int64_t kp = 0; kp < p.n_ctx && kp <= qp; ++kp) {
        if (a.window > 0 && qp - kp >= a.window) continue;
        double d = 0;
        for (int64_t i = 0; i < p.dk; ++i)
          d += static_cast<double>(p.q[static_cast<size_t>((t * H + h) * p.dk + i)]) *
               p.k[static_cast<size_t>((j * p.n_ctx + kp) * p.dk + i)];
        d *= a.scale;
        if (a.softcap > 0) d = a.softcap * std::tanh(d / a.softcap);
        s.push_back(d);
        pos.push_back(kp);
      }
      if (s.empty()) continue;
      double m = -1e300;
      for (double x : s) m = std::max(m, x);
      double z = 0;
      for (double& x : s) z += (x = std::exp(x - m));
      for (int64_t i = 0; i < p.dv; ++i) {
        double acc = 0;
        for (size_t n = 0; n < s.size(); ++n)
          acc += s[n] * p.v[static_cast<size_t>((j * p.n_ctx + pos[n]) * p.dv + i)];
        r.o[static_cast<size_t>((t * H + h) * p.dv + i)] = static_cast<float>(acc / z);
      }
      r.lse[static_cast<size_t>(t * H + h)] = static_cast<float>(m + std::log(z));
    }
  }
  return r;
}

void expect_near(const Result& a, const Result& b, float tol) {
  ASSERT_EQ(a.o.size(), b.o.size());
  for (size_t i = 0; i < a.o.size(); ++i) ASSERT_NEAR(a.o[i], b.o[i], tol) << "o[" << i << "]";
  for (size_t i = 0; i < a.lse.size(); ++i) {
    if (std::isinf(b.lse[i])) {
      ASSERT_TRUE(std::isinf(a.lse[i])) << i;
    } else {
      ASSERT_NEAR(a.lse[i], b.lse[i], tol) << "lse[" << i << "]";
    }
  }
}

void expect_identical(const Result& a, const Result& b) {
  ASSERT_EQ(a.o, b.o);
  ASSERT_EQ(a.lse, b.lse);
}

std::vector<Isa> isas() {
  std::vector<Isa> v{Isa::kScalar};
  if (isa_supported(Isa::kAvx2)) v.push_back(Isa::kAvx2);
  return v;
}

TEST(Attention, MatchesNaiveSoftmax) {
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kF16}) {
    const Problem p(1, dt);
    for (Isa isa : isas()) {
      for (int64_t window : {0, 20}) {
        for (float cap : {0.0f, 5.0f}) {
          const AttnParams a = params(p, window, cap);
          const int64_t pos0 = p.n_ctx - p.n_q;  // the queries are the last n_q keys
          expect_near(run(p, a, p.spans({64, 128}), 2, isa, pos0), naive(p, a, pos0), 2e-5f);
        }
      }
    }
  }
}

TEST(Attention, QueriesBeforeAnyVisibleKeyGiveZeroAndMinusInfinity) {
  const Problem p(2);
  AttnParams a = params(p);
  // Keys start at 150 (span moved), queries at 0..36: nothing visible.
  auto sp = p.spans({});
  sp[0].pos0 = 1000;
  const Result r = run(p, a, sp, 1, Isa::kScalar, 0);
  for (float x : r.o) ASSERT_EQ(x, 0.0f);
  for (float x : r.lse) ASSERT_TRUE(std::isinf(x) && x < 0);
}

TEST(Attention, ExactAcrossHeadGroupsThreadsQueryBatchesAndSpanCuts) {
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kF16}) {
    const Problem p(3, dt);
    for (Isa isa : isas()) {
      for (int64_t window : {0, 45}) {
        const AttnParams a = params(p, window);
        const int64_t pos0 = p.n_ctx - p.n_q;
        const Result base = run(p, a, p.spans({64, 128}), 1, isa, pos0);
        // Other thread counts.
        expect_identical(run(p, a, p.spans({64, 128}), 3, isa, pos0), base);
        // One KV head (G query heads) per call, as a head-wise policy would hand them.
        Result per_head;
        for (int64_t j = 0; j < p.n_kv; ++j)
          run(p, a, p.spans({64, 128}), 2, isa, pos0, j * p.G, (j + 1) * p.G, 0, -1, &per_head);
        expect_identical(per_head, base);
        // Queries one by one (decode) and in odd batches (chunked prefill).
        Result one;
        for (int64_t t = 0; t < p.n_q; ++t)
          run(p, a, p.spans({64, 128}), 2, isa, pos0, 0, -1, t, t + 1, &one);
        expect_identical(one, base);
        Result odd;
        for (int64_t t = 0; t < p.n_q; t += 7)
          run(p, a, p.spans({64, 128}), 1, isa, pos0, 0, -1, t, std::min(p.n_q, t + 7), &odd);
        expect_identical(odd, base);
        // Coalesced spans with tile-aligned cuts: same tiles, same bits.
        expect_identical(run(p, a, p.spans({}), 2, isa, pos0), base);
        expect_identical(run(p, a, p.spans({32, 64, 96, 128}), 2, isa, pos0), base);
      }
    }
  }
}

// A context of several key chunks (kAttnChunk): decode-sized calls take the chunk-parallel path,
// larger ones compute the chunks one after another; both must give the same bits, and the naive
// softmax's values.
TEST(Attention, LongContextChunksExactAndCorrect) {
  const int64_t ctx = 3 * kAttnChunk + 77;
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kF16}) {
    const Problem p(5, dt, ctx);
    const std::vector<int64_t> blocks = {64, 128, 192, 256, 320, 384, 448, 512, 576, 640, 704, 768, 832};
    for (Isa isa : isas()) {
      for (int64_t window : {int64_t{0}, int64_t{300}}) {
        for (float cap : {0.0f, 5.0f}) {
          const AttnParams a = params(p, window, cap);
          const int64_t pos0 = p.n_ctx - p.n_q;
          const Result base = run(p, a, p.spans(blocks), 1, isa, pos0);
          expect_near(base, naive(p, a, pos0), 2e-5f);
          for (int threads : {2, 3}) {
            SCOPED_TRACE(testing::Message()
                         << "threads " << threads << " window " << window << " cap " << cap);
            expect_identical(run(p, a, p.spans(blocks), threads, isa, pos0), base);
            Result one;  // decode: one query per call, chunks over the threads
            for (int64_t t = 0; t < p.n_q; ++t)
              run(p, a, p.spans(blocks), threads, isa, pos0, 0, -1, t, t + 1, &one);
            expect_identical(one, base);
            Result per_head_one;  // a head-wise policy's decode: one KV head per call
            for (int64_t t = 0; t < p.n_q; ++t) {
              for (int64_t j = 0; j < p.n_kv; ++j)
                run(p, a, p.spans({}), threads, isa, pos0, j * p.G, (j + 1) * p.G, t, t + 1, &per_head_one);
            }
            expect_identical(per_head_one, base);
            Result threes;  // small batches (at most the parallel path's token count)
            for (int64_t t = 0; t < p.n_q; t += 3)
              run(p, a, p.spans({96, 288, 544}), threads, isa, pos0, 0, -1, t, std::min(p.n_q, t + 3),
                  &threes);
            expect_identical(threes, base);
            Result sevens;  // chunked prefill: chunks one after another on a thread
            for (int64_t t = 0; t < p.n_q; t += 7)
              run(p, a, p.spans({}), threads, isa, pos0, 0, -1, t, std::min(p.n_q, t + 7), &sevens);
            expect_identical(sevens, base);
          }
        }
      }
    }
  }
}

// Fewer KV heads than threads (Gemma-3 has one KV head for 4 query heads): decode gives each thread
// an equal share of a group's query heads where the threads divide them. Every geometry and thread
// count must give the one-thread bits, and the naive softmax's values. (A pool of more threads than
// CPUs sleeps, and then runs calls this small on one thread: 3 and 4 threads take the split only on
// machines with that many CPUs; 2 threads take it on every machine of this project.)
TEST(Attention, DecodeSplitsAGroupBetweenThreadsWithTheSameBits) {
  const int64_t ctx = 2 * kAttnChunk + 45;
  struct Geometry {
    int64_t n_kv, G;
  };
  for (const Geometry g : {Geometry{1, 4}, Geometry{2, 2}, Geometry{1, 6}}) {
    for (KvDtype dt : {KvDtype::kF32, KvDtype::kF16}) {
      const Problem p(7, dt, ctx, g.n_kv, g.G);
      for (Isa isa : isas()) {
        for (int64_t window : {int64_t{0}, int64_t{200}}) {
          const AttnParams a = params(p, window, 5.0f);
          const int64_t pos0 = p.n_ctx - p.n_q;
          const Result base = run(p, a, p.spans({64, 300}), 1, isa, pos0);
          expect_near(base, naive(p, a, pos0), 2e-5f);
          for (int threads : {2, 3, 4}) {
            SCOPED_TRACE(testing::Message() << "KV heads " << g.n_kv << " group " << g.G << " threads "
                                            << threads << " window " << window);
            Result one;  // decode: one query per call
            for (int64_t t = 0; t < p.n_q; ++t)
              run(p, a, p.spans({64, 300}), threads, isa, pos0, 0, -1, t, t + 1, &one);
            expect_identical(one, base);
            Result pairs;  // two queries per call
            for (int64_t t = 0; t < p.n_q; t += 2)
              run(p, a, p.spans({64, 300}), threads, isa, pos0, 0, -1, t, std::min(p.n_q, t + 2), &pairs);
            expect_identical(pairs, base);
          }
        }
      }
    }
  }
}

TEST(Attention, SpansOutOfOrderAreRefused) {
  const Problem p(6);
  const AttnParams a = params(p);
  auto sp = p.spans({64});
  std::swap(sp[0], sp[1]);
  EXPECT_DEATH(run(p, a, sp, 1, Isa::kScalar, p.n_ctx - p.n_q), "out of order");
}

TEST(Attention, MergeOfDisjointPartsEqualsTheWhole) {
  const Problem p(4);
  const AttnParams a = params(p, 0, 0.0f);
  const int64_t pos0 = p.n_ctx - p.n_q;
  const auto all = p.spans({64});
  const Result whole = run(p, a, all, 2, Isa::kScalar, pos0);
  Result first = run(p, a, {all[0]}, 2, Isa::kScalar, pos0);
  const Result second = run(p, a, {all[1]}, 2, Isa::kScalar, pos0);
  const int64_t rows = p.n_q * p.n_kv * p.G;
  merge_attention(first.o.data(), first.lse.data(), second.o.data(), second.lse.data(), rows, p.dv);
  expect_near(first, whole, 1e-5f);
}

}  // namespace
}  // namespace kvtier::cpu
