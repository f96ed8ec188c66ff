// attend() (attention.h): argument checks, the launch plan and the schedule; kernels in
// attention_kernels.cuh.
#include <algorithm>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_kernels.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_types.cuh"

namespace kvtier::cuda {
namespace {

using attn::kWarp;
using attn::Partials;

void check_args(const AttnParams& p, const AttnQueries& q) {
  if (p.head_dim_k <= 0 || p.head_dim_k > kAttnMaxHeadDim || p.head_dim_v <= 0 ||
      p.head_dim_v > kAttnMaxHeadDim) {
    fail(ErrorKind::kUnsupported, "CUDA attention: head dims {}/{} (at most {})", p.head_dim_k, p.head_dim_v,
         kAttnMaxHeadDim);
  }
  if (p.q_per_kv < 1 || p.q_per_kv > kAttnMaxQPerKv) {
    fail(ErrorKind::kUnsupported, "CUDA attention: {} query heads per KV head (at most {})", p.q_per_kv,
         kAttnMaxQPerKv);
  }
  KVTIER_ASSERT(q.n_heads % p.q_per_kv == 0, "{} query heads, {} per KV head", q.n_heads, p.q_per_kv);
  KVTIER_ASSERT(q.n_heads / p.q_per_kv <= 65535, "{} KV heads in one call", q.n_heads / p.q_per_kv);
}

}  // namespace

int64_t attention_chunks(const KvSpan& span) {
  if (span.n_tokens <= 0) return 0;
  return (span.pos0 + span.n_tokens - 1) / kAttnChunk - span.pos0 / kAttnChunk + 1;
}

size_t attention_split_scratch_bytes(const AttnParams& p, const AttnQueries& q, const KvSpan& span) {
  const auto rows = static_cast<size_t>(attention_chunks(span)) * static_cast<size_t>(q.n_tokens) *
                    static_cast<size_t>(q.n_heads);
  return rows * (static_cast<size_t>(p.head_dim_v) + 2) * sizeof(float);
}

void attend(const AttnParams& p, const AttnQueries& q, const KvSpan& span, const AttnOutput& out,
            void* scratch, size_t scratch_bytes, cudaStream_t stream, AttnSchedule schedule) {
  check_args(p, q);
  if (q.n_tokens <= 0 || q.n_heads <= 0) return;
  const attn::Launch l = attn::plan(p, q);
  const int64_t n_chunks = attention_chunks(span);
  const int64_t n_kv = q.n_heads / p.q_per_kv;
  const size_t need = attention_split_scratch_bytes(p, q, span);
  if (schedule == AttnSchedule::kAuto) {
    const bool split =
        l.n_qtiles == 1 && n_chunks > 1 && n_chunks <= 65535 && scratch != nullptr && scratch_bytes >= need;
    schedule = split ? AttnSchedule::kSplit : AttnSchedule::kSingle;
  }
  if (n_chunks == 0) schedule = AttnSchedule::kSingle;  // no keys: o = 0, lse = -inf
  Partials part;
  if (schedule == AttnSchedule::kSplit) {
    if (scratch == nullptr || scratch_bytes < need) {
      fail(ErrorKind::kBudget, "CUDA attention: the split schedule needs {} bytes of scratch, {} given", need,
           scratch_bytes);
    }
    if (n_chunks > 65535)
      fail(ErrorKind::kUnsupported, "CUDA attention: {} chunks in one split call", n_chunks);
    part.o = static_cast<float*>(scratch);
    part.ml = part.o + static_cast<size_t>(n_chunks) * static_cast<size_t>(q.n_tokens) *
                           static_cast<size_t>(q.n_heads) * static_cast<size_t>(p.head_dim_v);
  }
  const bool split = schedule == AttnSchedule::kSplit;
  const int64_t chunk0 = span.n_tokens > 0 ? span.pos0 / kAttnChunk : 0;
  const dim3 grid(static_cast<unsigned>(l.n_qtiles), static_cast<unsigned>(n_kv),
                  split ? static_cast<unsigned>(n_chunks) : 1u);
  dispatch_kv_dtype(p.kv_dtype, [&](auto tag) {
    using T = decltype(tag);
    auto* kernel = split ? attn::attn_kernel<T, true> : attn::attn_kernel<T, false>;
    if (l.smem_bytes > 48 * 1024) {
      KVTIER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(l.smem_bytes)));
    }
    kernel<<<grid, l.threads, l.smem_bytes, stream>>>(p, q, span, out, part, l.tokens_per_block, chunk0,
                                                      n_chunks);
  });
  KVTIER_CUDA_CHECK_LAUNCH("attn_kernel");
  if (split) {
    const int64_t rows = q.n_tokens * q.n_heads;
    const auto blocks =
        static_cast<unsigned>((rows + attn::kMergeWarpsPerBlock - 1) / attn::kMergeWarpsPerBlock);
    attn::split_merge_kernel<<<blocks, attn::kMergeWarpsPerBlock * kWarp, 0, stream>>>(
        part, n_chunks, q.n_tokens, q.n_heads, static_cast<int>(p.head_dim_v), out);
    KVTIER_CUDA_CHECK_LAUNCH("split_merge_kernel");
  }
}

}  // namespace kvtier::cuda
