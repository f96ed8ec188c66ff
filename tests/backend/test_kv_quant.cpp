// KIVI quantisers: round-trip error within half a quantisation step per element, keys grouped per
// channel over key_group tokens (a group's bytes and parameters only), values per token, every ISA's
// dequantiser giving the scalar one's bits, and the formats that cannot work refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/kv_quant.h"
#include "core/error.h"
#include "core/half.h"

namespace kvtier::cpu {
namespace {

// [n, d] f16 rows: normal values, channel 3 an outlier channel (x 20), channel 5 constant.
std::vector<uint16_t> random_rows(int64_t n, int64_t d, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> v(static_cast<size_t>(n * d));
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < d; ++i) {
      float x = normal(rng);
      if (i == 3) x *= 20.0f;
      if (i == 5) x = 0.75f;
      v[static_cast<size_t>(t * d + i)] = f32_to_f16(x);
    }
  }
  return v;
}

struct Quantised {
  KiviFormat f;
  int64_t d;
  std::vector<uint8_t> k, v;  // one block each
};

Quantised quantise_block(int bits, int64_t bt, int64_t group, int64_t d, const std::vector<uint16_t>& rows) {
  Quantised q{kivi_format(bits, bt, group, d, d), d, {}, {}};
  q.k.assign(kivi_block_bytes(q.f, KiviPlane::kKey, d), 0);
  q.v.assign(kivi_block_bytes(q.f, KiviPlane::kValue, d), 0);
  for (int64_t g = 0; g < bt / group; ++g)
    kivi_quantize_keys(q.f, d, rows.data() + g * group * d, d, g, q.k.data());
  kivi_quantize_values(q.f, d, rows.data(), d, 0, bt, q.v.data());
  return q;
}

// The step of element (t, i): its group's scale.
float key_scale(const Quantised& q, int64_t t, int64_t i) {
  const KiviBlockParts b = kivi_block_parts(q.f, KiviPlane::kKey, q.d);
  return f16_to_f32(
      reinterpret_cast<const uint16_t*>(q.k.data() + b.data_bytes)[(t / q.f.key_group) * q.d + i]);
}
float value_scale(const Quantised& q, int64_t t, int64_t i) {
  const KiviBlockParts b = kivi_block_parts(q.f, KiviPlane::kValue, q.d);
  return f16_to_f32(
      reinterpret_cast<const uint16_t*>(q.v.data() + b.data_bytes)[t * b.param_row + i / q.f.value_group]);
}

TEST(KiviQuant, RoundTripWithinHalfAStep) {
  std::mt19937 rng(11);
  for (int bits : {4, 2}) {
    for (int64_t d : {16, 64, 256}) {
      for (int64_t group : {16, 32, 128}) {
        const int64_t bt = 256;
        const auto rows = random_rows(bt, d, rng);
        const Quantised q = quantise_block(bits, bt, group, d, rows);
        std::vector<float> k(static_cast<size_t>(bt * d)), v(k.size());
        kivi_dequant_ref(q.f, KiviPlane::kKey, d, q.k.data(), 0, bt, k.data());
        kivi_dequant_ref(q.f, KiviPlane::kValue, d, q.v.data(), 0, bt, v.data());
        double worst_k = 0, worst_v = 0;
        for (int64_t t = 0; t < bt; ++t) {
          for (int64_t i = 0; i < d; ++i) {
            const float x = f16_to_f32(rows[static_cast<size_t>(t * d + i)]);
            const float ek = std::fabs(k[static_cast<size_t>(t * d + i)] - x);
            const float ev = std::fabs(v[static_cast<size_t>(t * d + i)] - x);
            const float sk = key_scale(q, t, i), sv = value_scale(q, t, i);
            // Half a step, plus the rounding of the f32 arithmetic (a few ulp of |x|).
            ASSERT_LE(ek, sk / 2 * (1 + 1e-5f) + 4e-7f * std::fabs(x))
                << bits << " bits d=" << d << " t=" << t << " i=" << i;
            ASSERT_LE(ev, sv / 2 * (1 + 1e-5f) + 4e-7f * std::fabs(x))
                << bits << " bits d=" << d << " t=" << t << " i=" << i;
            if (i == 5) {
              ASSERT_EQ(k[static_cast<size_t>(t * d + i)], 0.75f) << "a constant channel is exact";
            }
            worst_k = std::max<double>(worst_k, ek / std::max(sk, 1e-30f));
            worst_v = std::max<double>(worst_v, ev / std::max(sv, 1e-30f));
          }
        }
        // Not vacuous: rounding does reach close to half a step somewhere.
        EXPECT_GT(worst_k, 0.4);
        EXPECT_GT(worst_v, 0.4);
      }
    }
  }
}

TEST(KiviQuant, KeysArePerChannelPerGroupValuesPerToken) {
  std::mt19937 rng(12);
  const int64_t bt = 64, group = 16, d = 32;
  auto rows = random_rows(bt, d, rng);
  const Quantised a = quantise_block(4, bt, group, d, rows);
  // An outlier in token 20 (group 1), channel 7: only group 1's channel 7 keys, and token 20's values,
  // change.
  rows[20 * d + 7] = f32_to_f16(500.0f);
  const Quantised b = quantise_block(4, bt, group, d, rows);
  std::vector<float> ka(bt * d), kb(bt * d), va(bt * d), vb(bt * d);
  kivi_dequant_ref(a.f, KiviPlane::kKey, d, a.k.data(), 0, bt, ka.data());
  kivi_dequant_ref(b.f, KiviPlane::kKey, d, b.k.data(), 0, bt, kb.data());
  kivi_dequant_ref(a.f, KiviPlane::kValue, d, a.v.data(), 0, bt, va.data());
  kivi_dequant_ref(b.f, KiviPlane::kValue, d, b.v.data(), 0, bt, vb.data());
  int changed = 0;
  for (int64_t t = 0; t < bt; ++t) {
    for (int64_t i = 0; i < d; ++i) {
      const size_t e = static_cast<size_t>(t * d + i);
      const bool key_group_of_outlier = t / group == 1 && i == 7;
      if (!key_group_of_outlier) {
        EXPECT_EQ(ka[e], kb[e]) << "key t=" << t << " i=" << i;
      } else if (t != 20) {
        changed += ka[e] != kb[e];  // shares the outlier's channel range
      }
      const bool value_group_of_outlier = t == 20 && i / a.f.value_group == 7 / a.f.value_group;
      if (!value_group_of_outlier) {
        EXPECT_EQ(va[e], vb[e]) << "value t=" << t << " i=" << i;
      }
    }
  }
  EXPECT_GT(changed, group / 2) << "the outlier's group shares its channel range";
}

TEST(KiviQuant, AKeyGroupWritesOnlyItsRowsAndParameters) {
  std::mt19937 rng(13);
  const int64_t bt = 128, group = 32, d = 64;
  const auto rows = random_rows(bt, d, rng);
  const KiviFormat f = kivi_format(2, bt, group, d, d);
  const KiviBlockParts b = kivi_block_parts(f, KiviPlane::kKey, d);
  std::vector<uint8_t> block(kivi_block_bytes(f, KiviPlane::kKey, d), 0xAB);
  kivi_quantize_keys(f, d, rows.data() + 2 * group * d, d, 2, block.data());
  for (size_t i = 0; i < block.size(); ++i) {
    const bool data = i >= 2 * group * b.row_bytes && i < 3 * group * b.row_bytes;
    const size_t p = (i - b.data_bytes) / 2;  // parameter index (scales, then mins)
    const bool param = i >= b.data_bytes && (p % b.param_count) / d == 2;
    if (!data && !param) {
      ASSERT_EQ(block[i], 0xAB) << "byte " << i << " outside group 2";
    }
  }
  std::vector<uint16_t> vrows(3 * d);
  std::copy(rows.begin(), rows.begin() + 3 * d, vrows.begin());
  std::vector<uint8_t> vblock(kivi_block_bytes(f, KiviPlane::kValue, d), 0xCD);
  kivi_quantize_values(f, d, vrows.data(), d, 5, 3, vblock.data());
  const KiviBlockParts bv = kivi_block_parts(f, KiviPlane::kValue, d);
  for (size_t i = 0; i < vblock.size(); ++i) {
    const bool data = i >= 5 * bv.row_bytes && i < 8 * bv.row_bytes;
    const size_t p = (i - bv.data_bytes) / 2;
    const size_t t = (p % bv.param_count) / static_cast<size_t>(bv.param_row);
    const bool param = i >= bv.data_bytes && t >= 5 && t < 8;
    if (!data && !param) {
      ASSERT_EQ(vblock[i], 0xCD) << "byte " << i << " outside value rows 5..7";
    }
  }
}

TEST(KiviQuant, EveryIsaDequantisesToTheScalarBits) {
  std::mt19937 rng(14);
  for (int bits : {4, 2}) {
    for (int64_t d : {16, 48, 64, 256}) {
      const int64_t bt = 64;
      const Quantised q = quantise_block(bits, bt, 32, d, random_rows(bt, d, rng));
      for (KiviPlane p : {KiviPlane::kKey, KiviPlane::kValue}) {
        const auto& block = p == KiviPlane::kKey ? q.k : q.v;
        std::vector<float> ref(static_cast<size_t>(bt * d));
        kivi_dequant_ref(q.f, p, d, block.data(), 0, bt, ref.data());
        for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
          if (!isa_supported(isa)) continue;
          // Rows 7..40: a start and length off every group and vector boundary.
          std::vector<float> got(static_cast<size_t>(34 * d));
          kivi_dequant_fn(isa)(q.f, p, d, block.data(), 7, 34, got.data());
          ASSERT_EQ(std::memcmp(got.data(), ref.data() + 7 * d, got.size() * sizeof(float)), 0)
              << isa_name(isa) << " bits=" << bits << " d=" << d << (p == KiviPlane::kKey ? " K" : " V");
        }
      }
    }
  }
}

TEST(KiviQuant, FormatsThatCannotWorkAreRefused) {
  EXPECT_THROW(kivi_format(3, 256, 32, 64, 64), Error);
  EXPECT_THROW(kivi_format(4, 256, 48, 64, 64), Error);  // 48 does not divide 256: a group would straddle
  EXPECT_THROW(kivi_format(4, 256, 0, 64, 64), Error);
  EXPECT_THROW(kivi_format(2, 256, 32, 40, 64), Error);  // head dimension not a multiple of 16
  EXPECT_EQ(kivi_format(4, 256, 32, 64, 48).value_group, 48);
  EXPECT_EQ(kivi_format(4, 256, 32, 64, 256).value_group, 32);
  // Bytes: 4 bits + f16 scale and min per (group, channel) / (token, channel group).
  const KiviFormat f = kivi_format(4, 256, 32, 64, 64);
  EXPECT_EQ(kivi_block_bytes(f, KiviPlane::kKey, 64), 256u * 32 + 2 * (8 * 64) * 2);
  EXPECT_EQ(kivi_block_bytes(f, KiviPlane::kValue, 64), 256u * 32 + 2 * (256 * 2) * 2);
}

}  // namespace
}  // namespace kvtier::cpu
