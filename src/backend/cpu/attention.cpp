// Driver of the blocked attention: work items, tiles, masking and the online softmax. The per-ISA
// tile kernels (dot products, accumulation, exp) come from attention_ref.cpp / attention_avx2.cpp.
#include "backend/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/half.h"

namespace kvtier::cpu {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

size_t align64(size_t n) {
  return (n + 63) & ~size_t{63};
}

// Per-thread scratch carved from the caller's buffer.
struct Scratch {
  float* kt;   // [kAttnTile, head_dim_k] f32: K tile converted
  float* vt;   // [kAttnTile, head_dim_v] f32: V tile converted
  float* s;    // [q_per_kv, kAttnTile] f32: scores, then probabilities (rows nk apart)
  float* m;    // [kAttnQueryTile * q_per_kv] f32: running max
  float* l;    // [kAttnQueryTile * q_per_kv] f32: running sum
  float* acc;  // [kAttnQueryTile * q_per_kv, head_dim_v] f32: running numerator
};

size_t scratch_per_thread(const AttnParams& p) {
  const auto rows = static_cast<size_t>(kAttnQueryTile * p.q_per_kv);
  const auto dk = static_cast<size_t>(p.head_dim_k);
  const auto dv = static_cast<size_t>(p.head_dim_v);
  return align64(kAttnTile * dk * 4) + align64(kAttnTile * dv * 4) +
         align64(static_cast<size_t>(kAttnTile * p.q_per_kv) * 4) + 2 * align64(rows * 4) +
         align64(rows * dv * 4);
}

Scratch carve(uint8_t* base, const AttnParams& p) {
  const auto rows = static_cast<size_t>(kAttnQueryTile * p.q_per_kv);
  const auto dk = static_cast<size_t>(p.head_dim_k);
  const auto dv = static_cast<size_t>(p.head_dim_v);
  Scratch s{};
  auto take = [&](size_t bytes) {
    auto* f = reinterpret_cast<float*>(base);
    base += align64(bytes);
    return f;
  };
  s.kt = take(kAttnTile * dk * 4);
  s.vt = take(kAttnTile * dv * 4);
  s.s = take(static_cast<size_t>(kAttnTile * p.q_per_kv) * 4);
  s.m = take(rows * 4);
  s.l = take(rows * 4);
  s.acc = take(rows * dv * 4);
  return s;
}

// Rows [first, first + n) of head `h` of a span as f32: a pointer into the span (f32) or into `tmp`.
const float* rows_f32(const AttnTileOps& ops, KvDtype dt, const void* base, int64_t head_stride, int64_t h,
                      int64_t first, int64_t n, int64_t d, float* tmp) {
  const int64_t off = h * head_stride + first * d;
  if (dt == KvDtype::kF32) return static_cast<const float*>(base) + off;
  ops.f16_to_f32(static_cast<const uint16_t*>(base) + off, n * d, tmp);
  return tmp;
}

struct Item {
  int64_t kv_head;
  int64_t t0, t1;  // query tokens
};

void run_item(const AttnTileOps& ops, const AttnParams& p, const AttnQueries& q,
              std::span<const KvSpan> spans, const AttnOutput& out, const Item& it, const Scratch& sc) {
  const int64_t G = p.q_per_kv;
  const int64_t dk = p.head_dim_k;
  const int64_t dv = p.head_dim_v;
  const int64_t n_rows = (it.t1 - it.t0) * G;
  std::fill(sc.m, sc.m + n_rows, kNegInf);
  std::fill(sc.l, sc.l + n_rows, 0.0f);
  std::fill(sc.acc, sc.acc + n_rows * dv, 0.0f);
  const int64_t qpos_lo = q.pos0 + it.t0;
  const int64_t qpos_hi = q.pos0 + it.t1 - 1;

  for (const KvSpan& span : spans) {
    const int64_t span_end = span.pos0 + span.n_tokens;
    int64_t a = span.pos0;
    while (a < span_end) {
      const int64_t b = std::min(span_end, (a / kAttnTile + 1) * kAttnTile);  // tile [a, b)
      const int64_t tile_a = a;
      a = b;
      if (tile_a > qpos_hi) break;                                  // causal: no query sees it
      if (p.window > 0 && qpos_lo - (b - 1) >= p.window) continue;  // all keys out of every window
      const int64_t n = b - tile_a;
      const float* kt =
          rows_f32(ops, p.kv_dtype, span.k, span.k_head_stride, it.kv_head, tile_a - span.pos0, n, dk, sc.kt);
      const float* vt =
          rows_f32(ops, p.kv_dtype, span.v, span.v_head_stride, it.kv_head, tile_a - span.pos0, n, dv, sc.vt);
      for (int64_t t = it.t0; t < it.t1; ++t) {
        const int64_t qpos = q.pos0 + t;
        int64_t lo = tile_a;
        const int64_t hi = std::min(b, qpos + 1);
        if (p.window > 0) lo = std::max(lo, qpos - p.window + 1);
        if (lo >= hi) continue;
        const int64_t nk = hi - lo;
        // The G query heads of this KV head: scores together, then each row's online-softmax
        // update, then the accumulation together (per row the same operations as one at a time).
        const int64_t r0 = (t - it.t0) * G;
        ops.scores(q.q + t * q.token_stride + it.kv_head * G * dk, dk, G, kt + (lo - tile_a) * dk, nk, dk,
                   sc.s);
        for (int64_t g = 0; g < G; ++g) {
          const int64_t r = r0 + g;
          float* sr = sc.s + g * nk;  // [nk]
          float mt = kNegInf;
          for (int64_t j = 0; j < nk; ++j) {
            float s = sr[j] * p.scale;
            if (p.softcap > 0.0f) s = p.softcap * std::tanh(s / p.softcap);
            sr[j] = s;
            mt = std::max(mt, s);
          }
          const float m_new = std::max(sc.m[r], mt);
          if (m_new != sc.m[r] && sc.m[r] != kNegInf) {
            const float c = std::exp(sc.m[r] - m_new);
            sc.l[r] *= c;
            ops.scale(sc.acc + r * dv, dv, c);
          }
          sc.m[r] = m_new;
          sc.l[r] += ops.exp_sum(sr, nk, m_new, sr);
        }
        ops.accumulate(sc.s, G, vt + (lo - tile_a) * dv, nk, dv, sc.acc + r0 * dv);
      }
    }
  }

  for (int64_t t = it.t0; t < it.t1; ++t) {
    for (int64_t g = 0; g < G; ++g) {
      const int64_t h = it.kv_head * G + g;
      const int64_t r = (t - it.t0) * G + g;
      float* o = out.o + t * out.token_stride + h * dv;
      float lse = kNegInf;
      if (sc.l[r] > 0.0f) {
        const float inv = 1.0f / sc.l[r];
        for (int64_t i = 0; i < dv; ++i) o[i] = sc.acc[r * dv + i] * inv;
        lse = sc.m[r] + std::log(sc.l[r]);
      } else {
        std::fill(o, o + dv, 0.0f);
      }
      if (out.lse != nullptr) out.lse[t * out.lse_stride + h] = lse;
    }
  }
}

}  // namespace

size_t kv_dtype_bytes(KvDtype t) {
  return t == KvDtype::kF32 ? 4 : 2;
}

size_t attention_scratch_bytes(const AttnParams& p, int pool_threads) {
  return scratch_per_thread(p) * static_cast<size_t>(std::max(1, pool_threads)) + 64;
}

void attend(ThreadPool& pool, Isa isa, const AttnParams& p, const AttnQueries& q,
            std::span<const KvSpan> spans, const AttnOutput& out, std::span<uint8_t> scratch) {
  KVTIER_ASSERT(p.q_per_kv >= 1 && q.n_heads % p.q_per_kv == 0, "{} query heads, {} per KV head", q.n_heads,
                p.q_per_kv);
  KVTIER_ASSERT(scratch.size() >= attention_scratch_bytes(p, pool.size()), "attention scratch of {} bytes",
                scratch.size());
  if (!isa_supported(isa)) fail(ErrorKind::kUnsupported, "this CPU lacks {}", isa_name(isa));
  if (q.n_tokens == 0) return;
  const AttnTileOps& ops = isa == Isa::kScalar ? attn_tile_ops_ref()
                           : isa == Isa::kAvx2 ? attn_tile_ops_avx2()
                                               : attn_tile_ops_avx512();
  const int64_t n_kv = q.n_heads / p.q_per_kv;
  const int64_t n_qt = (q.n_tokens + kAttnQueryTile - 1) / kAttnQueryTile;
  const int64_t n_items = n_kv * n_qt;
  const int n_parts = static_cast<int>(std::min<int64_t>(pool.size(), n_items));
  // 64-byte aligned base for the per-thread scratch.
  auto* base =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t{63});
  const size_t per = scratch_per_thread(p);
  pool.run(n_parts, [&](int part) {
    const Scratch sc = carve(base + per * static_cast<size_t>(part), p);
    const Range r = split_range(n_items, n_parts, part);
    for (int64_t i = r.begin; i < r.end; ++i) {
      const int64_t qt = i % n_qt;
      const Item it{i / n_qt, qt * kAttnQueryTile, std::min(q.n_tokens, (qt + 1) * kAttnQueryTile)};
      run_item(ops, p, q, spans, out, it, sc);
    }
  });
}

void merge_attention(float* o_a, float* lse_a, const float* o_b, const float* lse_b, int64_t n, int64_t dv) {
  for (int64_t r = 0; r < n; ++r) {
    const float la = lse_a[r];
    const float lb = lse_b[r];
    if (lb == kNegInf) continue;
    if (la == kNegInf) {
      std::memcpy(o_a + r * dv, o_b + r * dv, static_cast<size_t>(dv) * sizeof(float));
      lse_a[r] = lb;
      continue;
    }
    const float mx = std::max(la, lb);
    const float ea = std::exp(la - mx);
    const float eb = std::exp(lb - mx);
    const float sum = ea + eb;
    const float wa = ea / sum;
    const float wb = eb / sum;
    for (int64_t i = 0; i < dv; ++i) o_a[r * dv + i] = o_a[r * dv + i] * wa + o_b[r * dv + i] * wb;
    lse_a[r] = mx + std::log(sum);
  }
}

}  // namespace kvtier::cpu
