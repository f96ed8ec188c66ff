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

// The chunk-parallel path (attend): calls of at most kSplitTokens query tokens; each thread holds up
// to kSlotsPerThread finished chunks of kSplitTokens * q_per_kv rows at once.
constexpr int64_t kSplitTokens = 4;
// Multiply-adds (keys x query heads x tokens x (dk + dv)) below which a sleeping pool's hand-off
// costs more than it saves (ThreadPool::threads_for; about 0.1-0.2 ms of work).
constexpr int64_t kSleepingPoolMinWork = int64_t{4} << 20;
constexpr int64_t kSlotsPerThread = 16;
static_assert(kSlotsPerThread * kSplitTokens >= kAttnQueryTile, "the slots hold one whole item's rows");
static_assert(2 * kSplitTokens <= kAttnQueryTile, "run_lse holds two split heads' rows");

// Per-thread scratch carved from the caller's buffer. R = kAttnQueryTile * q_per_kv query rows,
// S = kSplitTokens * q_per_kv.
struct Scratch {
  float* kt;        // [kAttnTile, head_dim_k] f32: K tile converted
  float* vt;        // [kAttnTile, head_dim_v] f32: V tile converted
  float* s;         // [q_per_kv, kAttnTile] f32: scores, then probabilities (rows nk apart)
  float* m;         // [R] f32: running max of the chunk being computed
  float* l;         // [R] f32: running sum
  float* acc;       // [R, head_dim_v] f32: running numerator
  float* run_lse;   // [R] f32: lse of the chunks merged so far (chunk-parallel: [2][S], two heads)
  float* part_o;    // [kSlotsPerThread][S, head_dim_v] f32: finished chunks' outputs (one item: [R, dv])
  float* part_lse;  // [kSlotsPerThread][S] f32: finished chunks' lse (one item: [R])
};

size_t rows_per_item(const AttnParams& p) {
  return static_cast<size_t>(kAttnQueryTile * p.q_per_kv);
}

size_t rows_per_slot(const AttnParams& p) {
  return static_cast<size_t>(kSplitTokens * p.q_per_kv);
}

size_t scratch_per_thread(const AttnParams& p) {
  const size_t rows = rows_per_item(p);
  const auto dk = static_cast<size_t>(p.head_dim_k);
  const auto dv = static_cast<size_t>(p.head_dim_v);
  const size_t slot_rows = static_cast<size_t>(kSlotsPerThread) * rows_per_slot(p);
  return align64(kAttnTile * dk * 4) + align64(kAttnTile * dv * 4) +
         align64(static_cast<size_t>(kAttnTile * p.q_per_kv) * 4) + 3 * align64(rows * 4) +
         align64(rows * dv * 4) + align64(slot_rows * dv * 4) + align64(slot_rows * 4);
}

Scratch carve(uint8_t* base, const AttnParams& p) {
  const size_t rows = rows_per_item(p);
  const auto dk = static_cast<size_t>(p.head_dim_k);
  const auto dv = static_cast<size_t>(p.head_dim_v);
  const size_t slot_rows = static_cast<size_t>(kSlotsPerThread) * rows_per_slot(p);
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
  s.run_lse = take(rows * 4);
  s.part_o = take(slot_rows * dv * 4);
  s.part_lse = take(slot_rows * 4);
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

// Rows [first, first + n) of head `h` of a span's K or V plane as f32, where the first span.n_quant
// tokens are KIVI blocks: those rows are dequantised into `tmp` block by block, the others converted
// after them. Without quantised rows, rows_f32.
const float* tile_rows(const AttnTileOps& ops, const AttnParams& p, const KvSpan& span, KiviPlane plane,
                       int64_t h, int64_t first, int64_t n, float* tmp) {
  const bool key = plane == KiviPlane::kKey;
  const int64_t d = key ? p.head_dim_k : p.head_dim_v;
  const void* rows = key ? span.k : span.v;
  const int64_t stride = key ? span.k_head_stride : span.v_head_stride;
  const int64_t nq = std::clamp<int64_t>(span.n_quant - first, 0, n);
  if (nq == 0) return rows_f32(ops, p.kv_dtype, rows, stride, h, first, n, d, tmp);
  const int64_t bt = p.kivi.block_tokens;
  const uint8_t* head = (key ? span.kq : span.vq) + h * (key ? span.kq_head_stride : span.vq_head_stride);
  const int64_t block_stride = key ? span.kq_block_stride : span.vq_block_stride;
  for (int64_t r = 0; r < nq;) {
    const int64_t off = span.pos0 + first + r - span.q_base;
    const int64_t m = std::min(nq - r, bt - off % bt);
    ops.kivi_dequant(p.kivi, plane, d, head + (off / bt) * block_stride, off % bt, m, tmp + r * d);
    r += m;
  }
  if (nq < n) {
    ops.f16_to_f32(static_cast<const uint16_t*>(rows) + h * stride + (first + nq) * d, (n - nq) * d,
                   tmp + nq * d);
  }
  return tmp;
}

// The query rows of one work item: query heads [g0, g0 + ng) of KV head `kv_head`'s q_per_kv heads
// (all of them unless decode splits a group between threads) for query tokens [t0, t1). Row
// r = (t - t0) * ng + (g - g0). A row's arithmetic does not depend on the item's other rows.
struct Item {
  int64_t kv_head;
  int64_t t0, t1;  // query tokens
  int64_t g0, ng;  // query heads within the group
};

// The first query head of an item: its index among all query heads.
int64_t first_head(const AttnParams& p, const Item& it) {
  return it.kv_head * p.q_per_kv + it.g0;
}

// One chunk's attention for an item: the online softmax over the keys of the spans in [lo, hi),
// from a fresh state, finished into o ([rows, dv]) and lse ([rows]); rows that see no key get o = 0
// and lse = -inf. `first_span` is the index of the first span ending after lo.
void run_chunk(const AttnTileOps& ops, const AttnParams& p, const AttnQueries& q,
               std::span<const KvSpan> spans, size_t first_span, const Item& it, int64_t lo, int64_t hi,
               const Scratch& sc, float* o_part, float* lse_part) {
  const int64_t G = it.ng;
  const int64_t dk = p.head_dim_k;
  const int64_t dv = p.head_dim_v;
  const int64_t n_rows = (it.t1 - it.t0) * G;
  std::fill(sc.m, sc.m + n_rows, kNegInf);
  std::fill(sc.l, sc.l + n_rows, 0.0f);
  std::fill(sc.acc, sc.acc + n_rows * dv, 0.0f);
  const int64_t qpos_lo = q.pos0 + it.t0;
  const int64_t qpos_hi = q.pos0 + it.t1 - 1;

  for (size_t si = first_span; si < spans.size() && spans[si].pos0 < hi; ++si) {
    const KvSpan& span = spans[si];
    const int64_t span_end = std::min(hi, span.pos0 + span.n_tokens);
    int64_t a = std::max(lo, span.pos0);
    bool past_queries = false;
    while (a < span_end) {
      const int64_t b = std::min(span_end, (a / kAttnTile + 1) * kAttnTile);  // tile [a, b)
      const int64_t tile_a = a;
      a = b;
      if (tile_a > qpos_hi) {  // causal: no query sees it, nor anything after it
        past_queries = true;
        break;
      }
      if (p.window > 0 && qpos_lo - (b - 1) >= p.window) continue;  // all keys out of every window
      const int64_t n = b - tile_a;
      // For one or two query tokens (decode), f16 rows without KIVI blocks are read in place by the
      // f16 kernels (converted in registers); otherwise the tile is converted once into f32 for all
      // the item's tokens (f32 rows in place, KIVI rows dequantised). Same values either way.
      const bool f16_rows =
          p.kv_dtype == KvDtype::kF16 && it.t1 - it.t0 <= 2 && span.n_quant <= tile_a - span.pos0;
      const float* kt = nullptr;
      const float* vt = nullptr;
      const uint16_t* kh = nullptr;  // [n, dk] f16
      const uint16_t* vh = nullptr;  // [n, dv] f16
      if (f16_rows) {
        kh = static_cast<const uint16_t*>(span.k) + it.kv_head * span.k_head_stride +
             (tile_a - span.pos0) * dk;
        vh = static_cast<const uint16_t*>(span.v) + it.kv_head * span.v_head_stride +
             (tile_a - span.pos0) * dv;
      } else {
        kt = tile_rows(ops, p, span, KiviPlane::kKey, it.kv_head, tile_a - span.pos0, n, sc.kt);
        vt = tile_rows(ops, p, span, KiviPlane::kValue, it.kv_head, tile_a - span.pos0, n, sc.vt);
      }
      for (int64_t t = it.t0; t < it.t1; ++t) {
        const int64_t qpos = q.pos0 + t;
        int64_t klo = tile_a;
        const int64_t khi = std::min(b, qpos + 1);
        if (p.window > 0) klo = std::max(klo, qpos - p.window + 1);
        if (klo >= khi) continue;
        const int64_t nk = khi - klo;
        // The item's G query heads of this KV head: scores together, then each row's online-softmax
        // update, then the accumulation together (per row the same operations as one at a time).
        const int64_t r0 = (t - it.t0) * G;
        const float* qt = q.q + t * q.token_stride + first_head(p, it) * dk;
        if (f16_rows)
          ops.scores_f16(qt, dk, G, kh + (klo - tile_a) * dk, nk, dk, sc.s);
        else
          ops.scores(qt, dk, G, kt + (klo - tile_a) * dk, nk, dk, sc.s);
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
        if (f16_rows)
          ops.accumulate_f16(sc.s, G, vh + (klo - tile_a) * dv, nk, dv, sc.acc + r0 * dv);
        else
          ops.accumulate(sc.s, G, vt + (klo - tile_a) * dv, nk, dv, sc.acc + r0 * dv);
      }
    }
    if (past_queries) break;
  }

  for (int64_t r = 0; r < n_rows; ++r) {
    float* o = o_part + r * dv;
    if (sc.l[r] > 0.0f) {
      const float inv = 1.0f / sc.l[r];
      for (int64_t i = 0; i < dv; ++i) o[i] = sc.acc[r * dv + i] * inv;
      lse_part[r] = sc.m[r] + std::log(sc.l[r]);
    } else {
      std::fill(o, o + dv, 0.0f);
      lse_part[r] = kNegInf;
    }
  }
}

// The chunks an item's queries can see: [first, last] (first > last: none). Spans are ascending.
struct ChunkRange {
  int64_t first = 0;
  int64_t last = -1;
  int64_t count() const { return std::max<int64_t>(0, last - first + 1); }
};

ChunkRange visible_chunks(const AttnParams& p, std::span<const KvSpan> spans, const AttnQueries& q,
                          const Item& it) {
  if (spans.empty()) return {};
  int64_t key_lo = spans.front().pos0;
  if (p.window > 0) key_lo = std::max(key_lo, q.pos0 + it.t0 - p.window + 1);  // earlier: out of every window
  const int64_t key_hi = std::min(spans.back().pos0 + spans.back().n_tokens, q.pos0 + it.t1);  // exclusive
  if (key_hi <= key_lo) return {};
  return {key_lo / kAttnChunk, (key_hi - 1) / kAttnChunk};
}

// Index of the first span ending after position `pos`, searching from `from` (spans ascending).
size_t span_after(std::span<const KvSpan> spans, size_t from, int64_t pos) {
  while (from < spans.size() && spans[from].pos0 + spans[from].n_tokens <= pos) ++from;
  return from;
}

// Merges a finished chunk ([rows, dv] rows of the item) into the item's output rows in `out`, whose
// lse so far is in run_lse. Token t's G rows are contiguous in both.
void merge_chunk(const AttnParams& p, const AttnOutput& out, const Item& it, const float* o_part,
                 const float* lse_part, float* run_lse) {
  const int64_t G = it.ng;
  const int64_t dv = p.head_dim_v;
  for (int64_t t = it.t0; t < it.t1; ++t) {
    const int64_t r0 = (t - it.t0) * G;
    merge_attention(out.o + t * out.token_stride + first_head(p, it) * dv, run_lse + r0, o_part + r0 * dv,
                    lse_part + r0, G, dv);
  }
}

void begin_item(const Item& it, float* run_lse) {
  std::fill(run_lse, run_lse + (it.t1 - it.t0) * it.ng, kNegInf);
}

// Rows no key reached get o = 0; the lse goes out if asked for.
void finish_item(const AttnParams& p, const AttnOutput& out, const Item& it, const float* run_lse) {
  const int64_t G = it.ng;
  const int64_t dv = p.head_dim_v;
  for (int64_t t = it.t0; t < it.t1; ++t) {
    for (int64_t g = 0; g < G; ++g) {
      const int64_t h = first_head(p, it) + g;
      const float lse = run_lse[(t - it.t0) * G + g];
      float* o = out.o + t * out.token_stride + h * dv;
      if (lse == kNegInf) std::fill(o, o + dv, 0.0f);
      if (out.lse != nullptr) out.lse[t * out.lse_stride + h] = lse;
    }
  }
}

// An item on one thread: its chunks in order, each merged as it finishes.
void run_item(const AttnTileOps& ops, const AttnParams& p, const AttnQueries& q,
              std::span<const KvSpan> spans, const AttnOutput& out, const Item& it, const Scratch& sc) {
  begin_item(it, sc.run_lse);
  const ChunkRange cr = visible_chunks(p, spans, q, it);
  size_t first_span = 0;
  for (int64_t c = cr.first; c <= cr.last; ++c) {
    first_span = span_after(spans, first_span, c * kAttnChunk);
    run_chunk(ops, p, q, spans, first_span, it, c * kAttnChunk, (c + 1) * kAttnChunk, sc, sc.part_o,
              sc.part_lse);
    merge_chunk(p, out, it, sc.part_o, sc.part_lse, sc.run_lse);
  }
  finish_item(p, out, it, sc.run_lse);
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
  for (size_t i = 1; i < spans.size(); ++i) {
    KVTIER_ASSERT(spans[i].pos0 >= spans[i - 1].pos0 + spans[i - 1].n_tokens,
                  "KV spans out of order: [{}, +{}) after [{}, +{})", spans[i].pos0, spans[i].n_tokens,
                  spans[i - 1].pos0, spans[i - 1].n_tokens);
  }
  for (const KvSpan& sp : spans) {
    KVTIER_ASSERT(
        sp.n_quant == 0 || (p.kivi.bits > 0 && p.kv_dtype == KvDtype::kF16 && sp.n_quant <= sp.n_tokens &&
                            sp.q_base % p.kivi.block_tokens == 0 && sp.pos0 >= sp.q_base),
        "KIVI span [{}, +{}) with {} quantised tokens", sp.pos0, sp.n_tokens, sp.n_quant);
  }
  require_isa(isa);
  if (q.n_tokens == 0) return;
  const AttnTileOps& ops = isa == Isa::kScalar ? attn_tile_ops_ref()
                           : isa == Isa::kAvx2 ? attn_tile_ops_avx2()
                                               : attn_tile_ops_avx512();
  const int64_t n_kv = q.n_heads / p.q_per_kv;
  const int64_t n_qt = (q.n_tokens + kAttnQueryTile - 1) / kAttnQueryTile;
  const int64_t n_items = n_kv * n_qt;
  // Small calls (decode at short context) run on this thread alone when the pool sleeps
  // (ThreadPool::threads_for). Results do not depend on the thread count.
  const int64_t key_span = spans.empty() ? 0 : spans.back().pos0 + spans.back().n_tokens - spans.front().pos0;
  const int threads = pool.threads_for(key_span * q.n_heads * q.n_tokens * (p.head_dim_k + p.head_dim_v),
                                       kSleepingPoolMinWork);
  // 64-byte aligned base for the per-thread scratch.
  auto* base =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t{63});
  const size_t per = scratch_per_thread(p);
  auto scratch_of = [&](int part) { return carve(base + per * static_cast<size_t>(part), p); };

  // Fewer KV heads than threads (decode on Gemma-3, whose one KV head serves 4 query heads) and few
  // key chunks (a short context, a sliding window): the chunks would split unevenly. Where the
  // threads divide into equal shares of every head's query heads, each thread takes one item of
  // q_per_kv / (threads / n_kv) query heads and runs all its chunks in order (run_item): equal
  // shares whatever the chunks' sizes, and no chunk waits to be merged on this thread. Each thread
  // then reads all of its head's keys and values, which costs more than it saves over more chunks
  // (Gemma-3 decode at 4K: 0.9x). Same bits as the paths below: a row's arithmetic does not depend
  // on the item's other rows.
  const bool decode_sized = q.n_tokens <= kSplitTokens && threads > 1;
  // The chunks a decode-sized call's queries see: the same for every head.
  const ChunkRange cr =
      decode_sized ? visible_chunks(p, spans, q, Item{0, 0, q.n_tokens, 0, p.q_per_kv}) : ChunkRange{};
  if (decode_sized && n_kv < threads && threads % n_kv == 0 && p.q_per_kv % (threads / n_kv) == 0 &&
      cr.count() <= threads + 1) {
    const int64_t per_head = threads / n_kv;
    const int64_t ng = p.q_per_kv / per_head;
    pool.run(threads, [&](int part) {
      const Item it{part / per_head, 0, q.n_tokens, (part % per_head) * ng, ng};
      run_item(ops, p, q, spans, out, it, scratch_of(part));
    });
    return;
  }

  // Too few items to keep the threads busy (decode; a head-wise policy's one-head calls): split the
  // (KV head, key chunk) pairs over the threads instead, in waves of at most kSlotsPerThread pairs
  // per thread, and merge each head's chunks on this thread in chunk order, the order run_item
  // merges in. Same bits either way.
  if (decode_sized && n_kv < 2 * threads) {
    const auto S = static_cast<int64_t>(rows_per_slot(p));
    auto item = [&](int64_t j) { return Item{j, 0, q.n_tokens, 0, p.q_per_kv}; };
    auto run_lse = [&](int64_t j) { return scratch_of(static_cast<int>(j / 2)).run_lse + (j % 2) * S; };
    const int64_t n_chunks = cr.count();
    for (int64_t j = 0; j < n_kv; ++j) begin_item(item(j), run_lse(j));
    const int64_t total = n_kv * n_chunks;  // pair k: head k / n_chunks, chunk cr.first + k % n_chunks
    const int64_t wave = kSlotsPerThread * threads;
    for (int64_t w0 = 0; w0 < total; w0 += wave) {
      const int64_t n = std::min(wave, total - w0);
      const int parts = static_cast<int>(std::min<int64_t>(threads, n));
      pool.run(parts, [&](int part) {
        const Scratch sc = scratch_of(part);
        const Range r = split_range(n, parts, part);
        size_t first_span = 0;
        int64_t last_head = -1;
        for (int64_t k = r.begin; k < r.end; ++k) {
          const int64_t j = (w0 + k) / n_chunks;
          const int64_t c = cr.first + (w0 + k) % n_chunks;
          if (j != last_head) first_span = 0;  // chunks ascend within a head
          last_head = j;
          first_span = span_after(spans, first_span, c * kAttnChunk);
          const int64_t slot = k - r.begin;
          run_chunk(ops, p, q, spans, first_span, item(j), c * kAttnChunk, (c + 1) * kAttnChunk, sc,
                    sc.part_o + slot * S * p.head_dim_v, sc.part_lse + slot * S);
        }
      });
      for (int part = 0; part < parts; ++part) {
        const Scratch sc = scratch_of(part);
        const Range r = split_range(n, parts, part);
        for (int64_t k = r.begin; k < r.end; ++k) {
          const int64_t j = (w0 + k) / n_chunks;
          const int64_t slot = k - r.begin;
          merge_chunk(p, out, item(j), sc.part_o + slot * S * p.head_dim_v, sc.part_lse + slot * S,
                      run_lse(j));
        }
      }
    }
    for (int64_t j = 0; j < n_kv; ++j) finish_item(p, out, item(j), run_lse(j));
    return;
  }

  const int n_parts = static_cast<int>(std::min<int64_t>(threads, n_items));
  pool.run(n_parts, [&](int part) {
    const Scratch sc = scratch_of(part);
    const Range r = split_range(n_items, n_parts, part);
    for (int64_t i = r.begin; i < r.end; ++i) {
      const int64_t qt = i % n_qt;
      const Item it{i / n_qt, qt * kAttnQueryTile, std::min(q.n_tokens, (qt + 1) * kAttnQueryTile), 0,
                    p.q_per_kv};
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
