// The two-way log-sum-exp merge of normalised attention results over disjoint spans (attention.h).
#include "backend/cuda/attention.h"
#include "backend/cuda/attention_row.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_types.cuh"

namespace kvtier::cuda {
namespace {

using attn::kWarp;

constexpr int kWarpsPerBlock = 4;

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

void merge_attention(float* o_a, float* lse_a, const float* o_b, const float* lse_b, int64_t n, int64_t dv,
                     cudaStream_t stream) {
  if (n <= 0) return;
  const auto blocks = static_cast<unsigned>((n + kWarpsPerBlock - 1) / kWarpsPerBlock);
  merge_kernel<<<blocks, kWarpsPerBlock * kWarp, 0, stream>>>(o_a, lse_a, o_b, lse_b, n, dv);
  KVTIER_CUDA_CHECK_LAUNCH("merge_kernel");
}

}  // namespace kvtier::cuda
