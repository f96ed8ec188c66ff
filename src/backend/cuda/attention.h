// Attention on the GPU over one KV span, returning each query's output and log-sum-exp, plus the
// log-sum-exp merge of partial results over disjoint key sets (the span mechanism of design.md).
//
// Arithmetic contract (the exactness principle, the HeadInfer spec's note on split counts):
//   * keys are cut into chunks of kAttnChunk and tiles of kAttnTile keys whose boundaries are
//     multiples of the chunk/tile size in absolute position (clipped to the span);
//   * each (query token, query head) row runs an online softmax over the tiles of a chunk, in order,
//     then merges the chunks' partial results in order (chunk 0 first);
//   * a tile or chunk whose keys are all masked for a row leaves that row's state untouched;
//   * every row is computed by the same sequence of operations whatever the number of heads,
//     query tokens or blocks of the call, the device or the schedule (below).
// So the split count of decode (one chunk per block, merged afterwards) derives from the span's key
// positions only, and the single-pass schedule (one block walks all chunks, merging as it goes)
// gives bit-identical results: a query gets the same output in a prefill chunk of any size as in
// decode, and a head gets the same output whichever head group it is handed in.
// Differences from the CPU backend (backend/cpu/attention.h): the CPU runs one online softmax over
// all tiles (no chunk merges) and sums in another order, so the two agree to rounding, not bitwise.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/dtype.h"

namespace kvtier::cuda {

constexpr int64_t kAttnTile = 32;         // keys per tile (absolute-position aligned)
constexpr int64_t kAttnChunk = 256;       // keys per chunk, the unit of the decode split
constexpr int64_t kAttnMaxHeadDim = 256;  // head_dim_k and head_dim_v
constexpr int64_t kAttnMaxQPerKv = 32;    // query heads per KV head

// A run of consecutive key positions [pos0, pos0 + n_tokens) of a group of KV heads in device
// memory: K of head h, token t at k + (h * k_head_stride + t * head_dim_k) elements of kv_dtype.
struct KvSpan {
  int64_t pos0 = 0;
  int64_t n_tokens = 0;
  const void* k = nullptr;  // [n_kv_heads][>= n_tokens, head_dim_k] kv_dtype (device)
  const void* v = nullptr;  // [n_kv_heads][>= n_tokens, head_dim_v] kv_dtype (device)
  int64_t k_head_stride = 0;
  int64_t v_head_stride = 0;
};

struct AttnParams {
  int64_t head_dim_k = 0;
  int64_t head_dim_v = 0;
  int64_t q_per_kv = 1;  // GQA ratio: query head h uses KV head h / q_per_kv
  float scale = 1.0f;    // applied to q.k
  float softcap = 0.0f;  // > 0: s = softcap * tanh(s / softcap)
  int64_t window = 0;    // > 0: key visible iff q_pos - k_pos < window (sliding window)
  KvDtype kv_dtype = KvDtype::kF16;
};

// Queries of one call: token t (position pos0 + t), head h at q + t * token_stride + h * head_dim_k.
struct AttnQueries {
  const float* q = nullptr;  // [n_tokens, n_heads, head_dim_k] f32 (device)
  int64_t token_stride = 0;  // elements
  int64_t n_tokens = 0;
  int64_t n_heads = 0;  // a multiple of q_per_kv; KV head j of the span serves query heads
                        // [j * q_per_kv, (j + 1) * q_per_kv)
  int64_t pos0 = 0;
};

// Output: o + t * token_stride + h * head_dim_v, lse[t * lse_stride + h] (natural log).
struct AttnOutput {
  float* o = nullptr;  // [n_tokens, n_heads, head_dim_v] f32 (device)
  int64_t token_stride = 0;
  float* lse = nullptr;  // [n_tokens, n_heads] f32 (device, may be null); -inf where no key is visible
  int64_t lse_stride = 0;
};

// How the chunks of a row are scheduled; results are bit-identical either way.
enum class AttnSchedule {
  kAuto,    // kSplit when the queries fit one block per KV head and scratch suffices, else kSingle
  kSingle,  // one block per (query tile, KV head) walks all chunks (prefill)
  kSplit,   // one block per (query tile, KV head, chunk), then an ordered merge (decode)
};

// Number of chunks the span's keys fall into: a function of pos0 and n_tokens only.
int64_t attention_chunks(const KvSpan& span);

// Device scratch that kSplit needs for these queries and span (f32 partial outputs and m/l).
size_t attention_split_scratch_bytes(const AttnParams& p, const AttnQueries& q, const KvSpan& span);

// Causal attention of the queries over the span. Queries that see no key get o = 0, lse = -inf.
// `scratch` (device, may be null) is used by kSplit; kSplit with too little scratch is an error.
// Enqueued on `stream`; no allocation, no synchronisation.
void attend(const AttnParams& p, const AttnQueries& q, const KvSpan& span, const AttnOutput& out,
            void* scratch, size_t scratch_bytes, cudaStream_t stream,
            AttnSchedule schedule = AttnSchedule::kAuto);

// Merges a partial result (o_b, lse_b) over a disjoint key set into (o_a, lse_a) in place, as
// backend/cpu merge_attention: lse = log(e^lse_a + e^lse_b), o_a = o_a wa + o_b wb.
// o_*: [n, dv] f32 rows, lse_*: [n] f32 (device).
void merge_attention(float* o_a, float* lse_a, const float* o_b, const float* lse_b, int64_t n, int64_t dv,
                     cudaStream_t stream);

}  // namespace kvtier::cuda
