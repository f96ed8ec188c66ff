// The rows-in-lanes layout (weight_lanes.h) and the kernels over it. pack_lanes must keep every
// value (unpack gives the GGML rows back), and matmul over a packed matrix must give each output
// the bits of the same ISA's vec_dot, as the GGML-row tiles do: the engine's exactness between KV
// policies and across batch sizes rests on it. Types: q8_0, the legacy 4/5-bit ones, q4_K and q6_K
// (random scale bytes: every 6-bit scale and min, every signed q6_K scale). Shapes: rows
// off the 16-row group (a partial last group), odd block counts (q8_0's odd last block), tokens 1
// (decode) to 67, 1-3 threads; random quant bytes include q8_0's -128, which its q + 128 offset must
// keep exact, and every fifth-bit pattern of q5_0 / q5_1.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/quantize_act.h"
#include "backend/cpu/weight_lanes.h"
#include "core/error.h"
#include "random_weights.h"

namespace kvtier::cpu {
namespace {

const GgmlType kLanesTypes[] = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                                GgmlType::kQ5_1, GgmlType::kQ4_K, GgmlType::kQ6_K};

// Inner sizes: 1, 2, 3 blocks, Gemma-3's 640, an odd 37 (legacy); 1, 2, 3, 8 super-blocks (K-quants).
std::vector<int64_t> inner_sizes(GgmlType type, bool wide) {
  if (ggml_traits(type).block_size == 256)
    return wide ? std::vector<int64_t>{256, 512, 768, 2048} : std::vector<int64_t>{256, 768};
  return wide ? std::vector<int64_t>{32, 64, 96, 640, 37 * 32} : std::vector<int64_t>{32, 64, 96, 640};
}

using test::run_matmul;

TEST(WeightLanes, PackKeepsEveryValue) {
  std::mt19937 rng(5);
  for (GgmlType type : kLanesTypes) {
    for (int64_t k : inner_sizes(type, false)) {
      for (int64_t n_rows : {1, 16, 37}) {
        const auto bytes = test::random_weights(type, n_rows, k, rng);
        const LanesWeights p = pack_lanes(WeightMatrix{type, bytes.data(), n_rows, k});
        EXPECT_EQ(lanes_group_bytes(type, k) % 64, 0);
        EXPECT_EQ(p.size(), static_cast<size_t>((n_rows + 15) / 16 * lanes_group_bytes(type, k)));
        EXPECT_EQ(reinterpret_cast<uintptr_t>(p.data()) % 64, 0u);
        const size_t row_bytes = bytes.size() / static_cast<size_t>(n_rows);
        std::vector<uint8_t> row(row_bytes);
        for (int64_t r = 0; r < n_rows; ++r) {
          unpack_lanes_row(p, r, row.data());
          ASSERT_EQ(0, std::memcmp(row.data(), bytes.data() + r * row_bytes, row_bytes))
              << ggml_type_name(type) << " k=" << k << " r=" << r;
        }
      }
    }
  }
}

// Several matrices packed into one shared buffer (a model's layers) hold the same bytes as each
// packed alone, each at its own 64-byte aligned offset, and the buffer lives as long as any of them.
TEST(WeightLanes, MatricesShareOneBuffer) {
  std::mt19937 rng(9);
  struct Shape {
    GgmlType type;
    int64_t n_rows, k;
  };
  const Shape shapes[] = {{GgmlType::kQ5_0, 37, 640}, {GgmlType::kQ6_K, 16, 768}, {GgmlType::kQ8_0, 5, 96}};
  std::vector<std::vector<uint8_t>> bytes;
  size_t total = 0;
  for (const Shape& s : shapes) {
    bytes.push_back(test::random_weights(s.type, s.n_rows, s.k, rng));
    EXPECT_EQ(lanes_bytes(s.type, s.n_rows, s.k) % 64, 0) << ggml_type_name(s.type);
    total += static_cast<size_t>(lanes_bytes(s.type, s.n_rows, s.k));
  }
  std::vector<LanesWeights> views;
  {
    auto buffer = std::make_shared<const LanesBuffer>(total);
    size_t offset = 0;
    for (size_t i = 0; i < std::size(shapes); ++i) {
      views.emplace_back(shapes[i].type, shapes[i].n_rows, shapes[i].k, buffer, offset);
      EXPECT_EQ(views.back().data(), buffer->data() + offset);
      offset += views.back().size();
    }
    EXPECT_EQ(offset, total);
  }  // the views keep the buffer
  for (size_t i = 0; i < std::size(shapes); ++i) {
    const WeightMatrix w{shapes[i].type, bytes[i].data(), shapes[i].n_rows, shapes[i].k};
    pack_lanes_into(w, views[i]);
    const LanesWeights alone = pack_lanes(w);
    ASSERT_EQ(alone.size(), views[i].size());
    EXPECT_EQ(0, std::memcmp(alone.data(), views[i].data(), alone.size())) << ggml_type_name(shapes[i].type);
  }
}

// A matrix packed slice by slice (pack_lanes_groups: the output matrix, whose rows are handed back
// slice by slice) writes every byte of the copy, and the same bytes as packed whole, whatever the
// slices: one group, two, or a slice ending at the partial last group.
TEST(WeightLanes, PackedInSlicesEqualsPackedWhole) {
  std::mt19937 rng(12);
  for (GgmlType type : kLanesTypes) {
    for (int64_t k : inner_sizes(type, false)) {
      for (int64_t n_rows : {16, 37, 53}) {
        const auto bytes = test::random_weights(type, n_rows, k, rng);
        const WeightMatrix w{type, bytes.data(), n_rows, k};
        const LanesWeights whole = pack_lanes(w);
        const int64_t groups = lanes_groups(n_rows);
        EXPECT_EQ(groups, (n_rows + 15) / 16);
        for (int64_t per_slice : {1, 2, 3}) {
          LanesWeights sliced(type, n_rows, k);
          std::memset(sliced.data(), 0xA5, sliced.size());  // bytes no slice writes would stay so
          for (int64_t g = 0; g < groups; g += per_slice)
            pack_lanes_groups(w, sliced, g, std::min(groups, g + per_slice));
          ASSERT_EQ(sliced.size(), whole.size());
          EXPECT_EQ(0, std::memcmp(sliced.data(), whole.data(), whole.size()))
              << ggml_type_name(type) << " k=" << k << " rows=" << n_rows
              << " groups per slice=" << per_slice;
        }
      }
    }
  }
}

TEST(WeightLanes, RefusesTypesWithoutALayoutAndRaggedRows) {
  std::mt19937 rng(6);
  const auto bytes = test::random_weights(GgmlType::kQ5_K, 16, 256, rng);
  EXPECT_FALSE(has_lanes_layout(GgmlType::kQ5_K));
  try {
    (void)pack_lanes(WeightMatrix{GgmlType::kQ5_K, bytes.data(), 16, 256});
    FAIL() << "packed a q5_K matrix";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
  }
  EXPECT_THROW((void)lanes_group_bytes(GgmlType::kQ8_0, 48), Error);
  EXPECT_THROW((void)lanes_group_bytes(GgmlType::kQ6_K, 640), Error);
}

TEST(WeightLanes, VectorTablesHaveAKernelForEveryLayout) {
  int tables = 0;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    ++tables;
    for (GgmlType type : kLanesTypes)
      EXPECT_NE(kernel_table(isa).lanes[static_cast<size_t>(type)], nullptr)
          << isa_name(isa) << " " << ggml_type_name(type);
    // q8_0's copy replaces its GGUF rows (pack_lanes hands the output matrix's pages back): its
    // kernel must serve prefill products too.
    EXPECT_TRUE(kernel_table(isa).lanes_any_tokens[static_cast<size_t>(GgmlType::kQ8_0)]) << isa_name(isa);
  }
  if (isa_supported(Isa::kAvx512)) {
    // The AVX-512 vector table's lanes kernels serve prefill for every type (several tokens per pass,
    // matmul_lanes_avx512_tokens.cpp); where AMX tiles exist, the best table hands those types'
    // prefill back to them.
    for (GgmlType type : kLanesTypes) {
      const auto i = static_cast<size_t>(type);
      EXPECT_TRUE(kernel_table(Isa::kAvx512, MatrixUnits::kVector).lanes_any_tokens[i])
          << ggml_type_name(type);
      const KernelTable& best = kernel_table(Isa::kAvx512);
      const bool amx_panel = best.panel[i].fn != nullptr && best.panel[i].layout == PanelLayout::kRows;
      EXPECT_EQ(best.lanes_any_tokens[i], !amx_panel) << ggml_type_name(type);
    }
  }
  if (tables == 0) GTEST_SKIP() << "this CPU has no AVX2: no lanes kernel is run here";
}

// The integer bounds the kernels rely on (pair sums within int16, sums of several pair sums in
// int16): every quant byte at one extreme value, every activation at +127 or -127, so that all
// products of a block have the same sign and the largest magnitude the bytes allow.
TEST(WeightLanes, ExtremeQuantsAndActivationsKeepVecDotBits) {
  std::mt19937 rng(8);
  int kernels_run = 0;
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    for (GgmlType type : kLanesTypes) {
      kernels_run += kernel_table(isa).lanes[static_cast<size_t>(type)] != nullptr ? 1 : 0;
      const int64_t k = ggml_traits(type).block_size == 256 ? 512 : 640, n_rows = 16;
      const int64_t block_bytes = static_cast<int64_t>(ggml_traits(type).type_size);
      for (uint8_t fill : {uint8_t{0xFF}, uint8_t{0x80}, uint8_t{0x7F}, uint8_t{0x00}}) {
        auto bytes = test::random_weights(type, n_rows, k, rng);  // keeps its finite f16 scales
        const auto f16_at = test::f16_field_offsets(type);
        for (size_t blk = 0; blk < bytes.size() / static_cast<size_t>(block_bytes); ++blk) {
          uint8_t* p = bytes.data() + blk * static_cast<size_t>(block_bytes);
          for (int64_t i = 0; i < block_bytes; ++i) {
            bool is_f16 = false;
            for (int o : f16_at) is_f16 = is_f16 || (i == o || i == o + 1);
            if (!is_f16) p[i] = fill;
          }
        }
        const LanesWeights p = pack_lanes(WeightMatrix{type, bytes.data(), n_rows, k});
        const WeightMatrix w{type, bytes.data(), n_rows, k, p.data()};
        const int64_t row_bytes = static_cast<int64_t>(bytes.size()) / n_rows;
        const ActFormat f = act_format_for(type);
        std::vector<uint8_t> act(act_row_bytes(f, k));
        // 1 and 3 tokens: every type's lanes kernel (decode); 9: the passes of several tokens (prefill:
        // q8_0's on AVX2, every type's on AVX-512)
        for (int64_t n_tokens : {1, 3, 9}) {
          for (float sign : {1.0f, -1.0f}) {
            std::vector<float> x(static_cast<size_t>(n_tokens * k), sign);
            const auto y = run_matmul(isa, w, x.data(), n_tokens, 1);
            quantize_act_row(f, x.data(), k, act.data());
            for (int64_t r = 0; r < n_rows; ++r) {
              const float want = vec_dot(isa, type, bytes.data() + r * row_bytes, act.data(), k);
              for (int64_t t = 0; t < n_tokens; ++t)
                ASSERT_EQ(std::bit_cast<uint32_t>(y[t * n_rows + r]), std::bit_cast<uint32_t>(want))
                    << isa_name(isa) << " " << ggml_type_name(type) << " fill=" << int{fill}
                    << " sign=" << sign << " tokens=" << n_tokens << " t=" << t << " r=" << r;
            }
          }
        }
      }
    }
  }
  if (kernels_run == 0) GTEST_SKIP() << "no ISA of this CPU has a lanes kernel";
}

TEST(WeightLanes, MatmulOverLanesHasVecDotBits) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t max_tokens = 67;
  int kernels_run = 0;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!isa_supported(isa)) continue;
    for (GgmlType type : kLanesTypes) {
      kernels_run += kernel_table(isa).lanes[static_cast<size_t>(type)] != nullptr ? 1 : 0;
      for (int64_t k : inner_sizes(type, true)) {
        for (int64_t n_rows : {5, 16, 37, 50}) {
          const auto bytes = test::random_weights(type, n_rows, k, rng);
          const LanesWeights p = pack_lanes(WeightMatrix{type, bytes.data(), n_rows, k});
          const WeightMatrix w{type, bytes.data(), n_rows, k, p.data()};
          const int64_t row_bytes = static_cast<int64_t>(bytes.size()) / n_rows;
          std::vector<float> x(static_cast<size_t>(max_tokens * k));  // [max_tokens, k]
          for (float& v : x) v = normal(rng);
          const ActFormat f = act_format_for(type);
          std::vector<uint8_t> act(act_row_bytes(f, k));
          for (int64_t n_tokens : {1, 2, 5, 33, 67}) {
            for (int threads : {1, 3}) {
              const auto y = run_matmul(isa, w, x.data(), n_tokens, threads);
              for (int64_t t = 0; t < n_tokens; ++t) {
                quantize_act_row(f, x.data() + t * k, k, act.data());
                for (int64_t r = 0; r < n_rows; ++r) {
                  const float want = vec_dot(isa, type, bytes.data() + r * row_bytes, act.data(), k);
                  ASSERT_EQ(std::bit_cast<uint32_t>(y[t * n_rows + r]), std::bit_cast<uint32_t>(want))
                      << isa_name(isa) << " " << ggml_type_name(type) << " k=" << k << " rows=" << n_rows
                      << " tokens=" << n_tokens << " threads=" << threads << " t=" << t << " r=" << r;
                }
              }
            }
          }
        }
      }
    }
  }
  if (kernels_run == 0)
    GTEST_SKIP() << "no ISA of this CPU has a lanes kernel: only the GGML-row fallback was checked";
}

// The AVX-512 vector table's lanes kernels called directly over one group (partial or whole) with
// 1 to 137 tokens: whole passes of several tokens (q6_K's in tiles of 128), then the one-token kernel
// for the rest. matmul
// reaches them through MatmulOverLanesHasVecDotBits on CPUs without AMX; on CPUs with AMX the best
// table's prefill takes the AMX tiles instead, so this test is what checks them there.
TEST(WeightLanes, Avx512VectorKernelsOverTokensHaveVecDotBits) {
  if (!isa_supported(Isa::kAvx512))
    GTEST_SKIP() << "this CPU has no AVX-512: its lanes kernels are not run here";
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const KernelTable& table = kernel_table(Isa::kAvx512, MatrixUnits::kVector);
  for (GgmlType type : kLanesTypes) {
    const LanesFn fn = table.lanes[static_cast<size_t>(type)];
    ASSERT_NE(fn, nullptr) << ggml_type_name(type);
    for (int64_t k : inner_sizes(type, false)) {
      for (int64_t n_rows : {16, 11}) {
        const auto bytes = test::random_weights(type, n_rows, k, rng);
        const LanesWeights p = pack_lanes(WeightMatrix{type, bytes.data(), n_rows, k});
        const int64_t row_bytes = static_cast<int64_t>(bytes.size()) / n_rows;
        const ActFormat f = act_format_for(type);
        const auto act_bytes = static_cast<int64_t>(act_row_bytes(f, k));
        const int64_t max_tokens = 137;
        std::vector<uint8_t> act(static_cast<size_t>(act_bytes * max_tokens));  // [max_tokens, act_bytes]
        std::vector<float> x(static_cast<size_t>(k));
        for (int64_t t = 0; t < max_tokens; ++t) {
          for (float& v : x) v = normal(rng);
          quantize_act_row(f, x.data(), k, act.data() + t * act_bytes);
        }
        for (int64_t n_tokens : {1, 7, 8, 9, 16, 19, 137}) {
          std::vector<float> y(static_cast<size_t>(n_tokens * kLaneRows), -1.0f);  // [n_tokens, kLaneRows]
          fn(p.data(), act.data(), act_bytes, n_tokens, k, y.data(), kLaneRows, static_cast<int>(n_rows));
          for (int64_t t = 0; t < n_tokens; ++t) {
            for (int64_t r = 0; r < kLaneRows; ++r) {
              const float got = y[static_cast<size_t>(t * kLaneRows + r)];
              if (r >= n_rows) {  // rows past the group's real ones are not stored
                ASSERT_EQ(got, -1.0f) << ggml_type_name(type) << " t=" << t << " r=" << r;
                continue;
              }
              const float want =
                  vec_dot(Isa::kAvx512, type, bytes.data() + r * row_bytes, act.data() + t * act_bytes, k);
              ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want))
                  << ggml_type_name(type) << " k=" << k << " rows=" << n_rows << " tokens=" << n_tokens
                  << " t=" << t << " r=" << r;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::cpu
