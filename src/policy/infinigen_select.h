// InfiniGen's speculation (spec infinigen.md §6.2–6.3, §15.4–15.6, §15.10–15.11), pure and
// backend-free: the partial queries of layer i (from layer i-1's input) against layer i's partial
// keys give estimated attention scores; a threshold, a shared count and a cap turn them into the
// token rows layer i fetches, per KV head.
//
//   S_j[t]  = scale · sum_c qp_j[c] · pk[t][c]      (f32, c ascending, pk f16 widened exactly: A4's contract)
//   S_g[t]  = max over the query heads j of KV head g (GQA, §15.11; one head per group for MHA) of S_j[t]
//             (InfinigenGroup::kMax) or of S_j[t] - max_t' S_j[t'] (kRelative, when G > 1)
//   m[s,g]  = max_t S_g[t];  c[s,g] = #{t : S_g[t] > m[s,g] - alpha}      (strict ">", §15.6)
//   n_sel   = floor(mean over (s, g) of c[s,g])                          (heads x batch, §15.5)
//   per sequence s with cap_s (speculation_cap): every row when T_s <= cap_s, else min(n_sel, cap_s)
//   idx[s,g] = the rows of the largest S_g (ties: the lower row), in ascending row order
//
// alpha = +inf and a cap of every row select everything (the degenerate case A5 relies on).
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "core/thread_pool.h"
#include "policy/kv_policy.h"

namespace kvtier::policy {

struct InfinigenParams {
  float alpha = 5.0f;          // threshold margin in scaled-logit units (the paper: 4 for OPT, 5 for Llama-2)
  double budget = 0.2;         // the cap as a fraction of the tokens (the paper's 20 %); 1 = no cap
  double partial_ratio = 0.3;  // r: partial columns per head = floor(r · head_dim)
  InfinigenGroup group = InfinigenGroup::kRelative;  // how a KV head's query heads combine (GQA)
};

// Throws Error(kInvalidArgument) naming the value unless alpha > 0 (+inf allowed), 0 < budget <= 1
// and 0 < partial_ratio <= 1.
void validate(const InfinigenParams& p);

// Rows a sequence may fetch per KV head: floor(budget · T_max) when the final length T_max is known
// (> 0), else floor(budget · T); at least 1.
int64_t speculation_cap(double budget, int64_t n_tokens, int64_t final_tokens = 0);

// The scores S_g[t] of one (s, g) for rows t < T: q: [G, K] f32 the group's partial queries, pk: [T, K]
// f16 bits (the spec's partial key cache is FP16, §10), out: [T], the formula above bit for bit. The kernels
// live in the CPU backend: cpu::spec_scores_ref (the scalar loop) and cpu::spec_scores_kernel(isa), which
// give the same bits on every path.
using GroupScoresFn = void (*)(const float* q, int64_t G, int64_t K, const uint16_t* pk, int64_t T,
                               float scale, float* out);

// Each query head's scores apart: out[j * ld + t], the same bits as GroupScoresFn's terms
// (cpu::spec_head_scores_kernel(isa) or cpu::spec_head_scores_ref).
using HeadScoresFn = void (*)(const float* q, int64_t G, int64_t K, const uint16_t* pk, int64_t T,
                              float scale, float* out, int64_t ld);

// One layer's speculation over a batch of n_seq sequences.
struct SpecInput {
  int64_t n_seq = 0;
  int64_t n_head = 0;  // query heads H; query head h belongs to KV head h / (H / n_head_kv)
  int64_t n_head_kv = 0;
  int64_t k_cols = 0;         // partial columns
  float scale = 1.0f;         // multiplies the dot products (1/sqrt(d) unless folded into the weights)
  const float* qp = nullptr;  // [n_seq, n_head, k_cols] f32 partial queries
  std::span<const uint16_t* const> pk;   // [n_seq * n_head_kv] each [n_tokens[s], k_cols] f16 partial keys
  std::span<const int64_t> n_tokens;     // [n_seq] T_s >= 1 (the current token not included)
  std::span<const int64_t> cap;          // [n_seq] cap_s >= 1
  GroupScoresFn group_scores = nullptr;  // required: cpu::spec_scores_kernel(isa) or cpu::spec_scores_ref
  InfinigenGroup group = InfinigenGroup::kMax;
  HeadScoresFn head_scores = nullptr;  // required for kRelative with G > 1
  // Splits the scores (rows in slices of whole 8-row blocks) and the selection ((s, g) pairs) across the
  // pool's threads when it polls or the work is large (ThreadPool::threads_for); null: the caller's thread.
  // The result is the same bits either way.
  ThreadPool* pool = nullptr;
};

struct SpecResult {
  int64_t n_sel = 0;                 // the shared count before the per-sequence caps
  std::vector<float> max;            // [n_seq, n_head_kv] m[s,g]
  std::vector<int64_t> count;        // [n_seq, n_head_kv] c[s,g]
  std::vector<int64_t> chosen;       // [n_seq] rows fetched per KV head of sequence s
  std::vector<int64_t> offset;       // [n_seq * n_head_kv + 1] where (s,g)'s rows start in idx
  std::vector<int32_t> idx;          // rows, ascending within each (s,g)
  std::vector<float> scores;         // scratch: S_g of every (s,g), [n_seq, n_head_kv, T_s] packed
  std::vector<int32_t> order;        // scratch: [threads, max T_s + 1] candidate rows of one (s,g) per thread
  std::vector<float> values;         // scratch: [threads, max T_s] their scores, partly ordered
  std::vector<float> part_max;       // scratch: [threads, n_seq * n_head_kv] each thread's slice maxima
  std::vector<int64_t> part_count;   // scratch: [threads, n_seq * n_head_kv] each slice's count
  std::vector<int64_t> first;        // scratch: [n_seq * n_head_kv] where (s,g)'s scores start
  std::vector<float> heads;          // scratch (kRelative): [G] x the scores' layout, head j of (s,g) at
                                     // first[s,g] * G + j * T_s
  std::vector<float> head_max;       // scratch (kRelative): [n_seq * n_head_kv, G] each head's maximum
  std::vector<float> part_head_max;  // scratch (kRelative): [threads, n_seq * n_head_kv * G]

  std::span<const int32_t> rows(int64_t s, int64_t g, int64_t n_head_kv) const {
    const auto i = static_cast<size_t>(s * n_head_kv + g);
    return {idx.data() + offset[i], static_cast<size_t>(offset[i + 1] - offset[i])};
  }
};

// Fills `out` (its buffers are reused: no allocation once they have grown to the largest batch).
void speculate(const SpecInput& in, float alpha, SpecResult& out);

// The partial projection of rows: out[r] = x[r] · b, x: [n, d] f32, b: [d, k] f32 (B = A[:, cols]),
// out: [n, k] f32 (f32 accumulation, i ascending). For RoPE models x is RoPE(q) or RoPE(k) (§5.2, §6.2).
void partial_rows(const float* x, int64_t n, int64_t d, const float* b, int64_t k, float* out);

// B = A[:, cols]: a: [d, d] f32 row-major (skew_math.h), cols: [k] -> b: [d, k] f32.
std::vector<float> partial_matrix(const float* a, int64_t d, std::span<const int32_t> cols);

}  // namespace kvtier::policy
