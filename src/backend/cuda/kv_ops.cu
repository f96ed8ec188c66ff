// KV append, gather, scatter (kv_ops.h). Row copies move 16-bit or 32-bit words; one thread per
// element in grid-stride loops.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_types.cuh"
#include "backend/cuda/kv_ops.h"

namespace kvtier::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void append_kernel(const float* src, int64_t token_stride, int64_t n_tokens, int64_t n_kv_heads,
                              T* dst, int64_t head_stride, int64_t head_dim, int64_t row0,
                              const int32_t* rows) {
  const int64_t n = n_tokens * n_kv_heads * head_dim;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % head_dim;
    const int64_t h = (i / head_dim) % n_kv_heads;
    const int64_t t = i / (head_dim * n_kv_heads);
    const int64_t r = rows != nullptr ? static_cast<int64_t>(rows[t]) : row0 + t;
    dst[h * head_stride + r * head_dim + c] = from_f32<T>(src[t * token_stride + h * head_dim + c]);
  }
}

// Word-typed row copy: dst row map_dst(i) = src row map_src(i) for each head.
template <typename W, bool kGather>
__global__ void move_rows_kernel(const W* src, int64_t src_head_stride, W* dst, int64_t dst_head_stride,
                                 int64_t head_dim, const int32_t* idx, int64_t n, int64_t n_kv_heads) {
  const int64_t total = n * n_kv_heads * head_dim;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % head_dim;
    const int64_t r = (i / head_dim) % n;
    const int64_t h = i / (head_dim * n);
    const int64_t j = idx[r];
    const int64_t sr = kGather ? j : r;
    const int64_t dr = kGather ? r : j;
    dst[h * dst_head_stride + dr * head_dim + c] = src[h * src_head_stride + sr * head_dim + c];
  }
}

template <typename T>
__global__ void to_f32_kernel(const T* src, int64_t head_stride, int64_t head_dim, int64_t row0, int64_t n,
                              int64_t n_kv_heads, float* dst) {
  const int64_t total = n * n_kv_heads * head_dim;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % head_dim;
    const int64_t r = (i / head_dim) % n;
    const int64_t h = i / (head_dim * n);
    dst[i] = to_f32(src[h * head_stride + (row0 + r) * head_dim + c]);
  }
}

template <bool kGather>
void move_rows(const KvCacheView& src, const int32_t* idx, int64_t n, int64_t n_kv_heads,
               const KvCacheView& dst, cudaStream_t stream) {
  KVTIER_ASSERT(src.dtype == dst.dtype && src.head_dim == dst.head_dim,
                "KV row copy between different layouts");
  const int64_t total = n * n_kv_heads * src.head_dim;
  if (total <= 0) return;
  if (kv_dtype_bytes(src.dtype) == 4) {
    move_rows_kernel<uint32_t, kGather><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
        static_cast<const uint32_t*>(src.base), src.head_stride, static_cast<uint32_t*>(dst.base),
        dst.head_stride, src.head_dim, idx, n, n_kv_heads);
  } else {
    move_rows_kernel<uint16_t, kGather><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
        static_cast<const uint16_t*>(src.base), src.head_stride, static_cast<uint16_t*>(dst.base),
        dst.head_stride, src.head_dim, idx, n, n_kv_heads);
  }
  KVTIER_CUDA_CHECK_LAUNCH("move_rows_kernel");
}

}  // namespace

void kv_append(const float* src, int64_t token_stride, int64_t n_tokens, int64_t n_kv_heads,
               const KvCacheView& dst, int64_t row0, const int32_t* rows, cudaStream_t stream) {
  const int64_t n = n_tokens * n_kv_heads * dst.head_dim;
  if (n <= 0) return;
  dispatch_kv_dtype(dst.dtype, [&](auto tag) {
    using T = decltype(tag);
    append_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        src, token_stride, n_tokens, n_kv_heads, static_cast<T*>(dst.base), dst.head_stride, dst.head_dim,
        row0, rows);
  });
  KVTIER_CUDA_CHECK_LAUNCH("append_kernel");
}

void kv_gather(const KvCacheView& src, const int32_t* idx, int64_t n, int64_t n_kv_heads,
               const KvCacheView& dst, cudaStream_t stream) {
  move_rows<true>(src, idx, n, n_kv_heads, dst, stream);
}

void kv_scatter(const KvCacheView& src, const int32_t* idx, int64_t n, int64_t n_kv_heads,
                const KvCacheView& dst, cudaStream_t stream) {
  move_rows<false>(src, idx, n, n_kv_heads, dst, stream);
}

void kv_to_f32(const KvCacheView& src, int64_t row0, int64_t n, int64_t n_kv_heads, float* dst,
               cudaStream_t stream) {
  const int64_t total = n * n_kv_heads * src.head_dim;
  if (total <= 0) return;
  dispatch_kv_dtype(src.dtype, [&](auto tag) {
    using T = decltype(tag);
    to_f32_kernel<T><<<grid_for(total, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(src.base), src.head_stride, src.head_dim, row0, n, n_kv_heads, dst);
  });
  KVTIER_CUDA_CHECK_LAUNCH("to_f32_kernel");
}

}  // namespace kvtier::cuda
