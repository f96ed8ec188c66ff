// matmul: every output equals the single vec_dot of the same ISA bit for bit, whatever the thread
// count, the number of tokens or the tiling; unsupported inputs are errors.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/quantize_act.h"
#include "core/error.h"
#include "random_weights.h"

namespace kvtier::cpu {
namespace {

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

TEST(Matmul, EqualsVecDotForEveryThreadCountAndTokenCount) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t n_rows = 37;  // not a multiple of the 16-row split unit
  for (GgmlType type : test::all_weight_types()) {
    const int64_t bs = ggml_traits(type).block_size;
    const int64_t k = bs == 1 ? 75 : 3 * bs;
    const auto w_bytes = test::random_weights(type, n_rows, k, rng);
    const WeightMatrix w{type, w_bytes.data(), n_rows, k};
    const int64_t row_bytes = static_cast<int64_t>(w_bytes.size()) / n_rows;
    for (int64_t n_tokens : {1, 3, 40}) {
      std::vector<float> x(static_cast<size_t>(n_tokens * k));  // [n_tokens, k]
      for (float& v : x) v = normal(rng);
      for (Isa isa : supported_isas()) {
        // Expected: one vec_dot per output on separately quantised activation rows.
        const ActFormat f = act_format_for(type);
        std::vector<float> expected(static_cast<size_t>(n_tokens * n_rows));  // [n_tokens, n_rows]
        for (int64_t t = 0; t < n_tokens; ++t) {
          std::vector<uint8_t> act(act_row_bytes(f, k));
          quantize_act_row(f, x.data() + t * k, k, act.data());
          for (int64_t r = 0; r < n_rows; ++r) {
            expected[t * n_rows + r] = vec_dot(isa, type, w_bytes.data() + r * row_bytes, act.data(), k);
          }
        }
        for (int threads = 1; threads <= 4; ++threads) {
          ThreadPool pool(threads);
          std::vector<uint8_t> scratch(matmul_scratch_bytes(type, k, n_tokens));
          std::vector<float> y(static_cast<size_t>(n_tokens * n_rows), -1.0f);
          matmul(pool, isa, w, x.data(), n_tokens, y.data(), scratch);
          for (size_t i = 0; i < y.size(); ++i) {
            ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(expected[i]))
                << ggml_type_name(type) << " isa=" << isa_name(isa) << " threads=" << threads
                << " tokens=" << n_tokens << " i=" << i;
          }
        }
      }
    }
  }
}

// matmul_same_input (a layer's Q/K/V, its gate/up) gives each matrix matmul's bits: matrices of one
// activation format (decode: one pool run) and of several (one matmul each), row counts that split
// unevenly over the threads, and token counts with and without panel tiles.
TEST(Matmul, SeveralMatricesOverOneInputGiveEachMatmulsBits) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t k = 512;  // a multiple of every block size
  const std::vector<std::vector<GgmlType>> mixes = {
      {GgmlType::kQ4_1, GgmlType::kQ4_1, GgmlType::kQ8_0},  // SmolLM2-like: one format
      {GgmlType::kQ4_K, GgmlType::kQ4_K, GgmlType::kQ6_K},  // Gemma-3-like: one format
      {GgmlType::kQ4_0, GgmlType::kF16, GgmlType::kQ5_K},   // three formats
      {GgmlType::kF32, GgmlType::kBF16},
  };
  const std::vector<int64_t> rows = {37, 5, 70};
  for (const auto& types : mixes) {
    std::vector<std::vector<uint8_t>> data;
    std::vector<WeightMatrix> ws;
    size_t scratch_bytes = 0;
    for (size_t i = 0; i < types.size(); ++i) data.push_back(test::random_weights(types[i], rows[i], k, rng));
    for (size_t i = 0; i < types.size(); ++i) ws.push_back({types[i], data[i].data(), rows[i], k});
    for (int64_t n_tokens : {1, 2, 9, 21}) {
      for (GgmlType t : types) scratch_bytes = std::max(scratch_bytes, matmul_scratch_bytes(t, k, n_tokens));
      std::vector<float> x(static_cast<size_t>(n_tokens * k));  // [n_tokens, k]
      for (float& v : x) v = normal(rng);
      for (Isa isa : supported_isas()) {
        for (int threads = 1; threads <= 3; ++threads) {
          ThreadPool pool(threads);
          std::vector<uint8_t> scratch(scratch_bytes);
          std::vector<std::vector<float>> expected, got;  // [matrix][n_tokens, rows]
          std::vector<MatmulOut> outs;
          for (const WeightMatrix& w : ws) {
            expected.emplace_back(static_cast<size_t>(n_tokens * w.n_rows));
            matmul(pool, isa, w, x.data(), n_tokens, expected.back().data(), scratch);
            got.emplace_back(static_cast<size_t>(n_tokens * w.n_rows), -7.0f);
          }
          for (size_t i = 0; i < ws.size(); ++i) outs.push_back({&ws[i], got[i].data()});
          matmul_same_input(pool, isa, outs, x.data(), n_tokens, scratch);
          for (size_t i = 0; i < ws.size(); ++i) {
            for (size_t j = 0; j < got[i].size(); ++j) {
              ASSERT_EQ(std::bit_cast<uint32_t>(got[i][j]), std::bit_cast<uint32_t>(expected[i][j]))
                  << ggml_type_name(types[i]) << " isa=" << isa_name(isa) << " threads=" << threads
                  << " tokens=" << n_tokens << " j=" << j;
            }
          }
        }
      }
    }
  }
  ThreadPool pool(1);
  std::vector<float> x(k), y(8);
  std::vector<uint8_t> scratch(matmul_scratch_bytes(GgmlType::kQ4_0, k, 1));
  const auto w4 = test::random_weights(GgmlType::kQ4_0, 1, k, rng);
  const auto w8 = test::random_weights(GgmlType::kQ4_0, 1, 256, rng);
  const WeightMatrix a{GgmlType::kQ4_0, w4.data(), 1, k}, b{GgmlType::kQ4_0, w8.data(), 1, 256};
  const MatmulOut mixed[] = {{&a, y.data()}, {&b, y.data() + 1}};
  EXPECT_DEATH_IF_SUPPORTED(matmul_same_input(pool, Isa::kScalar, mixed, x.data(), 1, scratch),
                            "inner sizes");
}

TEST(Matmul, UnsupportedTypeAndBadShapeAreErrors) {
  ThreadPool pool(1);
  std::vector<uint8_t> w(1024);
  std::vector<float> x(256), y(4);
  EXPECT_THROW(matmul(pool, Isa::kScalar, WeightMatrix{GgmlType::kIQ2_XXS, w.data(), 1, 256}, x.data(), 1,
                      y.data(), {}),
               Error);
  EXPECT_THROW(matmul_scratch_bytes(GgmlType::kQ4_K, 576, 1), Error);
  std::vector<uint8_t> scratch(4096);
  EXPECT_THROW(matmul(pool, Isa::kScalar, WeightMatrix{GgmlType::kQ4_0, w.data(), 1, 33}, x.data(), 1,
                      y.data(), scratch),
               Error);
}

TEST(CpuFeatures, DispatchNeverExceedsTheCpu) {
  EXPECT_TRUE(isa_supported(Isa::kScalar));
  EXPECT_TRUE(isa_supported(best_isa()));
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) {
      EXPECT_THROW(vec_dot(isa, GgmlType::kF32, nullptr, nullptr, 0), Error);
    }
  }
  if (isa_supported(Isa::kAvx512)) {
    EXPECT_TRUE(isa_supported(Isa::kAvx2));
  }
}

TEST(CpuFeatures, IsaNamesRoundTrip) {
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    const std::optional<Isa> back = isa_from_name(isa_name(isa));
    ASSERT_TRUE(back.has_value()) << isa_name(isa);
    EXPECT_EQ(*back, isa);
  }
  EXPECT_FALSE(isa_from_name("").has_value());
  EXPECT_FALSE(isa_from_name("AVX2").has_value());
  EXPECT_FALSE(isa_from_name("avx512f").has_value());
}

}  // namespace
}  // namespace kvtier::cpu
