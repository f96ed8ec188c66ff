// Merges of attention partial results (attention.h, attention_launch.h): the ordered merge of the
// split schedule's chunk partials (the same row_merge as the single-pass kernel, so both schedules
// give the same bits) and the two-way log-sum-exp merge of normalised results over disjoint spans.
#include "backend/cuda/attention.h"
#include "backend/cuda/attention_launch.h"
#include "backend/cuda/attention_row.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_types.cuh"

namespace kvtier::cuda {
namespace {

using attn::kWarp;
using attn::RowState;

constexpr int kWarpsPerBlock = 4;

// One warp per (token, head) row.
__global__ void split_merge_kernel(attn::Partials part, int64_t n_chunks, int64_t n_tokens, int64_t n_heads,
                                   int dv, AttnOutput out) {
  const int64_t row = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= n_tokens * n_heads) return;
  const int64_t t = row / n_heads, h = row % n_heads;
  RowState run, cur;
  attn::row_reset(run);
  for (int64_t c = 0; c < n_chunks; ++c) {
    attn::row_load(cur, dv, c * n_tokens * n_heads + row, part);
    attn::row_merge(run, cur);
  }
  float* lse = out.lse != nullptr ? out.lse + t * out.lse_stride + h : nullptr;
  attn::row_store(run, dv, out.o + t * out.token_stride + h * dv, lse);
}

// One warp per row; every lane reads both lse before lane 0 overwrites lse_a.
__global__ void merge_kernel(float* o_a, float* lse_a, const float* o_b, const float* lse_b, int64_t n,
                             int64_t dv) {
  const int64_t r = int64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / kWarp;
  if (r >= n) return;
  const int lane = static_cast<int>(threadIdx.x % kWarp);
  const float la = lse_a[r], lb = lse_b[r];
  __syncwarp();
  if (lb == -CUDART_INF_F) return;
  float* oa = o_a + r * dv;
  const float* ob = o_b + r * dv;
  if (la == -CUDART_INF_F) {
    for (int64_t i = lane; i < dv; i += kWarp) oa[i] = ob[i];
    if (lane == 0) lse_a[r] = lb;
    return;
  }
  const float mx = fmaxf(la, lb);
  const float ea = expf(__fsub_rn(la, mx)), eb = expf(__fsub_rn(lb, mx));
  const float sum = __fadd_rn(ea, eb);
  const float wa = __fdiv_rn(ea, sum), wb = __fdiv_rn(eb, sum);
  for (int64_t i = lane; i < dv; i += kWarp) oa[i] = __fadd_rn(__fmul_rn(oa[i], wa), __fmul_rn(ob[i], wb));
  if (lane == 0) lse_a[r] = __fadd_rn(mx, logf(sum));
}

}  // namespace

namespace attn {

void launch_split_merge(const float* part_o, const float* part_ml, int64_t n_chunks, int64_t n_tokens,
                        int64_t n_heads, int64_t dv, const AttnOutput& out, cudaStream_t stream) {
  const int64_t rows = n_tokens * n_heads;
  if (rows <= 0) return;
  Partials part{const_cast<float*>(part_o), const_cast<float*>(part_ml)};
  const auto blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
  split_merge_kernel<<<blocks, kWarpsPerBlock * kWarp, 0, stream>>>(part, n_chunks, n_tokens, n_heads,
                                                                    static_cast<int>(dv), out);
  KVTIER_CUDA_CHECK_LAUNCH("split_merge_kernel");
}

}  // namespace attn

void merge_attention(float* o_a, float* lse_a, const float* o_b, const float* lse_b, int64_t n, int64_t dv,
                     cudaStream_t stream) {
  if (n <= 0) return;
  const auto blocks = static_cast<unsigned>((n + kWarpsPerBlock - 1) / kWarpsPerBlock);
  merge_kernel<<<blocks, kWarpsPerBlock * kWarp, 0, stream>>>(o_a, lse_a, o_b, lse_b, n, dv);
  KVTIER_CUDA_CHECK_LAUNCH("merge_kernel");
}

}  // namespace kvtier::cuda
