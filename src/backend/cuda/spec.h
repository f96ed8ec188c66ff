// InfiniGen's decode-time speculation on the GPU (specs/infinigen.md §5.2, §6.2-6.3, §15.5-15.6,
// §15.11), the device twin of policy/infinigen_select.h: partial rows of keys and queries, the
// estimated scores of a layer's stored rows, the threshold / shared count / cap rule, the chosen rows
// of every KV head, and the gather of those rows from pinned host planes into a staging buffer.
// Host functions taking device pointers; they only enqueue work on the given stream.
//
//   S_j[t] = scale * sum_c qp[j][c] * pk[g(j)][t][c]                 (f32; pk f16 widened exactly)
//   S_g[t] = max over g's query heads j of S_j[t]                     (group kMax, or G == 1)
//            max over j of (S_j[t] - max_t' S_j[t'])                  (group kRelative, G > 1)
//   m_g = max_t S_g[t];  c_g = #{t : S_g[t] > m_g - alpha};  n_sel = floor(mean_g c_g)
//   chosen = T when T <= cap, else min(n_sel, cap)       (the same count for every KV head)
//   rows of g = the `chosen` largest S_g[t] (ties: the lower row), in ascending row order
//
// The scores' sums run in another order than the CPU's (policy::speculate), so S may differ from the
// host's in the last bits; the rule applied to given scores is exact (tests/cuda/test_spec.cpp).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace kvtier::cuda {

// Row stride (in halves) of a partial-key plane of k columns: k rounded up to 8 (16-byte rows).
int64_t spec_row_stride(int64_t k);

// Partial keys of new rows: for token t < n_tokens and head g < n_heads,
//   pk[g * pk_head_stride + (row0 + t) * ld + c] = f16_rn(sum_i x[t * token_stride + g * d + i] * b[g][i][c])
//   x: f32 device (K after RoPE), b: [n_heads][d][k] f32 device (B = A[:, cols] per head)
void spec_partial_rows(const float* x, int64_t token_stride, int64_t n_tokens, int64_t n_heads, int64_t d,
                       const float* b, int64_t k, uint16_t* pk, int64_t pk_head_stride, int64_t ld,
                       int64_t row0, cudaStream_t stream);

// The same for rows stored as f16 (the host planes' keys, device-addressable): row t of head g at
// x + g * head_stride + t * d (f16 bits), t < n_tokens; written to pk rows [row0, row0 + n_tokens).
void spec_partial_rows_f16(const uint16_t* x, int64_t head_stride, int64_t n_tokens, int64_t n_heads,
                           int64_t d, const float* b, int64_t k, uint16_t* pk, int64_t pk_head_stride,
                           int64_t ld, int64_t row0, cudaStream_t stream);

// The prompt's column scores (§5.1: the per-sequence partial columns), accumulated pass by pass:
//   score[g][c] += sum over tokens t of ( sum over g's query heads j of |(q[t][j] A_g)[c]|
//                                         + |(k[t][g] A_g)[c]| )
//   q: [n_tokens, n_head, d] f32, k: token t head g at k + t * k_token_stride + g * d (both after RoPE)
//   a: [n_head_kv][d][d] f32 (A_g row-major), score: [n_head_kv][d] f64 (device)
// Products in f32, each token's terms added in a fixed order: the same bits from run to run.
void spec_column_scores(const float* q, int64_t n_head, const float* k, int64_t k_token_stride,
                        int64_t n_tokens, int64_t n_head_kv, int64_t d, const float* a, double* score,
                        cudaStream_t stream);

// Partial queries of one token: qp[j][c] = sum_i q[j * d + i] * b[j / G][i][c]   (f32)
//   q: [n_head, d] f32 device (after RoPE), b: [n_head / G][d][k] f32, qp: [n_head, k] f32
void spec_partial_query(const float* q, int64_t n_head, int64_t G, int64_t d, const float* b, int64_t k,
                        float* qp, cudaStream_t stream);

// The group scores S_g[t] of a layer for rows t < n_rows:
//   qp: [n_head, k] f32; pk: head g's rows at pk + g * pk_head_stride, row t at + t * ld (f16 bits)
//   gs: [n_head_kv][gs_stride] f32 out
//   head_scratch: [n_head * gs_stride + n_head] f32 (kRelative with G > 1: each head's scores, then maxima)
struct SpecScoresArgs {
  const float* qp = nullptr;
  const uint16_t* pk = nullptr;
  int64_t pk_head_stride = 0;  // halves
  int64_t ld = 0;              // halves per row (spec_row_stride(k))
  int64_t k = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t n_rows = 0;  // T >= 1
  float scale = 1.0f;
  bool relative = true;  // InfinigenGroup::kRelative (used when G > 1)
  float* gs = nullptr;
  int64_t gs_stride = 0;
  float* head_scratch = nullptr;
};
void spec_group_scores(const SpecScoresArgs& a, cudaStream_t stream);

// The rule above on given group scores gs: [n_head_kv][gs_stride] (rows t < n_rows):
//   idx: [n_head_kv][idx_stride] i32, the first *chosen of each head written, ascending
//   counts: [n_head_kv] i32 c_g;  chosen, n_sel: [1] i32 (device)
// cap >= 1 (policy::speculation_cap); idx_stride >= min(n_rows, cap).
struct SpecChooseArgs {
  const float* gs = nullptr;
  int64_t gs_stride = 0;
  int64_t n_head_kv = 0;
  int64_t n_rows = 0;
  int64_t cap = 1;
  float alpha = 5.0f;  // > 0, +inf allowed
  int32_t* idx = nullptr;
  int64_t idx_stride = 0;
  int32_t* counts = nullptr;
  int32_t* chosen = nullptr;
  int32_t* n_sel = nullptr;
};
void spec_choose_rows(const SpecChooseArgs& a, cudaStream_t stream);

// The chosen rows of every head from host planes into a staging buffer, for i < *chosen (device):
//   src: head g's K plane at src + g * 2 * src_plane_bytes, its V plane src_plane_bytes further
//        (pinned host memory the device can address: cudaHostAlloc under unified addressing)
//   dst: head g's K rows at dst + g * 2 * dst_plane_bytes, V at dst_plane_bytes further (device)
//   dst row i of K and V = src row idx[g * idx_stride + i]; row_bytes a multiple of 16
// max_rows >= *chosen bounds the launch (the host knows min(T, cap), not the count itself).
// The kernel's shape (bench/bench_gather_cuda.cpp measures both against a copy-engine copy):
//   kFlat        one thread per 16 bytes of every row that may be chosen: a grid as large as the work,
//                which waits for SM slots behind the compute kernels it should overlap
//   kPersistent  `blocks` blocks (about one per SM) looping over the work with 4 loads in flight per
//                thread: a small share of each SM, resident beside the compute kernels
enum class GatherKernel { kFlat, kPersistent };
void spec_gather_rows(const uint8_t* src, size_t src_plane_bytes, uint8_t* dst, size_t dst_plane_bytes,
                      size_t row_bytes, int64_t n_heads, const int32_t* idx, int64_t idx_stride,
                      const int32_t* chosen, int64_t max_rows, cudaStream_t stream,
                      GatherKernel kernel = GatherKernel::kPersistent, int blocks = 132);

}  // namespace kvtier::cuda
