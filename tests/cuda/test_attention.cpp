// CUDA attention against the CPU backend's blocked attention (backend/cpu/attention.h, scalar
// path), and the exactness properties of attention.h: schedules, query chunking and head groups
// never change a row's bits; runs are deterministic; spans merge by log-sum-exp.
// Tolerances: both sides compute exact-causal attention in f32 from the same K/V values; they differ
// in summation order (tile order is the same, but the CPU runs one online softmax while the GPU
// merges 256-key chunks) and in expf/logf vs the C library (<= 2 ulp): relative error ~1e-6 per
// output, NMSE(o) <= 1e-10 and |lse_gpu - lse_cpu| <= 1e-4. Two spans merged vs one span: one
// extra normalisation and merge, NMSE(o) <= 1e-12, |d lse| <= 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cuda/attention.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "gpu_test_util.h"

namespace kvtier::cuda {
namespace {

using test::DeviceBuffer;
using test::nmse;
using test::same_bits;

struct Case {
  int64_t n_heads = 8;
  int64_t q_per_kv = 4;
  int64_t dk = 64;
  int64_t dv = 64;
  int64_t span_pos0 = 0;
  int64_t span_len = 0;
  int64_t q_pos0 = 0;
  int64_t n_tokens = 1;
  int64_t window = 0;
  float softcap = 0.0f;
  KvDtype dtype = KvDtype::kF16;
  uint32_t seed = 1;
  int64_t n_kv() const { return n_heads / q_per_kv; }
};

// Host data of a case. K/V: [n_kv][span_len][d]; k_bits/v_bits hold the stored 16-bit values
// (f16 or bf16), k32/v32 the same values as f32 (the CPU reference of bf16 and f32 caches).
struct HostData {
  std::vector<float> q;  // [n_tokens, n_heads, dk]
  std::vector<uint16_t> k_bits, v_bits;
  std::vector<float> k32, v32;
};

HostData make_data(const Case& c) {
  std::mt19937 rng(c.seed);
  HostData d;
  d.q = test::random_floats(static_cast<size_t>(c.n_tokens * c.n_heads * c.dk), rng);
  const size_t nk = static_cast<size_t>(c.n_kv() * c.span_len * c.dk),
               nv = static_cast<size_t>(c.n_kv() * c.span_len * c.dv);
  const auto k = test::random_floats(nk, rng), v = test::random_floats(nv, rng);
  d.k_bits.resize(nk);
  d.v_bits.resize(nv);
  d.k32.resize(nk);
  d.v32.resize(nv);
  auto store = [&](const std::vector<float>& src, std::vector<uint16_t>& bits, std::vector<float>& f) {
    for (size_t i = 0; i < src.size(); ++i) {
      if (c.dtype == KvDtype::kF16) {
        bits[i] = f32_to_f16(src[i]);
        f[i] = f16_to_f32(bits[i]);
      } else if (c.dtype == KvDtype::kBF16) {
        bits[i] = f32_to_bf16(src[i]);
        f[i] = bf16_to_f32(bits[i]);
      } else {
        f[i] = src[i];
      }
    }
  };
  store(k, d.k_bits, d.k32);
  store(v, d.v_bits, d.v32);
  return d;
}

AttnParams gpu_params(const Case& c) {
  AttnParams p;
  p.head_dim_k = c.dk;
  p.head_dim_v = c.dv;
  p.q_per_kv = c.q_per_kv;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
  p.softcap = c.softcap;
  p.window = c.window;
  p.kv_dtype = c.dtype;
  return p;
}

struct Result {
  std::vector<float> o;    // [n_tokens, n_heads, dv]
  std::vector<float> lse;  // [n_tokens, n_heads]
};

Result cpu_reference(const Case& c, const HostData& d) {
  const bool f16 = c.dtype == KvDtype::kF16;
  cpu::AttnParams p;
  p.head_dim_k = c.dk;
  p.head_dim_v = c.dv;
  p.q_per_kv = c.q_per_kv;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
  p.softcap = c.softcap;
  p.window = c.window;
  p.kv_dtype = f16 ? cpu::KvDtype::kF16 : cpu::KvDtype::kF32;
  cpu::KvSpan span;
  span.pos0 = c.span_pos0;
  span.n_tokens = c.span_len;
  span.k = f16 ? static_cast<const void*>(d.k_bits.data()) : d.k32.data();
  span.v = f16 ? static_cast<const void*>(d.v_bits.data()) : d.v32.data();
  span.k_head_stride = c.span_len * c.dk;
  span.v_head_stride = c.span_len * c.dv;
  cpu::AttnQueries q{d.q.data(), c.n_heads * c.dk, c.n_tokens, c.n_heads, c.q_pos0};
  Result r;
  r.o.resize(static_cast<size_t>(c.n_tokens * c.n_heads * c.dv));
  r.lse.resize(static_cast<size_t>(c.n_tokens * c.n_heads));
  cpu::AttnOutput out{r.o.data(), c.n_heads * c.dv, r.lse.data(), c.n_heads};
  ThreadPool pool(1);
  std::vector<uint8_t> scratch(cpu::attention_scratch_bytes(p, pool.size()));
  cpu::attend(pool, cpu::Isa::kScalar, p, q, std::span<const cpu::KvSpan>(&span, 1), out, scratch);
  return r;
}

// A case's data on the device, attended in any subset.
class GpuCase {
 public:
  GpuCase(const Case& c, const HostData& d)
      : c_(c),
        q_(d.q),
        k_(c.dtype == KvDtype::kF32 ? as_bytes(d.k32) : as_bytes(d.k_bits)),
        v_(c.dtype == KvDtype::kF32 ? as_bytes(d.v32) : as_bytes(d.v_bits)) {}

  // Queries [t_first, t_first + n_tok) of KV heads [kv_first, kv_first + n_kv) over cache rows
  // [row_first, row_first + n_rows) (positions span_pos0 + row).
  Result run(AttnSchedule schedule, int64_t t_first, int64_t n_tok, int64_t kv_first, int64_t n_kv,
             int64_t row_first, int64_t n_rows) const {
    const int64_t G = c_.q_per_kv, heads = n_kv * G;
    const size_t eb = kv_dtype_bytes(c_.dtype);
    KvSpan span;
    span.pos0 = c_.span_pos0 + row_first;
    span.n_tokens = n_rows;
    span.k_head_stride = c_.span_len * c_.dk;
    span.v_head_stride = c_.span_len * c_.dv;
    span.k = k_.get() + (static_cast<size_t>(kv_first * span.k_head_stride + row_first * c_.dk)) * eb;
    span.v = v_.get() + (static_cast<size_t>(kv_first * span.v_head_stride + row_first * c_.dv)) * eb;
    AttnQueries q{q_.get() + (t_first * c_.n_heads + kv_first * G) * c_.dk, c_.n_heads * c_.dk, n_tok, heads,
                  c_.q_pos0 + t_first};
    DeviceBuffer<float> o(static_cast<size_t>(n_tok * heads * c_.dv)),
        lse(static_cast<size_t>(n_tok * heads));
    o.fill_bytes(0xff);  // NaN: every output must be written
    AttnOutput out{o.get(), heads * c_.dv, lse.get(), heads};
    const AttnParams p = gpu_params(c_);
    const size_t scratch_bytes = attention_split_scratch_bytes(p, q, span);
    DeviceBuffer<uint8_t> scratch(scratch_bytes);
    attend(p, q, span, out, scratch.get(), scratch_bytes, nullptr, schedule);
    return {o.download(), lse.download()};
  }

  Result run_all(AttnSchedule schedule) const {
    return run(schedule, 0, c_.n_tokens, 0, c_.n_kv(), 0, c_.span_len);
  }

 private:
  template <typename T>
  static std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
    std::vector<uint8_t> b(v.size() * sizeof(T));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  }

  Case c_;
  DeviceBuffer<float> q_;
  DeviceBuffer<uint8_t> k_, v_;
};

void expect_close_to_cpu(const Case& c, const Result& got, const Result& ref, const char* what) {
  EXPECT_LE(nmse(got.o, ref.o), 1e-10) << what;
  ASSERT_EQ(got.lse.size(), ref.lse.size());
  for (size_t i = 0; i < ref.lse.size(); ++i) {
    if (std::isinf(ref.lse[i])) {
      EXPECT_TRUE(std::isinf(got.lse[i]) && got.lse[i] < 0) << what << " lse " << i;
    } else {
      EXPECT_NEAR(got.lse[i], ref.lse[i], 1e-4) << what << " lse " << i;
    }
  }
  (void)c;
}

std::vector<Case> cpu_cases() {
  std::vector<Case> cs;
  Case a;  // prefill from position 0, GQA 4, SmolLM2-like head dim
  a.span_len = 37;
  a.n_tokens = 37;
  cs.push_back(a);
  Case b;  // a chunk after a past, crossing chunk boundaries (256, 512)
  b.n_heads = 6;
  b.q_per_kv = 2;
  b.dk = b.dv = 128;
  b.span_len = 600;
  b.q_pos0 = 230;
  b.n_tokens = 370;
  b.seed = 2;
  cs.push_back(b);
  Case g;  // Gemma-3-like: one KV head, head dim 256, sliding window and soft-cap
  g.n_heads = 4;
  g.q_per_kv = 4;
  g.dk = g.dv = 256;
  g.span_len = 700;
  g.q_pos0 = 500;
  g.n_tokens = 200;
  g.window = 128;
  g.softcap = 50.0f;
  g.seed = 3;
  cs.push_back(g);
  Case m;  // MHA, decode at a long-ish position, bf16 cache
  m.n_heads = 4;
  m.q_per_kv = 1;
  m.dk = m.dv = 96;
  m.span_len = 3000;
  m.q_pos0 = 2999;
  m.n_tokens = 1;
  m.dtype = KvDtype::kBF16;
  m.seed = 4;
  cs.push_back(m);
  Case w;  // wide GQA (16 query heads per KV head), f32 cache, span not starting at 0
  w.n_heads = 32;
  w.q_per_kv = 16;
  w.span_pos0 = 100;
  w.span_len = 400;
  w.q_pos0 = 480;
  w.n_tokens = 20;
  w.dtype = KvDtype::kF32;
  w.seed = 5;
  cs.push_back(w);
  Case v;  // different K and V head dims
  v.n_heads = 4;
  v.q_per_kv = 2;
  v.dk = 192;
  v.dv = 128;
  v.span_len = 300;
  v.q_pos0 = 290;
  v.n_tokens = 10;
  v.seed = 6;
  cs.push_back(v);
  return cs;
}

TEST(CudaAttention, MatchesCpuReference) {
  KVTIER_REQUIRE_GPU();
  int i = 0;
  for (const Case& c : cpu_cases()) {
    const HostData d = make_data(c);
    const Result ref = cpu_reference(c, d);
    const GpuCase g(c, d);
    const std::string name = "case " + std::to_string(i++);
    expect_close_to_cpu(c, g.run_all(AttnSchedule::kSingle), ref, (name + " single").c_str());
    expect_close_to_cpu(c, g.run_all(AttnSchedule::kSplit), ref, (name + " split").c_str());
  }
}

TEST(CudaAttention, SchedulesGiveTheSameBitsAndRunsAreDeterministic) {
  KVTIER_REQUIRE_GPU();
  for (const Case& c : cpu_cases()) {
    const HostData d = make_data(c);
    const GpuCase g(c, d);
    const Result single = g.run_all(AttnSchedule::kSingle);
    const Result split = g.run_all(AttnSchedule::kSplit);
    const Result autos = g.run_all(AttnSchedule::kAuto);
    EXPECT_TRUE(same_bits(single.o, split.o) && same_bits(single.lse, split.lse)) << "seed " << c.seed;
    EXPECT_TRUE(same_bits(single.o, autos.o) && same_bits(single.lse, autos.lse)) << "seed " << c.seed;
    const Result again = g.run_all(AttnSchedule::kSingle);
    EXPECT_TRUE(same_bits(single.o, again.o) && same_bits(single.lse, again.lse)) << "seed " << c.seed;
  }
}

// A query's row is the same whether it comes in a prefill chunk of any size or alone (decode) and
// whichever KV heads share the call (HeadInfer's head groups).
TEST(CudaAttention, QueryChunksAndHeadGroupsDoNotChangeBits) {
  KVTIER_REQUIRE_GPU();
  Case c;
  c.n_heads = 8;
  c.q_per_kv = 2;
  c.span_len = 600;
  c.n_tokens = 600;
  c.seed = 7;
  const HostData d = make_data(c);
  const GpuCase g(c, d);
  const Result full = g.run_all(AttnSchedule::kSingle);
  const int64_t dv = c.dv;
  auto check_rows = [&](const Result& part, int64_t t_first, int64_t n_tok, int64_t kv_first, int64_t n_kv,
                        const char* what) {
    const int64_t heads = n_kv * c.q_per_kv;
    for (int64_t t = 0; t < n_tok; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t fh = kv_first * c.q_per_kv + h, ft = t_first + t;
        for (int64_t i = 0; i < dv; ++i) {
          ASSERT_EQ(part.o[static_cast<size_t>((t * heads + h) * dv + i)],
                    full.o[static_cast<size_t>((ft * c.n_heads + fh) * dv + i)])
              << what << " token " << ft << " head " << fh << " dim " << i;
        }
        ASSERT_EQ(part.lse[static_cast<size_t>(t * heads + h)],
                  full.lse[static_cast<size_t>(ft * c.n_heads + fh)])
            << what;
      }
    }
  };
  // Decode-style: one token over the keys up to its position (split schedule).
  for (int64_t t : {0, 31, 32, 255, 256, 257, 599}) {
    check_rows(g.run(AttnSchedule::kAuto, t, 1, 0, c.n_kv(), 0, t + 1), t, 1, 0, c.n_kv(), "decode");
  }
  // A later prefill chunk over the keys up to its end.
  check_rows(g.run(AttnSchedule::kSingle, 300, 77, 0, c.n_kv(), 0, 377), 300, 77, 0, c.n_kv(), "chunk");
  // Head groups of 1 and 2 KV heads.
  check_rows(g.run(AttnSchedule::kSingle, 0, 600, 1, 1, 0, 600), 0, 600, 1, 1, "group of 1");
  check_rows(g.run(AttnSchedule::kSplit, 590, 10, 2, 2, 0, 600), 590, 10, 2, 2, "group of 2");
}

TEST(CudaAttention, TwoSpansMergedMatchOneSpan) {
  KVTIER_REQUIRE_GPU();
  Case c;
  c.n_heads = 8;
  c.q_per_kv = 4;
  c.dk = c.dv = 128;
  c.span_len = 1500;
  c.q_pos0 = 1499;
  c.n_tokens = 1;
  c.seed = 8;
  const HostData d = make_data(c);
  const GpuCase g(c, d);
  const Result one = g.run_all(AttnSchedule::kAuto);
  for (int64_t cut : {700, 768, 1}) {
    Result a = g.run(AttnSchedule::kAuto, 0, 1, 0, c.n_kv(), 0, cut);
    const Result b = g.run(AttnSchedule::kAuto, 0, 1, 0, c.n_kv(), cut, c.span_len - cut);
    DeviceBuffer<float> oa(a.o), la(a.lse), ob(b.o), lb(b.lse);
    merge_attention(oa.get(), la.get(), ob.get(), lb.get(), c.n_heads, c.dv, nullptr);
    const Result merged{oa.download(), la.download()};
    EXPECT_LE(nmse(merged.o, one.o), 1e-12) << "cut " << cut;
    for (size_t i = 0; i < one.lse.size(); ++i) EXPECT_NEAR(merged.lse[i], one.lse[i], 1e-5) << "cut " << cut;
    // The GPU merge agrees with the CPU merge of the same partials.
    cpu::merge_attention(a.o.data(), a.lse.data(), b.o.data(), b.lse.data(), c.n_heads, c.dv);
    EXPECT_LE(nmse(merged.o, a.o), 1e-12) << "cut " << cut;
  }
}

TEST(CudaAttention, QueriesThatSeeNoKeyGiveZeroAndMinusInfinity) {
  KVTIER_REQUIRE_GPU();
  Case c;
  c.span_len = 10;
  c.q_pos0 = 100;
  c.n_tokens = 2;
  c.window = 50;
  const HostData d = make_data(c);
  const GpuCase g(c, d);
  for (AttnSchedule s : {AttnSchedule::kSingle, AttnSchedule::kSplit}) {
    const Result r = g.run_all(s);
    for (float x : r.o) EXPECT_EQ(x, 0.0f);
    for (float x : r.lse) EXPECT_TRUE(std::isinf(x) && x < 0);
  }
}

// Host-side properties: run without a GPU.
TEST(CudaAttention, SplitCountDependsOnKeyPositionsOnly) {
  auto chunks = [](int64_t pos0, int64_t n) {
    KvSpan s;
    s.pos0 = pos0;
    s.n_tokens = n;
    return attention_chunks(s);
  };
  EXPECT_EQ(chunks(0, 0), 0);
  EXPECT_EQ(chunks(0, 1), 1);
  EXPECT_EQ(chunks(0, kAttnChunk), 1);
  EXPECT_EQ(chunks(0, kAttnChunk + 1), 2);
  EXPECT_EQ(chunks(kAttnChunk - 6, 12), 2);
  EXPECT_EQ(chunks(0, 131072), 131072 / kAttnChunk);
}

TEST(CudaAttention, SplitWithoutEnoughScratchIsAnError) {
  Case c;
  c.span_len = 1000;
  const AttnParams p = gpu_params(c);
  KvSpan span;
  span.n_tokens = 1000;
  AttnQueries q{nullptr, c.n_heads * c.dk, 1, c.n_heads, 999};
  EXPECT_EQ(attention_split_scratch_bytes(p, q, span), size_t{4} * 1 * 8 * (64 + 2) * 4);
  EXPECT_THROW(attend(p, q, span, AttnOutput{}, nullptr, 0, nullptr, AttnSchedule::kSplit), Error);
  AttnParams bad = p;
  bad.head_dim_k = 512;
  EXPECT_THROW(attend(bad, q, span, AttnOutput{}, nullptr, 0, nullptr), Error);
}

}  // namespace
}  // namespace kvtier::cuda
