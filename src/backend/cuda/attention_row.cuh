// Device building blocks of the attention kernels (attention.cu, attention_merge.cu): the state of
// one (query token, query head) row held by one warp, its online-softmax step over one tile of keys,
// the ordered merge of chunk partials and the final store. Every operation is an explicitly rounded
// intrinsic (no FMA contraction left to the compiler), so the same inputs give the same bits in
// every kernel that uses these functions, whatever the surrounding code.
#pragma once

#ifndef KVTIER_CUDA_EMULATION
#include <math_constants.h>
#endif

#include "backend/cuda/attention.h"

// The host emulation (tests/cuda/cuda_emu.h) compiles this device code as host code: it goes into
// its own namespace there, so that no symbol can collide with the CUDA build's.
#ifdef KVTIER_CUDA_EMULATION
#define KVTIER_ATTN_NS attn_emu
#else
#define KVTIER_ATTN_NS attn
#endif

namespace kvtier::cuda::KVTIER_ATTN_NS {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kDimSlots = static_cast<int>(kAttnMaxHeadDim) / kWarp;  // output dims per lane
static_assert(kAttnTile == kWarp, "one key of a tile per lane");
static_assert(kAttnChunk % kAttnTile == 0, "tiles never cross chunks");

// Lane l of the row's warp holds output dims l, l + 32, ... (< head_dim_v).
struct RowState {
  float m;               // running max of the scores (-inf: no key seen yet)
  float l;               // running sum of exp(score - m)
  float acc[kDimSlots];  // running numerator sum_j exp(s_j - m) v_j, this lane's dims
};

__device__ __forceinline__ void row_reset(RowState& s) {
  s.m = -CUDART_INF_F;
  s.l = 0.0f;
#pragma unroll
  for (int u = 0; u < kDimSlots; ++u) s.acc[u] = 0.0f;
}

// Butterfly reductions: every lane ends with the same bits (each level combines symmetric pairs).
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int off = kWarp / 2; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
}

// One online-softmax step over the visible keys [jlo, jhi) (jlo < jhi) of a tile in shared memory.
// Slot j of the tile is the key at absolute position tile_base + j (tile_base a multiple of
// kAttnTile), so the order of the sums depends on key positions only.
//   q: [dk] f32 (shared), kt: [kAttnTile, k_stride] f32 (shared), vt: [kAttnTile, dv] f32 (shared)
__device__ __forceinline__ void row_tile(RowState& st, const float* q, const float* kt, int k_stride,
                                         const float* vt, int dk, int dv, int jlo, int jhi, float scale,
                                         float softcap) {
  const int lane = threadIdx.x % kWarp;
  const bool mine = lane >= jlo && lane < jhi;
  float s = -CUDART_INF_F;
  if (mine) {
    const float* kr = kt + lane * k_stride;
    float d = 0.0f;
    for (int i = 0; i < dk; ++i) d = __fmaf_rn(q[i], kr[i], d);
    s = __fmul_rn(d, scale);
    if (softcap > 0.0f) s = __fmul_rn(softcap, tanhf(__fdiv_rn(s, softcap)));
  }
  const float m_new = fmaxf(st.m, warp_max(s));
  const float c = expf(__fsub_rn(st.m, m_new));  // 0 when nothing was seen yet
  const float p = mine ? expf(__fsub_rn(s, m_new)) : 0.0f;
  st.l = __fadd_rn(__fmul_rn(st.l, c), warp_sum(p));
#pragma unroll
  for (int u = 0; u < kDimSlots; ++u) st.acc[u] = __fmul_rn(st.acc[u], c);
  for (int j = jlo; j < jhi; ++j) {
    const float pj = __shfl_sync(kFullMask, p, j);
    const float* vr = vt + j * dv;
#pragma unroll
    for (int u = 0; u < kDimSlots; ++u) {
      const int i = u * kWarp + lane;
      if (i < dv) st.acc[u] = __fmaf_rn(pj, vr[i], st.acc[u]);
    }
  }
  st.m = m_new;
}

// run <- run (+) part, partials over disjoint, consecutive key chunks merged in chunk order.
__device__ __forceinline__ void row_merge(RowState& run, const RowState& part) {
  if (part.m == -CUDART_INF_F) return;  // the chunk had no visible key: no-op
  if (run.m == -CUDART_INF_F) {
    run = part;
    return;
  }
  const float mn = fmaxf(run.m, part.m);
  const float ca = expf(__fsub_rn(run.m, mn));
  const float cb = expf(__fsub_rn(part.m, mn));
  run.l = __fadd_rn(__fmul_rn(run.l, ca), __fmul_rn(part.l, cb));
#pragma unroll
  for (int u = 0; u < kDimSlots; ++u)
    run.acc[u] = __fadd_rn(__fmul_rn(run.acc[u], ca), __fmul_rn(part.acc[u], cb));
  run.m = mn;
}

// o = acc / l ([dv] f32, this lane's dims), *lse = m + log(l); o = 0, lse = -inf when l == 0.
__device__ __forceinline__ void row_store(const RowState& s, int dv, float* o, float* lse) {
  const int lane = threadIdx.x % kWarp;
  const bool any = s.l > 0.0f;
  const float inv = any ? __fdiv_rn(1.0f, s.l) : 0.0f;
#pragma unroll
  for (int u = 0; u < kDimSlots; ++u) {
    const int i = u * kWarp + lane;
    if (i < dv) o[i] = any ? __fmul_rn(s.acc[u], inv) : 0.0f;
  }
  if (lse != nullptr && lane == 0) *lse = any ? __fadd_rn(s.m, logf(s.l)) : -CUDART_INF_F;
}

// Partial results of the split schedule in device scratch, chunk-major:
//   o:  [n_chunks, n_tokens, n_heads, dv] f32, ml: [n_chunks, n_tokens, n_heads, 2] f32 (m, l).
struct Partials {
  float* o = nullptr;
  float* ml = nullptr;
};

__device__ __forceinline__ void row_save(const RowState& s, int dv, int64_t row, Partials part) {
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int u = 0; u < kDimSlots; ++u) {
    const int i = u * kWarp + lane;
    if (i < dv) part.o[row * dv + i] = s.acc[u];
  }
  if (lane == 0) {
    part.ml[row * 2] = s.m;
    part.ml[row * 2 + 1] = s.l;
  }
}

__device__ __forceinline__ void row_load(RowState& s, int dv, int64_t row, const Partials part) {
  const int lane = threadIdx.x % kWarp;
  s.m = part.ml[row * 2];
  s.l = part.ml[row * 2 + 1];
#pragma unroll
  for (int u = 0; u < kDimSlots; ++u) {
    const int i = u * kWarp + lane;
    s.acc[u] = i < dv ? part.o[row * dv + i] : 0.0f;
  }
}

}  // namespace kvtier::cuda::KVTIER_ATTN_NS
