#include "backend/cpu/attention_mass.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace kvtier::cpu {

void accumulate_key_mass(ThreadPool& pool, Isa isa, const AttnParams& p, const AttnQueries& q,
                         const KvSpan& span, const float* lse, int64_t lse_stride, float* mass,
                         int64_t mass_stride) {
  const int64_t G = p.q_per_kv;
  const int64_t dk = p.head_dim_k;
  KVTIER_ASSERT(dk <= kMassMaxHeadDim && G <= kMassMaxGroup && q.n_heads % G == 0,
                "key mass for head size {} and {} query heads per KV head", dk, G);
  const AttnTileOps& ops = isa == Isa::kScalar ? attn_tile_ops_ref()
                           : isa == Isa::kAvx2 ? attn_tile_ops_avx2()
                                               : attn_tile_ops_avx512();
  const int64_t n_kv = q.n_heads / G;
  pool.run(static_cast<int>(std::min<int64_t>(n_kv, pool.size())), [&](int part) {
    float kt[kAttnTile * kMassMaxHeadDim];  // one tile of keys as f32
    float s[kMassMaxGroup * kAttnTile];     // scores of the group's query heads
    for (int64_t h = part; h < n_kv; h += pool.size()) {
      float* mh = mass + h * mass_stride;
      for (int64_t a = 0; a < span.n_tokens; a += kAttnTile) {
        const int64_t n = std::min(kAttnTile, span.n_tokens - a);
        const float* k = nullptr;
        if (p.kv_dtype == KvDtype::kF32) {
          k = static_cast<const float*>(span.k) + h * span.k_head_stride + a * dk;
        } else {
          ops.f16_to_f32(static_cast<const uint16_t*>(span.k) + h * span.k_head_stride + a * dk, n * dk, kt);
          k = kt;
        }
        for (int64_t t = 0; t < q.n_tokens; ++t) {
          const int64_t qpos = q.pos0 + t;
          int64_t lo = span.pos0 + a;
          const int64_t hi = std::min(span.pos0 + a + n, qpos + 1);  // causal
          if (p.window > 0) lo = std::max(lo, qpos - p.window + 1);
          if (lo >= hi) continue;
          const int64_t nk = hi - lo;
          const int64_t off = lo - (span.pos0 + a);
          ops.scores(q.q + t * q.token_stride + h * G * dk, dk, G, k + off * dk, nk, dk, s);
          for (int64_t g = 0; g < G; ++g) {
            const float l = lse[t * lse_stride + h * G + g];
            if (l == -std::numeric_limits<float>::infinity()) continue;
            for (int64_t j = 0; j < nk; ++j) {
              float x = s[g * nk + j] * p.scale;
              if (p.softcap > 0.0f) x = p.softcap * std::tanh(x / p.softcap);
              mh[a + off + j] += std::exp(x - l);
            }
          }
        }
      }
    }
  });
}

}  // namespace kvtier::cpu
