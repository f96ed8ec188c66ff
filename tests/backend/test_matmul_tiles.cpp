// The register-blocked matmul tiles (kernels.h TileFn). Invariant the engine relies on: an output
// depends only on its weight row and its token, never on how many tokens share the call, on the
// tiling or on the thread count. The tiles keep vec_dot's arithmetic, so additionally every output
// equals vec_dot of the same ISA bit for bit, and lies within test_vec_dot.cpp's bound of the scalar
// reference. Shapes: odd row counts (partial 16-row split units and partial register tiles), odd
// token counts (partial 32-token tiles and partial register tiles), odd block counts (AVX-512's
// 256-bit tail block), float sizes off every vector width and past one k chunk; 1..4 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "backend/cpu/act_panel.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/quantize_act.h"
#include "random_weights.h"

namespace kvtier::cpu {
namespace {

constexpr double kU = 1.0 / (1 << 24);

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

using test::run_matmul;

TEST(MatmulTiles, OutputIndependentOfBatchThreadsAndTiling) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t max_tokens = 67;
  for (GgmlType type : test::all_weight_types()) {
    const int64_t bs = ggml_traits(type).block_size;
    for (int64_t k : bs == 1 ? std::vector<int64_t>{75, 2100}
                             : std::vector<int64_t>{3 * bs, 4 * bs, bs == 32 ? 37 * bs : 2 * bs}) {
      for (int64_t n_rows : {5, 37}) {
        const auto w_bytes = test::random_weights(type, n_rows, k, rng);
        const WeightMatrix w{type, w_bytes.data(), n_rows, k};
        const int64_t row_bytes = static_cast<int64_t>(w_bytes.size()) / n_rows;
        std::vector<float> x(static_cast<size_t>(max_tokens * k));  // [max_tokens, k]
        for (float& v : x) v = normal(rng);
        const ActFormat f = act_format_for(type);
        for (Isa isa : supported_isas()) {
          // Per token alone (1 token, 1 thread), plus the scalar reference and its error bound.
          std::vector<float> single(static_cast<size_t>(max_tokens * n_rows));  // [max_tokens, n_rows]
          for (int64_t t = 0; t < max_tokens; ++t) {
            const auto y1 = run_matmul(isa, w, x.data() + t * k, 1, 1);
            std::vector<uint8_t> act(act_row_bytes(f, k));
            quantize_act_row(f, x.data() + t * k, k, act.data());
            const std::vector<float> xt(x.begin() + t * k, x.begin() + (t + 1) * k);
            const auto a = test::act_values(f, act.data(), xt);
            for (int64_t r = 0; r < n_rows; ++r) {
              const uint8_t* wr = w_bytes.data() + r * row_bytes;
              single[t * n_rows + r] = y1[r];
              ASSERT_EQ(std::bit_cast<uint32_t>(y1[r]),
                        std::bit_cast<uint32_t>(vec_dot(isa, type, wr, act.data(), k)))
                  << ggml_type_name(type) << " " << isa_name(isa);
              std::vector<float> wd(static_cast<size_t>(k));
              dequantize_row(type, wr, wd.data(), k);
              const auto off = test::offset_terms(type, wr, k);
              double s = 0.0;
              for (int64_t i = 0; i < k; ++i)
                s += (std::fabs(wd[i]) + 2.0 * std::fabs(off[i])) * std::fabs(a[i]);
              const double n_terms = bs == 1 ? static_cast<double>(k + k / 32 + 24) : 3.0 * (k / bs) + 16.0;
              const float ref = vec_dot(Isa::kScalar, type, wr, act.data(), k);
              ASSERT_LE(std::fabs(static_cast<double>(y1[r]) - ref), n_terms * kU * s)
                  << ggml_type_name(type) << " " << isa_name(isa) << " r=" << r << " t=" << t;
            }
          }
          for (int64_t n_tokens : {2, 5, 7, 33, 43, 67}) {  // 43: 5 panel groups (not a multiple of 2 or 4)
            for (int threads = 1; threads <= 4; ++threads) {
              const auto y = run_matmul(isa, w, x.data(), n_tokens, threads);
              for (size_t i = 0; i < y.size(); ++i) {
                ASSERT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(single[i]))
                    << ggml_type_name(type) << " isa=" << isa_name(isa) << " k=" << k << " rows=" << n_rows
                    << " tokens=" << n_tokens << " threads=" << threads << " i=" << i;
              }
            }
          }
        }
      }
    }
  }
}

// The SIMD tables have tiles for the default models' types (else matmul silently falls back to one
// vec_dot per output), and a tile (regular, wide, one-token narrow or panel) called directly with a
// wider output stride writes only its block, bit-identical to vec_dot.
TEST(MatmulTiles, TablesHaveTilesAndTilesWriteOnlyTheirBlock) {
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const auto& [isa, units] :
       {std::pair{Isa::kAvx2, MatrixUnits::kBest}, std::pair{Isa::kAvx512, MatrixUnits::kBest},
        std::pair{Isa::kAvx512, MatrixUnits::kVector}}) {
    if (!isa_supported(isa)) continue;
    const KernelTable& table = kernel_table(isa, units);
    for (GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                          GgmlType::kQ5_1, GgmlType::kQ4_K, GgmlType::kQ6_K}) {
      const TileKernel regular = table.tile[static_cast<size_t>(type)];
      const PanelKernel panel = table.panel[static_cast<size_t>(type)];
      ASSERT_TRUE(regular.fn != nullptr || panel.fn != nullptr)
          << ggml_type_name(type) << " " << isa_name(isa);
      for (int groups = 1; panel.fn != nullptr && groups <= panel.groups; ++groups) {
        const ActFormat f = act_format_for(type);
        ASSERT_TRUE(has_act_panels(f)) << ggml_type_name(type);
        const int64_t k = 5 * ggml_traits(type).block_size;
        const auto w_bytes = test::random_weights(type, panel.rows, k, rng);
        const int64_t row_bytes = static_cast<int64_t>(w_bytes.size()) / panel.rows;
        const auto act_bytes = static_cast<int64_t>(act_row_bytes(f, k));
        const int n_tokens = groups * kPanelTokens;
        std::vector<uint8_t> act(static_cast<size_t>(act_bytes * n_tokens));  // [n_tokens, act_bytes]
        std::vector<float> x(static_cast<size_t>(k));
        for (int t = 0; t < n_tokens; ++t) {
          for (float& v : x) v = normal(rng);
          quantize_act_row(f, x.data(), k, act.data() + t * act_bytes);
        }
        const bool in_place = panel.layout == PanelLayout::kRows;
        const size_t group_bytes = in_place ? static_cast<size_t>(kPanelTokens * act_bytes)
                                            : act_panel_bytes(f, panel.layout, k, kPanelTokens);
        std::vector<uint8_t> packed(in_place ? act : std::vector<uint8_t>(group_bytes * groups));  // [groups]
        for (int g = 0; g < groups && !in_place; ++g)
          pack_act_panel(f, panel.layout, act.data() + g * kPanelTokens * act_bytes, act_bytes, k,
                         packed.data() + g * group_bytes);
        const int64_t ldy = panel.rows + 3;
        std::vector<float> y(static_cast<size_t>(ldy * n_tokens), 7.0f);  // [n_tokens, ldy]
        panel.fn(w_bytes.data(), row_bytes, packed.data(), static_cast<int64_t>(group_bytes), groups, k,
                 y.data(), ldy);
        for (int t = 0; t < n_tokens; ++t) {
          for (int64_t r = 0; r < ldy; ++r) {
            const float want = r < panel.rows ? vec_dot(isa, type, w_bytes.data() + r * row_bytes,
                                                        act.data() + t * act_bytes, k)
                                              : 7.0f;
            ASSERT_EQ(std::bit_cast<uint32_t>(y[t * ldy + r]), std::bit_cast<uint32_t>(want))
                << ggml_type_name(type) << " " << isa_name(isa) << " panel of " << groups << " groups t=" << t
                << " r=" << r;
          }
        }
      }
      const TileKernel wide = table.tile_wide[static_cast<size_t>(type)];
      const TileKernel narrow = table.tile_narrow[static_cast<size_t>(type)];
      for (const TileKernel& tile : {regular, wide, narrow}) {
        if (tile.fn == nullptr) continue;
        const int64_t bs = ggml_traits(type).block_size;
        const int64_t k = bs == 1 ? 96 : 5 * bs;
        const auto w_bytes = test::random_weights(type, tile.rows, k, rng);
        const int64_t row_bytes = static_cast<int64_t>(w_bytes.size()) / tile.rows;
        const ActFormat f = act_format_for(type);
        const int64_t act_bytes = static_cast<int64_t>(act_row_bytes(f, k));
        std::vector<uint8_t> act(static_cast<size_t>(act_bytes * tile.tokens));  // [tokens, act_bytes]
        std::vector<float> x(static_cast<size_t>(k));
        for (int t = 0; t < tile.tokens; ++t) {
          for (float& v : x) v = normal(rng);
          quantize_act_row(f, x.data(), k, act.data() + t * act_bytes);
        }
        const int64_t ldy = tile.rows + 3;
        std::vector<float> y(static_cast<size_t>(ldy * tile.tokens), 7.0f);  // [tokens, ldy]
        tile.fn(w_bytes.data(), row_bytes, act.data(), act_bytes, k, y.data(), ldy);
        for (int t = 0; t < tile.tokens; ++t) {
          for (int64_t r = 0; r < ldy; ++r) {
            const float want = r < tile.rows ? vec_dot(isa, type, w_bytes.data() + r * row_bytes,
                                                       act.data() + t * act_bytes, k)
                                             : 7.0f;
            ASSERT_EQ(std::bit_cast<uint32_t>(y[t * ldy + r]), std::bit_cast<uint32_t>(want))
                << ggml_type_name(type) << " " << isa_name(isa) << " tokens=" << tile.tokens << " t=" << t
                << " r=" << r;
          }
        }
      }
    }
  }
}

// On a CPU with AMX-INT8 (and Linux's grant of its tile state) the AVX-512 table takes the AMX tiles
// for the 4- and 5-bit legacy quants and q4_K / q6_K, and the vector-only table keeps the vector ones, so the
// tests above hold both to vec_dot. Elsewhere this says so and skips.
TEST(MatmulTiles, AvxTableTakesAmxTilesWhereTheCpuHasThem) {
  if (!uses_amx(Isa::kAvx512)) {
    GTEST_SKIP() << "this CPU has no AMX-INT8 (or Linux did not grant its tile state): the AMX tiles "
                    "(matmul_amx.cpp) are not tested on this machine";
  }
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ4_K,
                        GgmlType::kQ6_K}) {
    const size_t i = static_cast<size_t>(type);
    EXPECT_EQ(kernel_table(Isa::kAvx512).panel[i].layout, PanelLayout::kRows) << ggml_type_name(type);
    const PanelKernel vector = kernel_table(Isa::kAvx512, MatrixUnits::kVector).panel[i];
    EXPECT_TRUE(vector.fn == nullptr || vector.layout == PanelLayout::kGroups) << ggml_type_name(type);
  }
}

}  // namespace
}  // namespace kvtier::cpu
