// Writing and moving K/V rows in device caches. A cache holds, per KV head, a run of rows:
//   row r of head h at base + (h * head_stride + r * head_dim) elements of the cache's KvDtype,
// the layout of a span (attention.h). Host functions taking device pointers; they only enqueue.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/dtype.h"

namespace kvtier::cuda {

struct KvCacheView {
  void* base = nullptr;     // [n_kv_heads][>= rows, head_dim] dtype (device)
  int64_t head_stride = 0;  // elements between heads
  int64_t head_dim = 0;
  KvDtype dtype = KvDtype::kF16;
};

// Writes new rows: cache row dst_row(t) of head h = dtype(src[t * token_stride + h * head_dim + i]),
// rounded to nearest even. src: [n_tokens, n_kv_heads, head_dim] f32 (device), the K or V of a
// projection. dst_row(t) = rows[t] when `rows` ([n_tokens] i32 device) is given, else row0 + t.
void kv_append(const float* src, int64_t token_stride, int64_t n_tokens, int64_t n_kv_heads,
               const KvCacheView& dst, int64_t row0, const int32_t* rows, cudaStream_t stream);

// Copies rows between caches of the same dtype and head_dim, for every head h < n_kv_heads:
//   gather:  dst row i = src row idx[i]     (compacting a selection into a dense span)
//   scatter: dst row idx[i] = src row i     (writing a dense span back to chosen rows)
// idx: [n] i32 device. Rows of one call must not overlap between src and dst.
void kv_gather(const KvCacheView& src, const int32_t* idx, int64_t n, int64_t n_kv_heads,
               const KvCacheView& dst, cudaStream_t stream);
void kv_scatter(const KvCacheView& src, const int32_t* idx, int64_t n, int64_t n_kv_heads,
                const KvCacheView& dst, cudaStream_t stream);

// Reads rows [row0, row0 + n) of every head back as f32: dst [n_kv_heads, n, head_dim] f32 (tests,
// debugging, the CPU fallback of a span).
void kv_to_f32(const KvCacheView& src, int64_t row0, int64_t n, int64_t n_kv_heads, float* dst,
               cudaStream_t stream);

}  // namespace kvtier::cuda
