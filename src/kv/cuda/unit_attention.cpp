#include "kv/cuda/unit_attention.h"

#include "backend/cuda/attention.h"
#include "core/error.h"
#include "kv/cuda/kv_layout.h"

namespace kvtier::kv_cuda {

size_t split_scratch_bytes(const DeviceKvShape& s) {
  cuda::AttnParams p;
  p.head_dim_k = s.head_dim;
  p.head_dim_v = s.head_dim;
  cuda::AttnQueries q;
  q.n_tokens = 1;
  q.n_heads = s.max_q_heads;
  cuda::KvSpan span;
  span.n_tokens = s.max_positions;
  return cuda::attention_split_scratch_bytes(p, q, span);
}

void attend_unit(const DeviceKvShape& s, const kv::LayerAttention& la, const UnitQueries& uq,
                 const UnitRows& rows, SplitScratch scratch, cudaStream_t stream) {
  KVTIER_ASSERT(rows.n_keys == uq.pos0 + uq.n_tokens, "{} keys for queries at [{}, {})", rows.n_keys, uq.pos0,
                uq.pos0 + uq.n_tokens);
  const int64_t d = s.head_dim;
  cuda::AttnParams p;
  p.head_dim_k = d;
  p.head_dim_v = d;
  p.q_per_kv = uq.q_per_kv;
  p.scale = la.scale;
  p.softcap = la.softcap;
  p.window = la.window;
  p.kv_dtype = s.dtype;
  cuda::AttnQueries q;
  q.q = uq.q + uq.q_head0 * d;
  q.token_stride = uq.n_q_heads_total * d;
  q.n_tokens = uq.n_tokens;
  q.n_heads = uq.n_kv * uq.q_per_kv;
  q.pos0 = uq.pos0;
  cuda::KvSpan span;
  span.pos0 = 0;
  span.n_tokens = rows.n_keys;
  span.k = rows.k;
  span.v = rows.v;
  span.k_head_stride = rows.head_stride;
  span.v_head_stride = rows.head_stride;
  cuda::AttnOutput out;
  out.o = uq.o + uq.q_head0 * d;
  out.token_stride = uq.n_q_heads_total * d;
  // Split (decode) or single pass, from the token count and the key positions alone; both give the
  // same bits (attention.h), the fixed choice only keeps the launches identical across placements.
  const bool split = pass_schedule(uq.n_tokens) == PassSchedule::kSplit && cuda::attention_chunks(span) > 1;
  cuda::attend(p, q, span, out, scratch.ptr, scratch.bytes, stream,
               split ? cuda::AttnSchedule::kSplit : cuda::AttnSchedule::kSingle);
}

}  // namespace kvtier::kv_cuda
