// Blocked (flash-style) attention over KV spans with an online softmax: never a [tokens x context]
// score matrix. Returns each query's output and log-sum-exp, so partial results over disjoint key
// sets merge exactly (merge_attention).
//
// Arithmetic contract (the exactness principle of design.md):
//   * the keys are cut into chunks of kAttnChunk absolute positions; each chunk's softmax is computed
//     from a fresh state and the chunks are merged (merge_attention) in position order, so a call may
//     compute a query's chunks on different threads (decode) or one after another (prefill);
//   * within a chunk, keys are visited span by span in the order given (spans ascending, disjoint),
//     each span in tiles of kAttnTile keys whose boundaries are multiples of kAttnTile in absolute
//     position (clipped to the span);
//   * every (query token, query head) pair is computed by the same sequence of operations whatever
//     the number of heads, query tokens, threads or query tiles a call is handed;
//   * a tile whose keys are all masked for a query leaves that query's state untouched.
// Hence results depend on the key positions of the spans (the tiling of the sequence) only: two
// callers handing the same spans (wherever their bytes live) get bit-identical results, and a
// query gets the same result in a prefill chunk of any size as in decode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kv_quant.h"
#include "core/thread_pool.h"

namespace kvtier::cpu {

constexpr int64_t kAttnTile = 32;       // keys per tile (absolute-position aligned)
constexpr int64_t kAttnChunk = 256;     // keys per separately computed, then merged, chunk
constexpr int64_t kAttnQueryTile = 16;  // query tokens per work item (does not affect results)
static_assert(kAttnChunk % kAttnTile == 0, "a chunk is whole tiles");

enum class KvDtype { kF32, kF16 };

size_t kv_dtype_bytes(KvDtype t);

// A run of consecutive key positions [pos0, pos0 + n_tokens) of a group of KV heads, readable by
// the CPU. K of head h, token t is at k + (h * k_head_stride + t * head_dim_k) elements of the
// span's dtype (rows contiguous per head); V likewise with v_head_stride and head_dim_v.
struct KvSpan {
  int64_t pos0 = 0;
  int64_t n_tokens = 0;
  const void* k = nullptr;  // [n_kv_heads][>= n_tokens, head_dim_k] dtype
  const void* v = nullptr;  // [n_kv_heads][>= n_tokens, head_dim_v] dtype
  int64_t k_head_stride = 0;
  int64_t v_head_stride = 0;
  // KIVI (AttnParams::kivi.bits > 0): the first n_quant tokens of the span are read from quantised
  // blocks (kv_quant.h) instead of k / v; the rest are dtype rows as above. The block holding
  // position p (>= q_base) of head h starts at kq + h * kq_head_stride + ((p - q_base) / block_tokens)
  // * kq_block_stride bytes (V likewise); q_base is a multiple of block_tokens.
  int64_t n_quant = 0;
  int64_t q_base = 0;
  const uint8_t* kq = nullptr;
  const uint8_t* vq = nullptr;
  int64_t kq_head_stride = 0;  // bytes
  int64_t vq_head_stride = 0;
  int64_t kq_block_stride = 0;
  int64_t vq_block_stride = 0;
};

struct AttnParams {
  int64_t head_dim_k = 0;
  int64_t head_dim_v = 0;
  int64_t q_per_kv = 1;  // query heads per KV head (GQA ratio); query head h uses KV head h / q_per_kv
  float scale = 1.0f;    // applied to q.k
  float softcap = 0.0f;  // > 0: s = softcap * tanh(s / softcap)
  int64_t window = 0;    // > 0: key visible iff q_pos - k_pos < window (sliding window)
  KvDtype kv_dtype = KvDtype::kF16;
  KiviFormat kivi;  // bits > 0: spans may hold KIVI-quantised tokens (dequantised tile by tile)
};

// The queries of one call: token t (position pos0 + t), head h at q + t * token_stride + h * head_dim_k.
struct AttnQueries {
  const float* q = nullptr;  // [n_tokens, n_heads, head_dim_k] f32 (token_stride between tokens)
  int64_t token_stride = 0;  // elements
  int64_t n_tokens = 0;
  int64_t n_heads = 0;  // query heads handed (a multiple of q_per_kv); KV head j of the spans serves
                        // query heads [j * q_per_kv, (j + 1) * q_per_kv)
  int64_t pos0 = 0;
};

// Output of one call: o + t * token_stride + h * head_dim_v, and lse[t * lse_stride + h].
struct AttnOutput {
  float* o = nullptr;  // [n_tokens, n_heads, head_dim_v] f32
  int64_t token_stride = 0;
  float* lse = nullptr;  // [n_tokens, n_heads] f32 (may be null); -inf where no key was visible
  int64_t lse_stride = 0;
};

// Per-thread scratch of attend() for the given shapes (sized once, up front).
size_t attention_scratch_bytes(const AttnParams& p, int pool_threads);

// Causal attention of the queries over the spans (keys at positions > the query's are masked, as
// are keys outside the window). Work is split over (KV head, query tile) across the pool, or, when
// those are fewer than the threads can share evenly (decode), over (KV head, key chunk). Queries
// that see no key get o = 0 and lse = -inf.
void attend(ThreadPool& pool, Isa isa, const AttnParams& p, const AttnQueries& q,
            std::span<const KvSpan> spans, const AttnOutput& out, std::span<uint8_t> scratch);

// Merges a partial result (o_b, lse_b) over a disjoint key set into (o_a, lse_a) in place:
//   lse = log(e^lse_a + e^lse_b), o_a = o_a e^(lse_a - lse) + o_b e^(lse_b - lse).
// o_*: [n, dv] f32 rows, lse_*: [n] f32.
void merge_attention(float* o_a, float* lse_a, const float* o_b, const float* lse_b, int64_t n, int64_t dv);

// The tile kernels one ISA provides (attention_ref.cpp, attention_avx2.cpp, attention_avx512.cpp).
struct AttnTileOps {
  // s[r * n + j] = dot(q + r * q_stride, k + j * d) for r < rows, j < n. Several query rows (the
  // query heads of one KV head) share each key load; every (row, key) value is computed by the
  // same operations whatever `rows` is.
  void (*scores)(const float* q, int64_t q_stride, int64_t rows, const float* k, int64_t n, int64_t d,
                 float* s);
  // acc[r * dv + i] += sum_j p[r * n + j] * v[j * dv + i], j in order, for r < rows (each element's
  // chain is the same whatever `rows` is).
  void (*accumulate)(const float* p, int64_t rows, const float* v, int64_t n, int64_t dv, float* acc);
  // scores and accumulate over f16 key / value rows ([n, d] and [n, dv] f16), converted in registers:
  // the conversion is exact, so every value is the one scores / accumulate give on the converted
  // rows, bit for bit, without writing the converted tile to memory first.
  void (*scores_f16)(const float* q, int64_t q_stride, int64_t rows, const uint16_t* k, int64_t n, int64_t d,
                     float* s);
  void (*accumulate_f16)(const float* p, int64_t rows, const uint16_t* v, int64_t n, int64_t dv, float* acc);
  // dst[i] = f16 src[i] as f32
  void (*f16_to_f32)(const uint16_t* src, int64_t n, float* dst);
  // x[i] *= c
  void (*scale)(float* x, int64_t n, float c);
  // p[j] = exp(s[j] - m) for j < n; returns the sum of p
  float (*exp_sum)(const float* s, int64_t n, float m, float* p);
  // KIVI rows as f32 (kv_quant.h), into the tile scratch
  KiviDequantFn kivi_dequant;
};

const AttnTileOps& attn_tile_ops_ref();
const AttnTileOps& attn_tile_ops_avx2();
const AttnTileOps& attn_tile_ops_avx512();  // bit-identical to the AVX2 ops (attention_avx512.cpp)

}  // namespace kvtier::cpu
