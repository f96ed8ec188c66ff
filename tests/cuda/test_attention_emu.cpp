// The CUDA attention kernels' device code run on the CPU under a host emulation of the CUDA
// built-ins (cuda_emu.h), against the CPU backend's attention: checks their indexing, masking,
// chunk/tile walk and merges where no GPU is present. It does not check the GPU's arithmetic
// (expf, FMA units), scheduling or memory races: test_attention.cpp does that on a GPU.
// Tolerance: as test_attention.cpp, NMSE(o) <= 1e-10, |d lse| <= 1e-4 (f32 sums in another order).
#define KVTIER_CUDA_EMULATION 1

#include "backend/cuda/attention.h"
// clang-format off
#include "cuda_emu.h"
#include "backend/cuda/attention_kernels.cuh"
// clang-format on

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <span>
#include <vector>

#include "backend/cpu/attention.h"
#include "core/half.h"
#include "core/thread_pool.h"

namespace kvtier::cuda {
namespace {

namespace attn = ::kvtier::cuda::attn_emu;

struct Case {
  int64_t n_heads = 8, q_per_kv = 4, dk = 64, dv = 64;
  int64_t span_pos0 = 0, span_len = 0, q_pos0 = 0, n_tokens = 1;
  int64_t window = 0;
  float softcap = 0.0f;
  KvDtype dtype = KvDtype::kF16;
  uint32_t seed = 1;
  int64_t n_kv() const { return n_heads / q_per_kv; }
};

struct Data {
  std::vector<float> q;          // [n_tokens, n_heads, dk]
  std::vector<uint16_t> kb, vb;  // [n_kv][span_len][d] f16 or bf16 bits
  std::vector<float> k32, v32;   // the same values as f32
};

Data make_data(const Case& c) {
  std::mt19937 rng(c.seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Data d;
  d.q.resize(static_cast<size_t>(c.n_tokens * c.n_heads * c.dk));
  for (float& x : d.q) x = nd(rng);
  auto fill = [&](size_t n, std::vector<uint16_t>& bits, std::vector<float>& f) {
    bits.resize(n);
    f.resize(n);
    for (size_t i = 0; i < n; ++i) {
      const float x = nd(rng);
      if (c.dtype == KvDtype::kF16) {
        bits[i] = f32_to_f16(x);
        f[i] = f16_to_f32(bits[i]);
      } else if (c.dtype == KvDtype::kBF16) {
        bits[i] = f32_to_bf16(x);
        f[i] = bf16_to_f32(bits[i]);
      } else {
        f[i] = x;
      }
    }
  };
  fill(static_cast<size_t>(c.n_kv() * c.span_len * c.dk), d.kb, d.k32);
  fill(static_cast<size_t>(c.n_kv() * c.span_len * c.dv), d.vb, d.v32);
  return d;
}

struct Result {
  std::vector<float> o, lse;
};

Result cpu_attend(const Case& c, const Data& d) {
  cpu::AttnParams p;
  p.head_dim_k = c.dk;
  p.head_dim_v = c.dv;
  p.q_per_kv = c.q_per_kv;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
  p.softcap = c.softcap;
  p.window = c.window;
  p.kv_dtype = c.dtype == KvDtype::kF16 ? cpu::KvDtype::kF16 : cpu::KvDtype::kF32;
  cpu::KvSpan s;
  s.pos0 = c.span_pos0;
  s.n_tokens = c.span_len;
  s.k = c.dtype == KvDtype::kF16 ? static_cast<const void*>(d.kb.data()) : d.k32.data();
  s.v = c.dtype == KvDtype::kF16 ? static_cast<const void*>(d.vb.data()) : d.v32.data();
  s.k_head_stride = c.span_len * c.dk;
  s.v_head_stride = c.span_len * c.dv;
  Result r;
  r.o.resize(static_cast<size_t>(c.n_tokens * c.n_heads * c.dv));
  r.lse.resize(static_cast<size_t>(c.n_tokens * c.n_heads));
  ThreadPool pool(1);
  std::vector<uint8_t> scratch(cpu::attention_scratch_bytes(p, 1));
  cpu::attend(pool, cpu::Isa::kScalar, p, {d.q.data(), c.n_heads * c.dk, c.n_tokens, c.n_heads, c.q_pos0},
              std::span<const cpu::KvSpan>(&s, 1), {r.o.data(), c.n_heads * c.dv, r.lse.data(), c.n_heads},
              scratch);
  return r;
}

// attend() of attention.cu with the launches emulated: queries [t_first, +n_tok) of KV heads
// [kv_first, +n_kv) over cache rows [row_first, +n_rows).
Result emu_attend(const Case& c, const Data& d, bool split, int64_t t_first, int64_t n_tok, int64_t kv_first,
                  int64_t n_kv, int64_t row_first, int64_t n_rows) {
  const int64_t G = c.q_per_kv, heads = n_kv * G;
  AttnParams p;
  p.head_dim_k = c.dk;
  p.head_dim_v = c.dv;
  p.q_per_kv = G;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.dk));
  p.softcap = c.softcap;
  p.window = c.window;
  p.kv_dtype = c.dtype;
  const bool f32 = c.dtype == KvDtype::kF32;
  KvSpan span;
  span.pos0 = c.span_pos0 + row_first;
  span.n_tokens = n_rows;
  span.k_head_stride = c.span_len * c.dk;
  span.v_head_stride = c.span_len * c.dv;
  const int64_t koff = kv_first * span.k_head_stride + row_first * c.dk;
  const int64_t voff = kv_first * span.v_head_stride + row_first * c.dv;
  span.k = f32 ? static_cast<const void*>(d.k32.data() + koff) : d.kb.data() + koff;
  span.v = f32 ? static_cast<const void*>(d.v32.data() + voff) : d.vb.data() + voff;
  const AttnQueries q{d.q.data() + (t_first * c.n_heads + kv_first * G) * c.dk, c.n_heads * c.dk, n_tok,
                      heads, c.q_pos0 + t_first};
  Result r;
  r.o.assign(static_cast<size_t>(n_tok * heads * c.dv), std::numeric_limits<float>::quiet_NaN());
  r.lse.assign(static_cast<size_t>(n_tok * heads), std::numeric_limits<float>::quiet_NaN());
  const AttnOutput out{r.o.data(), heads * c.dv, r.lse.data(), heads};

  const attn::Launch l = attn::plan(p, q);
  const int64_t n_chunks = attention_chunks(span);
  if (n_chunks == 0) split = false;
  std::vector<float> scratch(attention_split_scratch_bytes(p, q, span) / sizeof(float));
  attn::Partials part{scratch.data(), scratch.data() + n_chunks * n_tok * heads * c.dv};
  const int64_t chunk0 = n_rows > 0 ? span.pos0 / kAttnChunk : 0;
  const emu::Dim3 grid{static_cast<unsigned>(l.n_qtiles), static_cast<unsigned>(n_kv),
                       split ? static_cast<unsigned>(n_chunks) : 1u};
  const emu::Dim3 block{static_cast<unsigned>(l.threads), 1, 1};
  auto run = [&](auto tag) {
    using T = decltype(tag);
    if (split) {
      emu::launch(grid, block, l.smem_bytes, [&] {
        attn::attn_kernel<T, true>(p, q, span, out, part, l.tokens_per_block, chunk0, n_chunks);
      });
    } else {
      emu::launch(grid, block, l.smem_bytes, [&] {
        attn::attn_kernel<T, false>(p, q, span, out, part, l.tokens_per_block, chunk0, n_chunks);
      });
    }
  };
  if (c.dtype == KvDtype::kF32) {
    run(float{});
  } else if (c.dtype == KvDtype::kF16) {
    run(emu::Half{});
  } else {
    run(emu::Bf16{});
  }
  if (split) {
    const int64_t rows = n_tok * heads;
    const emu::Dim3 mgrid{
        static_cast<unsigned>((rows + attn::kMergeWarpsPerBlock - 1) / attn::kMergeWarpsPerBlock), 1, 1};
    emu::launch(mgrid, {static_cast<unsigned>(attn::kMergeWarpsPerBlock * 32), 1, 1}, 0,
                [&] { attn::split_merge_kernel(part, n_chunks, n_tok, heads, static_cast<int>(c.dv), out); });
  }
  return r;
}

Result emu_all(const Case& c, const Data& d, bool split) {
  return emu_attend(c, d, split, 0, c.n_tokens, 0, c.n_kv(), 0, c.span_len);
}

void expect_close(const Result& got, const Result& ref, const std::string& what) {
  ASSERT_EQ(got.o.size(), ref.o.size());
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.o.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got.o[i])) << what << " o[" << i << "] = " << got.o[i];
    num += (static_cast<double>(got.o[i]) - ref.o[i]) * (static_cast<double>(got.o[i]) - ref.o[i]);
    den += static_cast<double>(ref.o[i]) * ref.o[i];
  }
  EXPECT_LE(den > 0 ? num / den : num, 1e-10) << what;
  for (size_t i = 0; i < ref.lse.size(); ++i) {
    if (std::isinf(ref.lse[i])) {
      EXPECT_TRUE(std::isinf(got.lse[i]) && got.lse[i] < 0) << what << " lse " << i;
    } else {
      EXPECT_NEAR(got.lse[i], ref.lse[i], 1e-4) << what << " lse " << i;
    }
  }
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<Case> cases() {
  std::vector<Case> cs;
  Case a;  // prefill from 0, GQA 4
  a.span_len = 37;
  a.n_tokens = 37;
  cs.push_back(a);
  Case b;  // a chunk after a past, across a chunk boundary, GQA 2, head dim 128
  b.n_heads = 4;
  b.q_per_kv = 2;
  b.dk = b.dv = 128;
  b.span_len = 300;
  b.q_pos0 = 250;
  b.n_tokens = 50;
  b.seed = 2;
  cs.push_back(b);
  Case g;  // one KV head, head dim 256, sliding window and soft-cap, bf16 cache
  g.n_heads = 2;
  g.q_per_kv = 2;
  g.dk = g.dv = 256;
  g.span_len = 300;
  g.q_pos0 = 280;
  g.n_tokens = 20;
  g.window = 40;
  g.softcap = 20.0f;
  g.dtype = KvDtype::kBF16;
  g.seed = 3;
  cs.push_back(g);
  Case m;  // MHA decode over 3 chunks, f32 cache, span not at 0, different K/V dims
  m.n_heads = 2;
  m.q_per_kv = 1;
  m.dk = 96;
  m.dv = 64;
  m.span_pos0 = 100;
  m.span_len = 600;
  m.q_pos0 = 699;
  m.n_tokens = 1;
  m.dtype = KvDtype::kF32;
  m.seed = 4;
  cs.push_back(m);
  return cs;
}

TEST(CudaAttentionEmulated, KernelsMatchCpuAttention) {
  int i = 0;
  for (const Case& c : cases()) {
    const Data d = make_data(c);
    const Result ref = cpu_attend(c, d);
    const Result single = emu_all(c, d, false);
    const Result split = emu_all(c, d, true);
    expect_close(single, ref, "case " + std::to_string(i) + " single");
    expect_close(split, ref, "case " + std::to_string(i) + " split");
    EXPECT_TRUE(same_bits(single.o, split.o) && same_bits(single.lse, split.lse)) << "case " << i;
    ++i;
  }
}

TEST(CudaAttentionEmulated, QueryChunksAndHeadGroupsDoNotChangeBits) {
  Case c;
  c.n_heads = 4;
  c.q_per_kv = 2;
  c.dk = c.dv = 32;
  c.span_len = 300;
  c.n_tokens = 300;
  c.seed = 5;
  const Data d = make_data(c);
  const Result full = emu_all(c, d, false);
  auto check = [&](const Result& part, int64_t t_first, int64_t n_tok, int64_t kv_first, int64_t n_kv,
                   const char* what) {
    const int64_t heads = n_kv * c.q_per_kv;
    for (int64_t t = 0; t < n_tok; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t ft = t_first + t, fh = kv_first * c.q_per_kv + h;
        for (int64_t i = 0; i < c.dv; ++i) {
          ASSERT_EQ(part.o[static_cast<size_t>((t * heads + h) * c.dv + i)],
                    full.o[static_cast<size_t>((ft * c.n_heads + fh) * c.dv + i)])
              << what << " token " << ft << " head " << fh;
        }
        ASSERT_EQ(part.lse[static_cast<size_t>(t * heads + h)],
                  full.lse[static_cast<size_t>(ft * c.n_heads + fh)])
            << what;
      }
    }
  };
  for (int64_t t : {0, 32, 256, 299}) {
    check(emu_attend(c, d, true, t, 1, 0, c.n_kv(), 0, t + 1), t, 1, 0, c.n_kv(), "decode");
  }
  check(emu_attend(c, d, false, 200, 57, 0, c.n_kv(), 0, 257), 200, 57, 0, c.n_kv(), "chunk");
  check(emu_attend(c, d, false, 250, 50, 1, 1, 0, 300), 250, 50, 1, 1, "head group of 1");
}

TEST(CudaAttentionEmulated, QueriesThatSeeNoKeyGiveZeroAndMinusInfinity) {
  Case c;
  c.span_len = 10;
  c.q_pos0 = 100;
  c.n_tokens = 2;
  c.window = 50;
  const Data d = make_data(c);
  for (bool split : {false, true}) {
    const Result r = emu_all(c, d, split);
    for (float x : r.o) EXPECT_EQ(x, 0.0f);
    for (float x : r.lse) EXPECT_TRUE(std::isinf(x) && x < 0);
  }
}

}  // namespace
}  // namespace kvtier::cuda
