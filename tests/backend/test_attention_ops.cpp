// The AVX-512 attention tile kernels are bit-identical to the AVX2 ones (attention_avx512.cpp keeps
// each (row, key) score's 8-lane chain and each element's FMA chain), so the AVX-512 path of
// attend() gives the AVX2 path's bits: row counts 1..6 (pairs, 4-row blocks and leftovers), key
// counts off the 4- and 8-key blocks, head sizes off 8 and 16.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/attention.h"
#include "core/half.h"
#include "core/thread_pool.h"

namespace kvtier::cpu {
namespace {

std::vector<float> random_floats(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what,
                      int64_t rows, int64_t n, int64_t d) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
      << what << " rows=" << rows << " n=" << n << " d=" << d;
}

TEST(AttentionOps, Avx512BitIdenticalToAvx2) {
  if (!isa_supported(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  const AttnTileOps& ref = attn_tile_ops_avx2();
  const AttnTileOps& ops = attn_tile_ops_avx512();
  std::mt19937 rng(5);
  for (int64_t d : {13, 64, 72, 256}) {
    for (int64_t rows = 1; rows <= 6; ++rows) {
      for (int64_t n : {1, 3, 4, 9, 32}) {
        const int64_t q_stride = d + 3;
        const auto q = random_floats(static_cast<size_t>(rows * q_stride), rng);
        const auto k = random_floats(static_cast<size_t>(n * d), rng);
        std::vector<float> s0(static_cast<size_t>(rows * n)), s1(s0.size());  // [rows, n]
        ref.scores(q.data(), q_stride, rows, k.data(), n, d, s0.data());
        ops.scores(q.data(), q_stride, rows, k.data(), n, d, s1.data());
        expect_same_bits(s0, s1, "scores", rows, n, d);

        const auto p = random_floats(static_cast<size_t>(rows * n), rng);  // [rows, n]
        const auto v = random_floats(static_cast<size_t>(n * d), rng);     // [n, d]
        auto a0 = random_floats(static_cast<size_t>(rows * d), rng);       // [rows, d]
        auto a1 = a0;
        ref.accumulate(p.data(), rows, v.data(), n, d, a0.data());
        ops.accumulate(p.data(), rows, v.data(), n, d, a1.data());
        expect_same_bits(a0, a1, "accumulate", rows, n, d);
      }
    }
    auto x0 = random_floats(static_cast<size_t>(d * 3), rng);
    auto x1 = x0;
    ref.scale(x0.data(), d * 3, 0.37f);
    ops.scale(x1.data(), d * 3, 0.37f);
    expect_same_bits(x0, x1, "scale", 1, 0, d);
    std::vector<uint16_t> h(static_cast<size_t>(d * 3));
    for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_f16(x0[i]);
    std::vector<float> f0(h.size()), f1(h.size());
    ref.f16_to_f32(h.data(), d * 3, f0.data());
    ops.f16_to_f32(h.data(), d * 3, f1.data());
    expect_same_bits(f0, f1, "f16_to_f32", 1, 0, d);
  }
}

std::vector<uint16_t> to_f16(const std::vector<float>& x) {
  std::vector<uint16_t> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = f32_to_f16(x[i]);
  return h;
}

std::vector<float> to_f32(const std::vector<uint16_t>& h) {
  std::vector<float> x(h.size());
  for (size_t i = 0; i < h.size(); ++i) x[i] = f16_to_f32(h[i]);
  return x;
}

// Decode reads f16 K/V rows in place (scores_f16 / accumulate_f16, converted in registers) where
// prefill converts a tile into f32 first: per ISA both give the same bits, for GQA groups of 1..9
// rows (the f16 kernels block the rows differently from the f32 ones), keys off every block size and
// head sizes off 8 and 16. Against the AVX2 f16 kernels the AVX-512 table's are bit-identical too.
TEST(AttentionOps, F16KernelsEqualF32KernelsOnConvertedRows) {
  struct Named {
    const char* name;
    const AttnTileOps* ops;
  };
  std::vector<Named> isas{{"ref", &attn_tile_ops_ref()}};
  if (isa_supported(Isa::kAvx2)) isas.push_back({"avx2", &attn_tile_ops_avx2()});
  if (isa_supported(Isa::kAvx512)) isas.push_back({"avx512", &attn_tile_ops_avx512()});
  std::mt19937 rng(11);
  for (const Named& isa : isas) {
    SCOPED_TRACE(isa.name);
    const AttnTileOps& ops = *isa.ops;
    for (int64_t d : {13, 64, 72, 256}) {
      for (int64_t rows = 1; rows <= 9; ++rows) {
        for (int64_t n : {1, 2, 3, 5, 9, 32}) {
          const int64_t q_stride = d + 3;
          const auto q = random_floats(static_cast<size_t>(rows * q_stride), rng);
          const auto kh = to_f16(random_floats(static_cast<size_t>(n * d), rng));  // [n, d] f16
          const auto kf = to_f32(kh);
          std::vector<float> s0(static_cast<size_t>(rows * n)), s1(s0.size());  // [rows, n]
          ops.scores(q.data(), q_stride, rows, kf.data(), n, d, s0.data());
          ops.scores_f16(q.data(), q_stride, rows, kh.data(), n, d, s1.data());
          expect_same_bits(s0, s1, "scores_f16", rows, n, d);
          if (isa.ops == &attn_tile_ops_avx512()) {
            std::vector<float> s2(s0.size());
            attn_tile_ops_avx2().scores_f16(q.data(), q_stride, rows, kh.data(), n, d, s2.data());
            expect_same_bits(s2, s1, "scores_f16 avx2 vs avx512", rows, n, d);
          }

          const auto p = random_floats(static_cast<size_t>(rows * n), rng);        // [rows, n]
          const auto vh = to_f16(random_floats(static_cast<size_t>(n * d), rng));  // [n, d] f16
          const auto vf = to_f32(vh);
          auto a0 = random_floats(static_cast<size_t>(rows * d), rng);  // [rows, d]
          auto a1 = a0;
          auto a2 = a0;
          ops.accumulate(p.data(), rows, vf.data(), n, d, a0.data());
          ops.accumulate_f16(p.data(), rows, vh.data(), n, d, a1.data());
          expect_same_bits(a0, a1, "accumulate_f16", rows, n, d);
          if (isa.ops == &attn_tile_ops_avx512()) {
            attn_tile_ops_avx2().accumulate_f16(p.data(), rows, vh.data(), n, d, a2.data());
            expect_same_bits(a2, a1, "accumulate_f16 avx2 vs avx512", rows, n, d);
          }
        }
      }
    }
  }
}

// attend() on the AVX-512 path equals the AVX2 path bit for bit (GQA 4 heads per KV head, f16 KV,
// a sliding window and a soft cap, two spans, 2 threads).
TEST(AttentionOps, AttendAvx512EqualsAvx2) {
  if (!isa_supported(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(9);
  const int64_t n_kv = 2, G = 4, d = 72, n_ctx = 150, n_q = 37;
  std::vector<uint16_t> k(static_cast<size_t>(n_kv * n_ctx * d)), v(k.size());  // [n_kv, n_ctx, d] f16
  for (auto* buf : {&k, &v}) {
    const auto f = random_floats(buf->size(), rng);
    for (size_t i = 0; i < buf->size(); ++i) (*buf)[i] = f32_to_f16(f[i]);
  }
  const auto q = random_floats(static_cast<size_t>(n_q * n_kv * G * d), rng);  // [n_q, n_kv * G, d]
  for (int64_t window : {0, 45}) {
    AttnParams a;
    a.head_dim_k = a.head_dim_v = d;
    a.q_per_kv = G;
    a.scale = 0.125f;
    a.softcap = window > 0 ? 20.0f : 0.0f;
    a.window = window;
    a.kv_dtype = KvDtype::kF16;
    const int64_t cut = 64;
    std::vector<KvSpan> spans = {
        KvSpan{0, cut, k.data(), v.data(), n_ctx * d, n_ctx * d},
        KvSpan{cut, n_ctx - cut, k.data() + cut * d, v.data() + cut * d, n_ctx * d, n_ctx * d}};
    AttnQueries qs{q.data(), n_kv * G * d, n_q, n_kv * G, n_ctx - n_q};
    std::vector<float> out[2], lse[2];
    int i = 0;
    for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
      ThreadPool pool(2);
      std::vector<uint8_t> scratch(attention_scratch_bytes(a, pool.size()));
      out[i].assign(static_cast<size_t>(n_q * n_kv * G * d), 0.0f);
      lse[i].assign(static_cast<size_t>(n_q * n_kv * G), 0.0f);
      attend(pool, isa, a, qs, spans, AttnOutput{out[i].data(), n_kv * G * d, lse[i].data(), n_kv * G},
             scratch);
      ++i;
    }
    expect_same_bits(out[0], out[1], "o", n_q, n_ctx, d);
    expect_same_bits(lse[0], lse[1], "lse", n_q, n_ctx, d);
  }
}

}  // namespace
}  // namespace kvtier::cpu
