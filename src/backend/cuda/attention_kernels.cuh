// Device code of the attention (attention.h): the tile kernel, serving one KV head and a tile of
// query tokens per block, and the ordered merge of the split schedule's partials. A block's rows are
// (token, query head) pairs, kRowsPerWarp rows per warp; K/V tiles of kAttnTile keys are converted
// to f32 in shared memory and every row runs its online-softmax step on them (attention_row.cuh).
// Correctness first: scalar FMAs, no tensor cores.
// Included by attention.cu, and by the host emulation test (tests/cuda/test_attention_emu.cpp),
// which defines KVTIER_CUDA_EMULATION and provides the CUDA built-ins itself.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/cuda/attention.h"
#include "backend/cuda/attention_row.cuh"
#ifndef KVTIER_CUDA_EMULATION
#include "backend/cuda/device_types.cuh"  // to_f32
#define KVTIER_ATTN_DYNAMIC_SMEM(name) extern __shared__ float name[]
#endif

namespace kvtier::cuda::KVTIER_ATTN_NS {

constexpr int kRowsPerWarp = 2;
constexpr int kMaxRowsPerBlock = 32;
constexpr int kMaxThreads = kMaxRowsPerBlock / kRowsPerWarp * kWarp;
// At least this many threads per block, whatever the rows: a decode block has only q_per_kv rows
// (one or two warps), and with so few threads the K/V tile loads were a chain of dependent global
// reads (Nsight Compute on an H200, SmolLM2 shape, 1K context: 345 us per decode attention call, 30x
// the rest of a layer). Warps past the block's rows only help load tiles; they see no key.
constexpr int kMinThreads = 256;
// Global reads each thread has in flight while loading a tile (all issued, then all stored).
constexpr int kLoadBatch = 4;

struct Launch {
  int tokens_per_block = 1;
  int rows_per_block = 1;
  int threads = kWarp;
  int64_t n_qtiles = 1;
  size_t smem_bytes = 0;
};

inline Launch plan(const AttnParams& p, const AttnQueries& q) {
  Launch l;
  const int g = static_cast<int>(p.q_per_kv);
  l.tokens_per_block = static_cast<int>(std::min<int64_t>(std::max(1, kMaxRowsPerBlock / g), q.n_tokens));
  l.rows_per_block = l.tokens_per_block * g;
  l.threads = std::max(kMinThreads, (l.rows_per_block + kRowsPerWarp - 1) / kRowsPerWarp * kWarp);
  l.n_qtiles = (q.n_tokens + l.tokens_per_block - 1) / l.tokens_per_block;
  const size_t dk = static_cast<size_t>(p.head_dim_k), dv = static_cast<size_t>(p.head_dim_v);
  l.smem_bytes =
      (static_cast<size_t>(l.rows_per_block) * dk + kAttnTile * (dk + 1) + kAttnTile * dv) * sizeof(float);
  return l;
}

// Converts the keys [a, b) of the tile starting at key `base` (rows of d elements of `src`, key kp at
// src + (kp - pos0) * d) to f32 rows of `dst` (row stride `stride`); other rows are left as they are.
// Each thread issues kLoadBatch reads before it stores any, so the reads overlap.
template <typename T>
__device__ __forceinline__ void load_tile(const T* src, int d, float* dst, int stride, int64_t base,
                                          int64_t a, int64_t b, int64_t pos0) {
  const int n = static_cast<int>(kAttnTile) * d;
  const int step = static_cast<int>(blockDim.x);
  for (int i0 = static_cast<int>(threadIdx.x); i0 < n; i0 += step * kLoadBatch) {
    float v[kLoadBatch];
#pragma unroll
    for (int u = 0; u < kLoadBatch; ++u) {
      const int idx = i0 + u * step;
      const int64_t kp = base + idx / d;
      v[u] = idx < n && kp >= a && kp < b ? to_f32(src[(kp - pos0) * d + idx % d]) : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < kLoadBatch; ++u) {
      const int idx = i0 + u * step;
      const int64_t kp = base + idx / d;
      if (idx < n && kp >= a && kp < b) dst[(idx / d) * stride + idx % d] = v[u];
    }
  }
}

// Grid: (query tiles, KV heads, kSplit ? chunks : 1). Shared memory:
//   qs [rows_per_block, dk] f32 | ks [kAttnTile, dk + 1] f32 | vs [kAttnTile, dv] f32
template <typename T, bool kSplit>
__global__ void __launch_bounds__(kMaxThreads)
    attn_kernel(AttnParams p, AttnQueries q, KvSpan span, AttnOutput out, Partials part, int tokens_per_block,
                int64_t chunk0, int64_t n_chunks) {
  KVTIER_ATTN_DYNAMIC_SMEM(smem);
  const int dk = static_cast<int>(p.head_dim_k), dv = static_cast<int>(p.head_dim_v);
  const int g = static_cast<int>(p.q_per_kv);
  const int64_t kv = blockIdx.y;
  const int64_t t0 = int64_t{blockIdx.x} * tokens_per_block;
  const int64_t t1 = min(q.n_tokens, t0 + tokens_per_block);
  const int rows = static_cast<int>(t1 - t0) * g;
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const int k_stride = dk + 1;  // padded: lane j reads row j without bank conflicts

  float* qs = smem;
  float* ks = qs + static_cast<size_t>(tokens_per_block) * g * dk;
  float* vs = ks + kAttnTile * k_stride;

  for (int idx = threadIdx.x; idx < rows * dk; idx += blockDim.x) {
    const int rr = idx / dk, i = idx % dk;
    const int64_t t = t0 + rr / g, h = kv * g + rr % g;
    qs[idx] = q.q[t * q.token_stride + h * dk + i];
  }

  // Rows of this warp: row index rr -> token t0 + rr / g, head kv * g + rr % g.
  const T* kbase = static_cast<const T*>(span.k) + kv * span.k_head_stride;
  const T* vbase = static_cast<const T*>(span.v) + kv * span.v_head_stride;
  const int64_t span_end = span.pos0 + span.n_tokens;
  int64_t row_lo[kRowsPerWarp], row_hi[kRowsPerWarp];  // visible keys [lo, hi) of each row
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int rr = warp * kRowsPerWarp + r;
    const int64_t qpos = q.pos0 + t0 + rr / g;
    row_lo[r] = p.window > 0 ? max(span.pos0, qpos - p.window + 1) : span.pos0;
    row_hi[r] = rr < rows ? min(span_end, qpos + 1) : span.pos0;  // rows past the tile see nothing
  }
  // Keys visible to some row of the block.
  const int64_t qpos_lo = q.pos0 + t0, qpos_hi = q.pos0 + t1 - 1;
  const int64_t key_lo = p.window > 0 ? max(span.pos0, qpos_lo - p.window + 1) : span.pos0;
  const int64_t key_hi = min(span_end, qpos_hi + 1);

  RowState run[kRowsPerWarp], cur[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) row_reset(run[r]);

  const int64_t c_first = kSplit ? chunk0 + blockIdx.z : chunk0;
  const int64_t c_last = kSplit ? c_first : chunk0 + n_chunks - 1;
  for (int64_t c = c_first; c <= c_last; ++c) {
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) row_reset(cur[r]);
    const int64_t a0 = max(c * kAttnChunk, key_lo);
    const int64_t a1 = min((c + 1) * kAttnChunk, key_hi);
    for (int64_t a = a0; a < a1;) {
      const int64_t base = a / kAttnTile * kAttnTile;
      const int64_t b = min(a1, base + kAttnTile);  // tile keys [a, b) at slots [a - base, b - base)
      __syncthreads();                              // previous tile consumed (and qs written)
      load_tile(kbase, dk, ks, k_stride, base, a, b, span.pos0);
      load_tile(vbase, dv, vs, dv, base, a, b, span.pos0);
      __syncthreads();
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const int jlo = static_cast<int>(max(a, row_lo[r]) - base);
        const int jhi = static_cast<int>(min(b, row_hi[r]) - base);
        if (jlo < jhi) {
          const float* qr = qs + (warp * kRowsPerWarp + r) * dk;
          row_tile(cur[r], qr, ks, k_stride, vs, dk, dv, jlo, jhi, p.scale, p.softcap);
        }
      }
      a = b;
    }
    if constexpr (!kSplit) {
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) row_merge(run[r], cur[r]);
    }
  }

#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int rr = warp * kRowsPerWarp + r;
    if (rr >= rows) continue;
    const int64_t t = t0 + rr / g, h = kv * g + rr % g;
    if constexpr (kSplit) {
      row_save(cur[r], dv, (int64_t{blockIdx.z} * q.n_tokens + t) * q.n_heads + h, part);
    } else {
      float* lse = out.lse != nullptr ? out.lse + t * out.lse_stride + h : nullptr;
      row_store(run[r], dv, out.o + t * out.token_stride + h * dv, lse);
    }
  }
}

constexpr int kMergeWarpsPerBlock = 4;

// One warp per (token, head) row.
__global__ void split_merge_kernel(Partials part, int64_t n_chunks, int64_t n_tokens, int64_t n_heads, int dv,
                                   AttnOutput out) {
  const int64_t row = int64_t{blockIdx.x} * kMergeWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= n_tokens * n_heads) return;
  const int64_t t = row / n_heads, h = row % n_heads;
  RowState run, cur;
  row_reset(run);
  for (int64_t c = 0; c < n_chunks; ++c) {
    row_load(cur, dv, c * n_tokens * n_heads + row, part);
    row_merge(run, cur);
  }
  float* lse = out.lse != nullptr ? out.lse + t * out.lse_stride + h : nullptr;
  row_store(run, dv, out.o + t * out.token_stride + h * dv, lse);
}

}  // namespace kvtier::cuda::KVTIER_ATTN_NS
