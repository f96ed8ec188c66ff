// Resident KV store: blocks keyed by (layer, group, token block), write/read-back through spans,
// f16 rounding, truncation, capacity and budget errors, ledger accounting.
#include <gtest/gtest.h>

#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "kv/resident_kv.h"

namespace kvtier::kv {
namespace {

KvGeometry geometry(KvDtype dt, uint32_t group_heads = 0) {
  KvGeometry g;
  g.n_head_kv = {4, 4, 2};
  g.head_dim_k = 8;
  g.head_dim_v = 4;
  g.block_tokens = 32;
  g.group_heads = group_heads;
  g.dtype = dt;
  return g;
}

float kval(int64_t layer, int64_t pos, int64_t h, int64_t i) {
  return static_cast<float>(layer * 1000 + pos) + 0.01f * static_cast<float>(h * 8 + i) + 0.001f;
}

TEST(ResidentKv, WriteThenReadBackThroughSpans) {
  for (KvDtype dt : {KvDtype::kF32, KvDtype::kF16}) {
    for (uint32_t gh : {0u, 1u, 2u}) {
      MemoryLedger ledger;
      ThreadPool pool(1);
      ResidentKv kv(geometry(dt, gh), 100, 8, ledger, pool, cpu::Isa::kScalar);
      for (uint32_t l = 0; l < 3; ++l) {
        const int64_t hk = kv.geometry().n_head_kv[l];
        int64_t pos = 0;
        for (int64_t n : {1, 40, 7, 52}) {  // chunks crossing block boundaries
          std::vector<float> k(static_cast<size_t>(n * hk * 8)), v(static_cast<size_t>(n * hk * 4));
          for (int64_t t = 0; t < n; ++t)
            for (int64_t h = 0; h < hk; ++h) {
              for (int64_t i = 0; i < 8; ++i)
                k[static_cast<size_t>((t * hk + h) * 8 + i)] = kval(l, pos + t, h, i);
              for (int64_t i = 0; i < 4; ++i)
                v[static_cast<size_t>((t * hk + h) * 4 + i)] = -kval(l, pos + t, h, i);
            }
          kv.write(l, pos, n, k.data(), v.data());
          pos += n;
        }
      }
      EXPECT_EQ(kv.length(), 100);
      std::vector<cpu::KvSpan> buf(static_cast<size_t>(kv.blocks_for(100)));
      for (uint32_t l = 0; l < 3; ++l) {
        const uint32_t g = kv.geometry().heads_per_group(l);
        for (uint32_t grp = 0; grp < kv.geometry().n_groups(l); ++grp) {
          const auto spans = kv.spans(l, grp, 100, buf);
          ASSERT_EQ(spans.size(), 4u);
          for (const auto& s : spans) {
            ASSERT_EQ(s.pos0 % 32, 0);
            for (int64_t t = 0; t < s.n_tokens; ++t)
              for (uint32_t hi = 0; hi < g; ++hi) {
                const int64_t h = grp * g + hi;
                for (int64_t i = 0; i < 8; ++i) {
                  const size_t at = static_cast<size_t>(hi * s.k_head_stride + t * 8 + i);
                  const float got = dt == KvDtype::kF32 ? static_cast<const float*>(s.k)[at]
                                                        : f16_to_f32(static_cast<const uint16_t*>(s.k)[at]);
                  const float want = kval(l, s.pos0 + t, h, i);
                  ASSERT_EQ(got, dt == KvDtype::kF32 ? want : f16_to_f32(f32_to_f16(want)));
                }
                const size_t at = static_cast<size_t>(hi * s.v_head_stride + t * 4 + 3);
                const float got = dt == KvDtype::kF32 ? static_cast<const float*>(s.v)[at]
                                                      : f16_to_f32(static_cast<const uint16_t*>(s.v)[at]);
                const float want = -kval(l, s.pos0 + t, h, 3);
                ASSERT_EQ(got, dt == KvDtype::kF32 ? want : f16_to_f32(f32_to_f16(want)));
              }
          }
        }
      }
    }
  }
}

TEST(ResidentKv, TruncateReleasesBlocksAndCapacityIsEnforced) {
  MemoryLedger ledger;
  ThreadPool pool(1);
  ResidentKv kv(geometry(KvDtype::kF16), 64, 8, ledger, pool, cpu::Isa::kScalar);
  EXPECT_GT(ledger.current(Tier::kDevice, Category::kKv), 0u);
  std::vector<float> k(64 * 4 * 8, 1.0f), v(64 * 4 * 4, 1.0f);
  for (uint32_t l = 0; l < 3; ++l) kv.write(l, 0, 40, k.data(), v.data());
  EXPECT_EQ(kv.blocks_in_use(), 3u * 2u);  // one group per layer, two blocks each
  kv.truncate(10);
  EXPECT_EQ(kv.length(), 10);
  EXPECT_EQ(kv.blocks_in_use(), 3u);
  for (uint32_t l = 0; l < 3; ++l) kv.write(l, 10, 54, k.data(), v.data());
  EXPECT_THROW(kv.write(0, 64, 1, k.data(), v.data()), Error);
}

TEST(MemoryLedger, BudgetIsEnforcedWithAClearError) {
  MemoryLedger ledger;
  ledger.set_budget(Tier::kDevice, 1000);
  ledger.reserve(Tier::kDevice, Category::kWeights, 600);
  try {
    ledger.reserve(Tier::kDevice, Category::kKv, 500);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kBudget);
    EXPECT_NE(std::string(e.what()).find("device budget of 1000 bytes"), std::string::npos) << e.what();
  }
  {
    Reservation r(ledger, Tier::kDevice, Category::kScratch, 300);
    EXPECT_EQ(ledger.current(Tier::kDevice), 900u);
  }
  EXPECT_EQ(ledger.current(Tier::kDevice), 600u);
  EXPECT_EQ(ledger.peak(Tier::kDevice), 900u);
  EXPECT_EQ(ledger.peak(Tier::kDevice, Category::kScratch), 300u);
}

}  // namespace
}  // namespace kvtier::kv
