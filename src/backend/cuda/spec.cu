// InfiniGen's speculation kernels (spec.h). One block per (token, head) for the partial rows, one
// thread per (row, KV head) for the scores, one block per KV head for the maxima, the counts and the
// top rows (a 4 x 8-bit radix select of the chosen-th largest score, then an ascending compaction), one
// thread per 16 bytes for the gather.
#include <cuda_fp16.h>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <cmath>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_types.cuh"
#include "backend/cuda/spec.h"

namespace kvtier::cuda {
namespace {

constexpr int kRowThreads = 128;     // partial rows / queries: threads over the k columns
constexpr int kScoreThreads = 256;   // scores: rows per block
constexpr int kSelectThreads = 512;  // per-head maxima, counts and selection
constexpr int kGatherThreads = 256;
constexpr int kMaxGroup = 16;  // query heads per KV head the score kernel keeps in registers

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

__device__ __forceinline__ float load_f32(const float* p) {
  return *p;
}
__device__ __forceinline__ float load_f32(const uint16_t* p) {
  return __half2float(__ushort_as_half(*p));
}

// x [d] (token t at x + t * token_stride, head g at + g * head_stride) times b [d][k] -> pk row, f16.
template <typename X>
__global__ void partial_rows_kernel(const X* x, int64_t token_stride, int64_t head_stride, int64_t d,
                                    const float* b, int64_t k, uint16_t* pk, int64_t pk_head_stride,
                                    int64_t ld, int64_t row0) {
  extern __shared__ float xs[];  // [d]
  const int64_t t = blockIdx.x, g = blockIdx.y;
  const X* xr = x + t * token_stride + g * head_stride;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) xs[i] = load_f32(xr + i);
  __syncthreads();
  const float* bg = b + g * d * k;
  uint16_t* out = pk + g * pk_head_stride + (row0 + t) * ld;
  for (int64_t c = threadIdx.x; c < ld; c += blockDim.x) {
    if (c >= k) {
      out[c] = 0;  // padding: zero, so rows are the same bytes whatever wrote them
      continue;
    }
    float acc = 0.0f;
    for (int64_t i = 0; i < d; ++i) acc = __fmaf_rn(xs[i], bg[i * k + c], acc);
    out[c] = __half_as_ushort(__float2half_rn(acc));
  }
}

// Column scores of KV head g (blockIdx.y), columns c0 .. c0 + 32 (blockIdx.x): thread (tx, ty) takes
// column c0 + tx and the tokens ty, ty + 8, ...; A's 32 columns sit in shared memory. Each thread's
// partial sum is f64; the 8 lanes are added in lane order at the end.
constexpr int kColTile = 32;
constexpr int kTokLanes = 8;
__global__ void column_scores_kernel(const float* q, int64_t n_head, const float* k, int64_t k_token_stride,
                                     int64_t n_tokens, int64_t G, int64_t d, const float* a, double* score) {
  extern __shared__ float as[];  // [d][kColTile]
  __shared__ double part[kTokLanes][kColTile];
  const int64_t g = blockIdx.y;
  const int64_t c0 = blockIdx.x * int64_t{kColTile};
  const int tx = threadIdx.x % kColTile, ty = threadIdx.x / kColTile;
  const float* ag = a + g * d * d;
  for (int64_t i = threadIdx.x; i < d * kColTile; i += blockDim.x) {
    const int64_t r = i / kColTile, c = c0 + i % kColTile;
    as[i] = c < d ? ag[r * d + c] : 0.0f;
  }
  __syncthreads();
  double acc = 0.0;
  for (int64_t t = ty; t < n_tokens; t += kTokLanes) {
    float tok = 0.0f;  // this token's terms, in a fixed order: the group's query heads, then the key
    for (int64_t j = 0; j <= G; ++j) {
      const float* x = j < G ? q + (t * n_head + g * G + j) * d : k + t * k_token_stride + g * d;
      float dot = 0.0f;
      for (int64_t i = 0; i < d; ++i) dot = __fmaf_rn(x[i], as[i * kColTile + tx], dot);
      tok = __fadd_rn(tok, fabsf(dot));
    }
    acc += tok;
  }
  part[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && c0 + tx < d) {
    double sum = 0.0;
    for (int l = 0; l < kTokLanes; ++l) sum += part[l][tx];
    score[g * d + c0 + tx] += sum;
  }
}

__global__ void partial_query_kernel(const float* q, int64_t G, int64_t d, const float* b, int64_t k,
                                     float* qp) {
  extern __shared__ float qs[];  // [d]
  const int64_t j = blockIdx.x;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) qs[i] = q[j * d + i];
  __syncthreads();
  const float* bg = b + (j / G) * d * k;
  for (int64_t c = threadIdx.x; c < k; c += blockDim.x) {
    float acc = 0.0f;
    for (int64_t i = 0; i < d; ++i) acc = __fmaf_rn(qs[i], bg[i * k + c], acc);
    qp[j * k + c] = acc;
  }
}

// Scores of rows t of KV head g (blockIdx.y) for its G query heads. kPerHead: each head's S_j into
// hs[j][t]; else the group's max over j into gs[g][t].
template <bool kPerHead>
__global__ void scores_kernel(SpecScoresArgs a, int64_t G) {
  extern __shared__ float qps[];  // [G][k]
  const int64_t g = blockIdx.y;
  for (int64_t i = threadIdx.x; i < G * a.k; i += blockDim.x) qps[i] = a.qp[g * G * a.k + i];
  __syncthreads();
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= a.n_rows) return;
  const __half* row = reinterpret_cast<const __half*>(a.pk + g * a.pk_head_stride + t * a.ld);
  float acc[kMaxGroup];
  for (int64_t j = 0; j < G; ++j) acc[j] = 0.0f;
  for (int64_t c = 0; c < a.k; ++c) {
    const float p = __half2float(row[c]);
    for (int64_t j = 0; j < G; ++j) acc[j] = __fmaf_rn(qps[j * a.k + c], p, acc[j]);
  }
  if (kPerHead) {
    for (int64_t j = 0; j < G; ++j)
      a.head_scratch[(g * G + j) * a.gs_stride + t] = __fmul_rn(a.scale, acc[j]);
  } else {
    float m = -INFINITY;
    for (int64_t j = 0; j < G; ++j) m = fmaxf(m, __fmul_rn(a.scale, acc[j]));
    a.gs[g * a.gs_stride + t] = m;
  }
}

// Each query head's maximum over its rows: hmax[j] (blockIdx.x = j).
__global__ void head_max_kernel(const float* hs, int64_t stride, int64_t n_rows, float* hmax) {
  using Reduce = cub::BlockReduce<float, kSelectThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const float* r = hs + blockIdx.x * stride;
  float m = -INFINITY;
  for (int64_t t = threadIdx.x; t < n_rows; t += blockDim.x) m = fmaxf(m, r[t]);
  const float all = Reduce(tmp).Reduce(m, MaxOp());
  if (threadIdx.x == 0) hmax[blockIdx.x] = all;
}

// kRelative: S_g[t] = max_j (S_j[t] - max S_j).
__global__ void relative_kernel(SpecScoresArgs a, int64_t G, const float* hmax) {
  const int64_t g = blockIdx.y;
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= a.n_rows) return;
  float m = -INFINITY;
  for (int64_t j = 0; j < G; ++j) {
    const int64_t h = g * G + j;
    m = fmaxf(m, __fsub_rn(a.head_scratch[h * a.gs_stride + t], hmax[h]));
  }
  a.gs[g * a.gs_stride + t] = m;
}

// Order-preserving key of a score (larger float, larger key; -0 is +0).
__device__ __forceinline__ uint32_t score_key(float f) {
  if (f == 0.0f) f = 0.0f;
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// c_g = #{t : S_g[t] > max S_g - alpha} (blockIdx.x = g).
__global__ void count_kernel(SpecChooseArgs a) {
  using Reduce = cub::BlockReduce<float, kSelectThreads>;
  using Sum = cub::BlockReduce<int, kSelectThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  __shared__ typename Sum::TempStorage tmp_sum;
  __shared__ float shared_max;
  const float* s = a.gs + blockIdx.x * a.gs_stride;
  float m = -INFINITY;
  for (int64_t t = threadIdx.x; t < a.n_rows; t += blockDim.x) m = fmaxf(m, s[t]);
  const float all = Reduce(tmp).Reduce(m, MaxOp());
  if (threadIdx.x == 0) shared_max = all;
  __syncthreads();
  const float thr = __fsub_rn(shared_max, a.alpha);
  int c = 0;
  for (int64_t t = threadIdx.x; t < a.n_rows; t += blockDim.x) c += s[t] > thr ? 1 : 0;
  const int total = Sum(tmp_sum).Sum(c);
  if (threadIdx.x == 0) a.counts[blockIdx.x] = total;
}

// n_sel = floor(mean_g c_g); chosen = T when T <= cap, else min(n_sel, cap).
__global__ void decide_kernel(SpecChooseArgs a) {
  int64_t sum = 0;
  for (int64_t g = 0; g < a.n_head_kv; ++g) sum += a.counts[g];
  const int64_t n_sel = sum / a.n_head_kv;
  const int64_t chosen = a.n_rows <= a.cap ? a.n_rows : (n_sel < a.cap ? n_sel : a.cap);
  *a.n_sel = static_cast<int32_t>(n_sel);
  *a.chosen = static_cast<int32_t>(chosen);
}

// The chosen largest rows of head g (blockIdx.x), ascending, into idx[g][.].
__global__ void select_kernel(SpecChooseArgs a) {
  using Scan = cub::BlockScan<int, kSelectThreads>;
  __shared__ typename Scan::TempStorage scan_tmp;
  __shared__ int hist[256];
  __shared__ uint32_t shared_prefix;
  __shared__ int shared_left;
  const int64_t T = a.n_rows;
  const int64_t chosen = *a.chosen;
  int32_t* out = a.idx + blockIdx.x * a.idx_stride;
  if (chosen >= T) {  // every row
    for (int64_t t = threadIdx.x; t < T; t += blockDim.x) out[t] = static_cast<int32_t>(t);
    return;
  }
  const float* s = a.gs + blockIdx.x * a.gs_stride;
  // The chosen-th largest key, 8 bits at a time from the top; `left` of the keys equal to it are taken.
  uint32_t prefix = 0, mask = 0;
  int left = static_cast<int>(chosen);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0;
    __syncthreads();
    for (int64_t t = threadIdx.x; t < T; t += blockDim.x) {
      const uint32_t key = score_key(s[t]);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xFFu], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int above = 0;
      int b = 255;
      for (; b > 0; --b) {
        if (above + hist[b] >= left) break;
        above += hist[b];
      }
      shared_prefix = prefix | (static_cast<uint32_t>(b) << shift);
      shared_left = left - above;
    }
    __syncthreads();
    prefix = shared_prefix;
    left = shared_left;
    mask |= 0xFFu << shift;
    __syncthreads();
  }
  // Ascending compaction: thread i owns rows [t0, t1); a row's place is the number of chosen rows before it.
  const int64_t per = (T + blockDim.x - 1) / blockDim.x;
  const int64_t t0 = threadIdx.x * per;
  const int64_t t1 = t0 + per < T ? t0 + per : T;
  int gt = 0, eq = 0;
  for (int64_t t = t0; t < t1; ++t) {
    const uint32_t key = score_key(s[t]);
    gt += key > prefix ? 1 : 0;
    eq += key == prefix ? 1 : 0;
  }
  int gt_before = 0, eq_before = 0;
  Scan(scan_tmp).ExclusiveSum(gt, gt_before);
  __syncthreads();
  Scan(scan_tmp).ExclusiveSum(eq, eq_before);
  for (int64_t t = t0; t < t1; ++t) {
    const uint32_t key = score_key(s[t]);
    if (key > prefix) {
      out[gt_before + (eq_before < left ? eq_before : left)] = static_cast<int32_t>(t);
      ++gt_before;
    } else if (key == prefix && eq_before < left) {
      out[gt_before + eq_before] = static_cast<int32_t>(t);
      ++eq_before;
    }
  }
}

// kFlat: thread i moves 16-byte chunk (i % chunks) of row i / chunks of plane blockIdx.y (2g + kv).
__global__ void gather_flat_kernel(const uint8_t* src, size_t src_plane_bytes, uint8_t* dst,
                                   size_t dst_plane_bytes, size_t row_bytes, const int32_t* idx,
                                   int64_t idx_stride, const int32_t* chosen) {
  const int64_t plane = blockIdx.y;
  const int64_t chunks = static_cast<int64_t>(row_bytes / 16);
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const int64_t row = i / chunks;
  if (row >= *chosen) return;
  const int64_t c = i % chunks;
  const int64_t from = idx[(plane / 2) * idx_stride + row];
  const auto* s = reinterpret_cast<const uint4*>(src + plane * src_plane_bytes + from * row_bytes) + c;
  reinterpret_cast<uint4*>(dst + plane * dst_plane_bytes + row * row_bytes)[c] = *s;
}

// kPersistent: the items (plane, row, chunk) of the chosen rows, row-major within a plane, taken
// kUnroll at a time per thread (all loads, then all stores) in a grid-stride loop.
constexpr int kUnroll = 4;
__global__ void gather_persistent_kernel(const uint8_t* src, size_t src_plane_bytes, uint8_t* dst,
                                         size_t dst_plane_bytes, size_t row_bytes, int64_t n_planes,
                                         const int32_t* idx, int64_t idx_stride, const int32_t* chosen) {
  const int64_t chunks = static_cast<int64_t>(row_bytes / 16);
  const int64_t per_plane = static_cast<int64_t>(*chosen) * chunks;
  const int64_t total = per_plane * n_planes;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t base = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; base < total;
       base += stride * kUnroll) {
    uint4 v[kUnroll];
    uint4* to[kUnroll];  // each load's destination, found with its source
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t i = base + u * stride;
      to[u] = nullptr;
      if (i < total) {
        const int64_t plane = i / per_plane;
        const int64_t r = i % per_plane;
        const int64_t row = r / chunks, c = r % chunks;
        const int64_t from = idx[(plane / 2) * idx_stride + row];
        v[u] = reinterpret_cast<const uint4*>(src + plane * src_plane_bytes + from * row_bytes)[c];
        to[u] = reinterpret_cast<uint4*>(dst + plane * dst_plane_bytes + row * row_bytes) + c;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (to[u] != nullptr) *to[u] = v[u];
    }
  }
}

// One block per (token, head) of partial_rows_kernel: f32 rows (a pass's keys) or f16 rows (host planes).
template <typename X>
void launch_partial_rows(const X* x, int64_t token_stride, int64_t head_stride, int64_t n_tokens,
                         int64_t n_heads, int64_t d, const float* b, int64_t k, uint16_t* pk,
                         int64_t pk_head_stride, int64_t ld, int64_t row0, cudaStream_t stream) {
  if (n_tokens <= 0 || n_heads <= 0) return;
  KVTIER_ASSERT(k > 0 && ld >= k && d > 0 && n_heads <= 65535);
  const dim3 grid(static_cast<unsigned>(n_tokens), static_cast<unsigned>(n_heads));
  partial_rows_kernel<X><<<grid, kRowThreads, static_cast<size_t>(d) * 4, stream>>>(
      x, token_stride, head_stride, d, b, k, pk, pk_head_stride, ld, row0);
  KVTIER_CUDA_CHECK_LAUNCH("partial_rows_kernel");
}

}  // namespace

int64_t spec_row_stride(int64_t k) {
  return (k + 7) / 8 * 8;
}

void spec_partial_rows(const float* x, int64_t token_stride, int64_t n_tokens, int64_t n_heads, int64_t d,
                       const float* b, int64_t k, uint16_t* pk, int64_t pk_head_stride, int64_t ld,
                       int64_t row0, cudaStream_t stream) {
  launch_partial_rows(x, token_stride, d, n_tokens, n_heads, d, b, k, pk, pk_head_stride, ld, row0, stream);
}

void spec_partial_rows_f16(const uint16_t* x, int64_t head_stride, int64_t n_tokens, int64_t n_heads,
                           int64_t d, const float* b, int64_t k, uint16_t* pk, int64_t pk_head_stride,
                           int64_t ld, int64_t row0, cudaStream_t stream) {
  launch_partial_rows(x, d, head_stride, n_tokens, n_heads, d, b, k, pk, pk_head_stride, ld, row0, stream);
}

void spec_column_scores(const float* q, int64_t n_head, const float* k, int64_t k_token_stride,
                        int64_t n_tokens, int64_t n_head_kv, int64_t d, const float* a, double* score,
                        cudaStream_t stream) {
  if (n_tokens <= 0) return;
  KVTIER_ASSERT(n_head_kv > 0 && n_head % n_head_kv == 0 && d > 0);
  const size_t smem = static_cast<size_t>(d) * kColTile * 4;
  KVTIER_ASSERT(smem <= 48 * 1024, "head size {} is too large for the column-score kernel", d);
  const dim3 grid(static_cast<unsigned>((d + kColTile - 1) / kColTile), static_cast<unsigned>(n_head_kv));
  column_scores_kernel<<<grid, kColTile * kTokLanes, smem, stream>>>(q, n_head, k, k_token_stride, n_tokens,
                                                                     n_head / n_head_kv, d, a, score);
  KVTIER_CUDA_CHECK_LAUNCH("column_scores_kernel");
}

void spec_partial_query(const float* q, int64_t n_head, int64_t G, int64_t d, const float* b, int64_t k,
                        float* qp, cudaStream_t stream) {
  KVTIER_ASSERT(n_head > 0 && G > 0 && n_head % G == 0 && k > 0);
  partial_query_kernel<<<static_cast<unsigned>(n_head), kRowThreads, static_cast<size_t>(d) * 4, stream>>>(
      q, G, d, b, k, qp);
  KVTIER_CUDA_CHECK_LAUNCH("partial_query_kernel");
}

void spec_group_scores(const SpecScoresArgs& a, cudaStream_t stream) {
  KVTIER_ASSERT(a.n_head > 0 && a.n_head_kv > 0 && a.n_head % a.n_head_kv == 0 && a.n_rows >= 1 &&
                a.n_rows <= a.gs_stride && a.k > 0 && a.ld >= a.k);
  const int64_t G = a.n_head / a.n_head_kv;
  KVTIER_ASSERT(G <= kMaxGroup, "{} query heads per KV head (at most {})", G, kMaxGroup);
  const dim3 grid(static_cast<unsigned>((a.n_rows + kScoreThreads - 1) / kScoreThreads),
                  static_cast<unsigned>(a.n_head_kv));
  const size_t smem = static_cast<size_t>(G * a.k) * 4;
  if (a.relative && G > 1) {
    KVTIER_ASSERT(a.head_scratch != nullptr);
    scores_kernel<true><<<grid, kScoreThreads, smem, stream>>>(a, G);
    KVTIER_CUDA_CHECK_LAUNCH("scores_kernel");
    // The heads' maxima sit after the head scores' rows: [n_head] floats at head_scratch + n_head * stride.
    float* hmax = a.head_scratch + a.n_head * a.gs_stride;
    head_max_kernel<<<static_cast<unsigned>(a.n_head), kSelectThreads, 0, stream>>>(
        a.head_scratch, a.gs_stride, a.n_rows, hmax);
    KVTIER_CUDA_CHECK_LAUNCH("head_max_kernel");
    relative_kernel<<<grid, kScoreThreads, 0, stream>>>(a, G, hmax);
    KVTIER_CUDA_CHECK_LAUNCH("relative_kernel");
  } else {
    scores_kernel<false><<<grid, kScoreThreads, smem, stream>>>(a, G);
    KVTIER_CUDA_CHECK_LAUNCH("scores_kernel");
  }
}

void spec_choose_rows(const SpecChooseArgs& a, cudaStream_t stream) {
  KVTIER_ASSERT(a.n_head_kv > 0 && a.n_rows >= 1 && a.cap >= 1 && a.n_rows <= a.gs_stride &&
                a.idx_stride >= (a.n_rows < a.cap ? a.n_rows : a.cap) && a.n_rows < (int64_t{1} << 31));
  KVTIER_ASSERT(a.alpha > 0.0f, "alpha {} must be > 0", a.alpha);
  const auto heads = static_cast<unsigned>(a.n_head_kv);
  count_kernel<<<heads, kSelectThreads, 0, stream>>>(a);
  KVTIER_CUDA_CHECK_LAUNCH("count_kernel");
  decide_kernel<<<1, 1, 0, stream>>>(a);
  KVTIER_CUDA_CHECK_LAUNCH("decide_kernel");
  select_kernel<<<heads, kSelectThreads, 0, stream>>>(a);
  KVTIER_CUDA_CHECK_LAUNCH("select_kernel");
}

void spec_gather_rows(const uint8_t* src, size_t src_plane_bytes, uint8_t* dst, size_t dst_plane_bytes,
                      size_t row_bytes, int64_t n_heads, const int32_t* idx, int64_t idx_stride,
                      const int32_t* chosen, int64_t max_rows, cudaStream_t stream, GatherKernel kernel,
                      int blocks) {
  if (max_rows <= 0 || n_heads <= 0) return;
  KVTIER_ASSERT(row_bytes % 16 == 0 && row_bytes > 0, "row of {} bytes (a multiple of 16 is needed)",
                row_bytes);
  const int64_t work = max_rows * static_cast<int64_t>(row_bytes / 16);  // per plane, at most
  if (kernel == GatherKernel::kFlat) {
    const dim3 grid(static_cast<unsigned>((work + kGatherThreads - 1) / kGatherThreads),
                    static_cast<unsigned>(2 * n_heads));
    gather_flat_kernel<<<grid, kGatherThreads, 0, stream>>>(src, src_plane_bytes, dst, dst_plane_bytes,
                                                            row_bytes, idx, idx_stride, chosen);
    KVTIER_CUDA_CHECK_LAUNCH("gather_flat_kernel");
    return;
  }
  KVTIER_ASSERT(blocks >= 1);
  const int64_t needed = (work * 2 * n_heads + kGatherThreads * kUnroll - 1) / (kGatherThreads * kUnroll);
  const auto grid = static_cast<unsigned>(std::min<int64_t>(blocks, std::max<int64_t>(needed, 1)));
  gather_persistent_kernel<<<grid, kGatherThreads, 0, stream>>>(
      src, src_plane_bytes, dst, dst_plane_bytes, row_bytes, 2 * n_heads, idx, idx_stride, chosen);
  KVTIER_CUDA_CHECK_LAUNCH("gather_persistent_kernel");
}

}  // namespace kvtier::cuda
