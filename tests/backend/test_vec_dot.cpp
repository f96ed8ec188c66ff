// SIMD dot products against the scalar reference, for every supported type and ISA, on random data
// with odd sizes.
//
// Error bound. Each path computes per-block integer sums exactly (they fit in int32) and combines
// float terms t_j (scale products times integer sums, and offset/min terms). With unit roundoff
// u = 2^-24, a term carries at most 3 roundings of its own (f16 -> f32 is exact; d_w * d_a, the
// int -> float conversion, the product), and summing N terms in any order (sequential, per-lane
// chains plus a tree reduction) adds at most (N - 1) u sum|t_j| (first order). Hence
//   |path - exact| <= (N + 3) u S,   S = sum_j |t_j| <= sum_i |w_i a_i| + 2 sum_i |o_i a_i|
// where w_i is the dequantised weight, a_i = d_a q_i the dequantised activation and o_i the block's
// offset term (|d q| <= |w| + |o|). The reference adds N_ref = 2 n_blocks terms in one chain; the SIMD
// paths at most n_blocks per lane chain + one min chain of n_blocks + ~6 reduction adds. Therefore
//   |simd - ref| <= (3 n_blocks + 16) u S       (quantised types)
// For float types N = k terms in the reference and k / 32 + 16 per lane chain, tail included:
//   |simd - ref| <= (k + k / 32 + 24) u S,   S = sum_i |w_i x_i|.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/blocks.h"
#include "backend/cpu/dequant.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/quantize_act.h"
#include "random_weights.h"

namespace kvtier::cpu {
namespace {

constexpr double kU = 1.0 / (1 << 24);

std::vector<Isa> simd_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

TEST(VecDot, SimdMatchesScalarWithinBound) {
  const auto isas = simd_isas();
  if (isas.empty()) GTEST_SKIP() << "no SIMD path on this CPU";
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (GgmlType type : test::all_weight_types()) {
    const int64_t bs = ggml_traits(type).block_size;
    // Odd block counts; for float types sizes that are not multiples of 8/16/32.
    const std::vector<int64_t> sizes = bs == 1 ? std::vector<int64_t>{1, 7, 31, 33, 100, 257, 1001}
                                               : std::vector<int64_t>{bs, 3 * bs, 7 * bs, 13 * bs};
    for (int64_t k : sizes) {
      for (int trial = 0; trial < 4; ++trial) {
        const auto w = test::random_weights(type, 1, k, rng);
        std::vector<float> x(static_cast<size_t>(k));
        for (float& v : x) v = normal(rng);
        const ActFormat f = act_format_for(type);
        std::vector<uint8_t> act(act_row_bytes(f, k));
        quantize_act_row(f, x.data(), k, act.data());

        std::vector<float> wd(static_cast<size_t>(k));
        dequantize_row(type, w.data(), wd.data(), k);
        const auto off = test::offset_terms(type, w.data(), k);
        const auto a = test::act_values(f, act.data(), x);
        double s = 0.0;
        for (int64_t i = 0; i < k; ++i) s += (std::fabs(wd[i]) + 2.0 * std::fabs(off[i])) * std::fabs(a[i]);
        const double n_terms = bs == 1 ? static_cast<double>(k + k / 32 + 24) : 3.0 * (k / bs) + 16.0;
        const double tol = n_terms * kU * s;

        const float ref = vec_dot(Isa::kScalar, type, w.data(), act.data(), k);
        for (Isa isa : isas) {
          const float got = vec_dot(isa, type, w.data(), act.data(), k);
          EXPECT_LE(std::fabs(static_cast<double>(got) - ref), tol)
              << ggml_type_name(type) << " k=" << k << " isa=" << isa_name(isa) << " ref=" << ref
              << " got=" << got;
        }
      }
    }
  }
}

// The same with inputs that stress the integer paths: extreme activations (+-127 everywhere) and
// weights with all quant bits set.
TEST(VecDot, ExtremeQuantsStayExact) {
  const auto isas = simd_isas();
  if (isas.empty()) GTEST_SKIP() << "no SIMD path on this CPU";
  std::mt19937 rng(7);
  for (GgmlType type : test::all_weight_types()) {
    const int64_t bs = ggml_traits(type).block_size;
    if (bs == 1) continue;
    const int64_t k = 3 * bs;
    auto w = test::random_weights(type, 1, k, rng);
    // Set every non-scale byte to 0xFF (max quants, max sub-scales), keeping the f16 scales.
    const auto& tr = ggml_traits(type);
    for (size_t b = 0; b < w.size() / tr.type_size; ++b) {
      std::vector<uint8_t> keep(tr.type_size);
      std::memcpy(keep.data(), w.data() + b * tr.type_size, tr.type_size);
      std::memset(w.data() + b * tr.type_size, 0xFF, tr.type_size);
      for (int off : test::f16_field_offsets(type))
        std::memcpy(w.data() + b * tr.type_size + off, keep.data() + off, 2);
    }
    for (float sign : {1.0f, -1.0f}) {
      std::vector<float> x(static_cast<size_t>(k), sign);
      const ActFormat f = act_format_for(type);
      std::vector<uint8_t> act(act_row_bytes(f, k));
      quantize_act_row(f, x.data(), k, act.data());
      std::vector<float> wd(static_cast<size_t>(k));
      dequantize_row(type, w.data(), wd.data(), k);
      const auto off = test::offset_terms(type, w.data(), k);
      const auto a = test::act_values(f, act.data(), x);
      double s = 0.0, exact = 0.0;
      for (int64_t i = 0; i < k; ++i) {
        s += (std::fabs(wd[i]) + 2.0 * std::fabs(off[i])) * std::fabs(a[i]);
        exact += static_cast<double>(wd[i]) * a[i];
      }
      const double tol = (3.0 * (k / bs) + 16.0) * kU * s;
      const float ref = vec_dot(Isa::kScalar, type, w.data(), act.data(), k);
      EXPECT_LE(std::fabs(ref - exact), tol) << ggml_type_name(type) << ": reference vs exact";
      for (Isa isa : isas) {
        const float got = vec_dot(isa, type, w.data(), act.data(), k);
        EXPECT_LE(std::fabs(static_cast<double>(got) - ref), tol)
            << ggml_type_name(type) << " " << isa_name(isa);
      }
    }
  }
}

// The reference dot equals the float dot of the dequantised rows (independent check of the integer
// decomposition, within the same bound).
TEST(VecDot, ReferenceMatchesDequantisedDot) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (GgmlType type : test::all_weight_types()) {
    const int64_t bs = ggml_traits(type).block_size;
    const int64_t k = bs == 1 ? 77 : 5 * bs;
    const auto w = test::random_weights(type, 1, k, rng);
    std::vector<float> x(static_cast<size_t>(k));
    for (float& v : x) v = normal(rng);
    const ActFormat f = act_format_for(type);
    std::vector<uint8_t> act(act_row_bytes(f, k));
    quantize_act_row(f, x.data(), k, act.data());
    std::vector<float> wd(static_cast<size_t>(k));
    dequantize_row(type, w.data(), wd.data(), k);
    const auto off = test::offset_terms(type, w.data(), k);
    const auto a = test::act_values(f, act.data(), x);
    double s = 0.0, exact = 0.0;
    for (int64_t i = 0; i < k; ++i) {
      s += (std::fabs(wd[i]) + 2.0 * std::fabs(off[i])) * std::fabs(a[i]);
      exact += static_cast<double>(wd[i]) * a[i];
    }
    // Dequantised weights carry one rounding each (d * q, then - m): add 2 u S for that.
    const double n_terms = bs == 1 ? static_cast<double>(k + 4) : 2.0 * (k / bs) + 8.0;
    const float ref = vec_dot(Isa::kScalar, type, w.data(), act.data(), k);
    EXPECT_LE(std::fabs(ref - exact), n_terms * kU * s) << ggml_type_name(type);
  }
}

TEST(QuantizeAct, RoundTripWithinHalfStep) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (ActFormat f : {ActFormat::kQ8_32, ActFormat::kQ8_32Min, ActFormat::kQ8_K}) {
    const int64_t k = 4 * act_block_size(f);
    std::vector<float> x(static_cast<size_t>(k));
    for (float& v : x) v = normal(rng);
    x[5] = 0.0f;
    std::vector<uint8_t> act(act_row_bytes(f, k));
    quantize_act_row(f, x.data(), k, act.data());
    const auto a = test::act_values(f, act.data(), x);
    const int bs = act_block_size(f);
    for (int64_t b = 0; b < k / bs; ++b) {
      float amax = 0.0f;
      for (int i = 0; i < bs; ++i) amax = std::max(amax, std::fabs(x[b * bs + i]));
      const double d = amax / 127.0;
      for (int i = 0; i < bs; ++i)
        EXPECT_LE(std::fabs(a[b * bs + i] - x[b * bs + i]), 0.5 * d * (1 + 1e-5) + 1e-30);
    }
    if (f == ActFormat::kQ8_K) {
      ActQ8_K blk;
      std::memcpy(&blk, act.data(), sizeof(blk));
      for (int j = 0; j < 16; ++j) {
        int s = 0;
        for (int i = 0; i < 16; ++i) s += blk.qs[16 * j + i];
        EXPECT_EQ(blk.bsums[j], s);
      }
    } else {
      ActQ8_32 blk;
      std::memcpy(&blk, act.data(), sizeof(blk));
      int s = 0;
      for (int i = 0; i < kQK; ++i) s += blk.qs[i];
      if (f == ActFormat::kQ8_32Min) {
        EXPECT_EQ(blk.dsum, blk.d * static_cast<float>(s));  // d * f32(sum), rounded once
        EXPECT_NE(s, 0);                                     // so the check above can fail
      } else {
        EXPECT_EQ(blk.sum, s);
      }
    }
  }
}

// Every kernel table's activation quantiser writes the scalar reference's bytes: random rows of
// several magnitudes, an all-zero block, exact ties (x * (1 / d) = n + 0.5 with d = 1) and -0.0.
TEST(QuantizeAct, SimdEqualsScalarBytes) {
  std::mt19937 rng(19);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    const KernelTable& table = kernel_table(isa);
    for (ActFormat f : {ActFormat::kQ8_32, ActFormat::kQ8_32Min, ActFormat::kQ8_K}) {
      const QuantizeActFn fn = table.quantize_act[static_cast<size_t>(f)];
      ASSERT_NE(fn, nullptr) << isa_name(isa);
      const int bs = act_block_size(f);
      const int64_t k = 6 * bs;
      for (int trial = 0; trial < 20; ++trial) {
        std::vector<float> x(static_cast<size_t>(k));
        const float scale = std::ldexp(1.0f, trial - 10);
        for (float& v : x) v = scale * normal(rng);
        for (int i = 0; i < bs; ++i) x[static_cast<size_t>(bs + i)] = 0.0f;  // block 1: zeros
        x[static_cast<size_t>(bs + 3)] = -0.0f;
        // Block 2: amax 127 (d = 1, 1 / d = 1) and halves, so rounding meets exact ties.
        for (int i = 0; i < bs; ++i) x[static_cast<size_t>(2 * bs + i)] = static_cast<float>(i % 40) - 20.5f;
        x[static_cast<size_t>(2 * bs)] = -127.0f;
        // Block 3: quants at +127 then -127 (the largest block sums of either sign).
        for (int i = 0; i < bs; ++i) x[static_cast<size_t>(3 * bs + i)] = i < bs / 2 ? 3.0f : -3.0f;
        std::vector<uint8_t> want(act_row_bytes(f, k)), got(act_row_bytes(f, k), 0xAB);
        quantize_act_row(f, x.data(), k, want.data());
        fn(x.data(), k, got.data());
        ASSERT_EQ(want, got) << isa_name(isa) << " format " << static_cast<int>(f) << " trial " << trial;
      }
    }
  }
}

// The AVX-512 table's quantised dot products compute the AVX2 ones' integers and float expression,
// so they agree bit for bit: q4_K / q6_K (the matmul tiles of both tables rely on the same integers)
// and the legacy types' chain (legacy_chain.h; q8_0 the AVX2 table's own kernels).
TEST(VecDot, Avx512QuantsEqualAvx2Bits) {
  if (!isa_supported(Isa::kAvx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (GgmlType type : {GgmlType::kQ4_K, GgmlType::kQ6_K, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                        GgmlType::kQ5_0, GgmlType::kQ5_1}) {
    const ActFormat f = act_format_for(type);
    for (int64_t k : {256, 768, 2048}) {
      for (int trial = 0; trial < 8; ++trial) {
        const auto w = test::random_weights(type, 1, k, rng);
        std::vector<float> x(static_cast<size_t>(k));
        for (float& v : x) v = normal(rng);
        std::vector<uint8_t> act(act_row_bytes(f, k));
        quantize_act_row(f, x.data(), k, act.data());
        const float a2 = vec_dot(Isa::kAvx2, type, w.data(), act.data(), k);
        const float a5 = vec_dot(Isa::kAvx512, type, w.data(), act.data(), k);
        ASSERT_EQ(std::bit_cast<uint32_t>(a2), std::bit_cast<uint32_t>(a5))
            << ggml_type_name(type) << " k=" << k;
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::cpu
