// Attention over KIVI spans: the tile loop dequantises each tile's quantised keys and values into
// its scratch (no f16 copy of the cache). Held bit-identical, on every ISA, to the reference that
// dequantises everything first and runs the f32 attention over the same span boundaries: one span
// over many blocks (the offloaded placements' staging planes) and one span per block (resident
// pools), quantised boundaries on and off tile and block boundaries, decode (chunk-parallel over
// threads) and prefill.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/kv_quant.h"
#include "core/half.h"
#include "core/thread_pool.h"

namespace kvtier::cpu {
namespace {

constexpr int64_t kBt = 256;

struct Case {
  int bits;
  int64_t n_ctx;    // keys [0, n_ctx)
  int64_t n_quant;  // keys [0, n_quant) quantised
  int64_t n_q;      // queries at positions [n_ctx - n_q, n_ctx)
};

struct Kivi {
  int64_t n_kv = 2, G = 3, dk = 64, dv = 32;
  KiviFormat f;
  int64_t n_ctx, n_blocks;
  uint64_t kb, vb;                 // block bytes of one head
  std::vector<uint16_t> k16, v16;  // [n_kv][n_ctx, d] f16 (the residual rows)
  std::vector<uint8_t> kq, vq;     // [n_kv][n_blocks] quantised blocks
  std::vector<float> kref, vref;   // [n_kv][n_ctx, d] f32: dequantised below n_quant, f16 above
  std::vector<float> q;            // [n_q, n_kv * G, dk]

  Kivi(const Case& c, uint64_t seed) : n_ctx(c.n_ctx) {
    f = kivi_format(c.bits, kBt, 32, dk, dv);
    n_blocks = (n_ctx + kBt - 1) / kBt;
    kb = kivi_block_bytes(f, KiviPlane::kKey, dk);
    vb = kivi_block_bytes(f, KiviPlane::kValue, dv);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int64_t i = 0; i < n_kv * n_ctx * dk; ++i)
      k16.push_back(f32_to_f16(nd(rng) * (i % dk == 5 ? 8 : 1)));
    for (int64_t i = 0; i < n_kv * n_ctx * dv; ++i) v16.push_back(f32_to_f16(nd(rng)));
    for (int64_t i = 0; i < c.n_q * n_kv * G * dk; ++i) q.push_back(nd(rng) * 0.3f);
    kq.assign(n_kv * n_blocks * kb, 0);
    vq.assign(n_kv * n_blocks * vb, 0);
    for (int64_t h = 0; h < n_kv; ++h) {
      for (int64_t g = 0; g * 32 < c.n_quant; ++g) {
        const int64_t b = g * 32 / kBt;
        uint8_t* kblk = kq.data() + (h * n_blocks + b) * kb;
        uint8_t* vblk = vq.data() + (h * n_blocks + b) * vb;
        const int64_t t0 = g * 32;
        const int64_t rows = std::min<int64_t>(32, n_ctx - t0);
        if (rows == 32)
          kivi_quantize_keys(f, dk, k16.data() + (h * n_ctx + t0) * dk, dk, (t0 % kBt) / 32, kblk);
        kivi_quantize_values(f, dv, v16.data() + (h * n_ctx + t0) * dv, dv, t0 % kBt, rows, vblk);
      }
    }
    // The reference rows.
    for (int64_t h = 0; h < n_kv; ++h) {
      for (int plane = 0; plane < 2; ++plane) {
        const int64_t d = plane == 0 ? dk : dv;
        std::vector<float>& out = plane == 0 ? kref : vref;
        const std::vector<uint16_t>& src = plane == 0 ? k16 : v16;
        for (int64_t t = 0; t < n_ctx; ++t) {
          std::vector<float> row(d);
          if (t < c.n_quant) {
            const uint8_t* blk = (plane == 0 ? kq.data() + (h * n_blocks + t / kBt) * kb
                                             : vq.data() + (h * n_blocks + t / kBt) * vb);
            kivi_dequant_ref(f, plane == 0 ? KiviPlane::kKey : KiviPlane::kValue, d, blk, t % kBt, 1,
                             row.data());
          } else {
            for (int64_t i = 0; i < d; ++i) row[i] = f16_to_f32(src[(h * n_ctx + t) * d + i]);
          }
          out.insert(out.end(), row.begin(), row.end());
        }
      }
    }
  }

  // One span per block (per_block) or one span over everything, KIVI (quant) or the f32 reference.
  std::vector<KvSpan> spans(bool per_block, bool quant, int64_t n_quant) const {
    std::vector<KvSpan> out;
    const int64_t step = per_block ? kBt : n_ctx;
    for (int64_t a = 0; a < n_ctx; a += step) {
      KvSpan s;
      s.pos0 = a;
      s.n_tokens = std::min(step, n_ctx - a);
      s.k_head_stride = n_ctx * dk;
      s.v_head_stride = n_ctx * dv;
      if (quant) {
        s.k = k16.data() + a * dk;
        s.v = v16.data() + a * dv;
        s.n_quant = std::clamp<int64_t>(n_quant - a, 0, s.n_tokens);
        s.q_base = a;
        s.kq = kq.data() + (a / kBt) * kb;
        s.vq = vq.data() + (a / kBt) * vb;
        s.kq_head_stride = static_cast<int64_t>(n_blocks * kb);
        s.vq_head_stride = static_cast<int64_t>(n_blocks * vb);
        s.kq_block_stride = static_cast<int64_t>(kb);
        s.vq_block_stride = static_cast<int64_t>(vb);
      } else {
        s.k = kref.data() + a * dk;
        s.v = vref.data() + a * dv;
      }
      out.push_back(s);
    }
    return out;
  }
};

TEST(AttentionKivi, TileDequantisationMatchesDequantisingFirst) {
  const Case cases[] = {
      {4, 700, 512, 1},  {4, 700, 512, 37}, {2, 700, 448, 1},
      {2, 700, 416, 16}, {4, 600, 600, 3},  // all quantised (the last group partial: values only)
      {4, 300, 0, 5},                       // none
      {2, 530, 270, 1},                     // boundary off the tiles (a tile of both kinds)
  };
  ThreadPool pool(3);
  uint64_t seed = 1;
  for (const Case& c : cases) {
    const Kivi kv(c, seed++);
    AttnParams p;
    p.head_dim_k = kv.dk;
    p.head_dim_v = kv.dv;
    p.q_per_kv = kv.G;
    p.scale = 0.125f;
    const int64_t nh = kv.n_kv * kv.G;
    AttnQueries aq{kv.q.data(), nh * kv.dk, c.n_q, nh, c.n_ctx - c.n_q};
    for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (!isa_supported(isa)) continue;
      for (bool per_block : {false, true}) {
        for (int64_t window : {0, 200}) {
          p.window = window;
          AttnParams pq = p;
          pq.kv_dtype = KvDtype::kF16;
          pq.kivi = kv.f;
          AttnParams pr = p;
          pr.kv_dtype = KvDtype::kF32;
          std::vector<float> o(static_cast<size_t>(c.n_q * nh * kv.dv)), o_ref(o.size());
          std::vector<float> lse(static_cast<size_t>(c.n_q * nh)), lse_ref(lse.size());
          std::vector<uint8_t> scratch(attention_scratch_bytes(p, pool.size()));
          const auto sq = kv.spans(per_block, true, c.n_quant);
          const auto sr = kv.spans(per_block, false, c.n_quant);
          attend(pool, isa, pq, aq, sq, {o.data(), nh * kv.dv, lse.data(), nh}, scratch);
          attend(pool, isa, pr, aq, sr, {o_ref.data(), nh * kv.dv, lse_ref.data(), nh}, scratch);
          ASSERT_EQ(std::memcmp(o.data(), o_ref.data(), o.size() * 4), 0)
              << isa_name(isa) << " bits=" << c.bits << " ctx=" << c.n_ctx << " quant=" << c.n_quant
              << " q=" << c.n_q << " per_block=" << per_block << " window=" << window;
          ASSERT_EQ(std::memcmp(lse.data(), lse_ref.data(), lse.size() * 4), 0);
        }
      }
    }
  }
}

// Quantisation does change the result (the test above is not comparing f16 with f16).
TEST(AttentionKivi, QuantisedKeysChangeTheOutput) {
  const Case c{2, 700, 512, 1};
  const Kivi kv(c, 99);
  ThreadPool pool(1);
  AttnParams p;
  p.head_dim_k = kv.dk;
  p.head_dim_v = kv.dv;
  p.q_per_kv = kv.G;
  p.kivi = kv.f;
  const int64_t nh = kv.n_kv * kv.G;
  AttnQueries aq{kv.q.data(), nh * kv.dk, 1, nh, c.n_ctx - 1};
  std::vector<float> o(static_cast<size_t>(nh * kv.dv)), o16(o.size());
  std::vector<uint8_t> scratch(attention_scratch_bytes(p, 1));
  attend(pool, Isa::kScalar, p, aq, kv.spans(false, true, c.n_quant), {o.data(), nh * kv.dv, nullptr, 0},
         scratch);
  attend(pool, Isa::kScalar, p, aq, kv.spans(false, true, 0), {o16.data(), nh * kv.dv, nullptr, 0}, scratch);
  double diff = 0;
  for (size_t i = 0; i < o.size(); ++i) diff = std::max<double>(diff, std::fabs(o[i] - o16[i]));
  EXPECT_GT(diff, 1e-3);
  EXPECT_TRUE(std::isfinite(diff));
}

}  // namespace
}  // namespace kvtier::cpu
