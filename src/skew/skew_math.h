// InfiniGen's offline skewing math (spec infinigen.md §4, §5.1, §15.10–11), pure and backend-free.
//
// Per layer and KV head, the skewing matrix A (d x d, orthogonal) is V of the SVD of the sample
// queries Q = U diag(sigma) V^T: Q~ = Q·A = U diag(sigma) puts the energy of q·k into the columns with
// the largest singular values, and q~·k~ = q·A·A^T·k = q·k exactly. For RoPE models A is applied
// after RoPE (q~ = RoPE(q)·A, k~ = RoPE(k)·A), so the sample must be post-RoPE queries (§4.4; A is
// never folded into W_Q there). Under GQA one A serves a KV head and its G query heads: the SVD is of
// the group's queries stacked, (G·n) x d (§15.11). Models without RoPE may fold A into the projection
// (fold_projection), bias included (§4.2, §15.12).
//
// Partial columns (§5.1): score[c] = sum over rows of |Q~[.,c]| (all query heads of the group) +
// |K~[.,c]|; the k_cols = floor(r·d) best columns, shared by the partial query and the partial keys.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kvtier::skew {

// Columns kept per head: floor(ratio · d), at least 1 and at most d. Throws Error(kInvalidArgument)
// unless 0 < ratio <= 1.
int64_t partial_columns(double ratio, int64_t d);

struct SkewMatrix {
  int64_t d = 0;
  std::vector<float> a;      // [d, d] f32 row-major: x~[j] = sum_i x[i] * a[i * d + j]; orthogonal
  std::vector<float> sigma;  // [d] singular values of the sample, descending (0 past its rank)
};

// The skewing matrix of one KV head from its sample queries q: [n_rows, d] f32 (row-major, the group's
// query heads stacked). The SVD runs in f64 (LAPACK dgesvd); each column's sign is fixed so that its
// entry of largest magnitude is positive (the same A on any LAPACK). Throws Error(kInvalidArgument)
// for an empty sample or d < 1, and Error(kInternal) when LAPACK fails to converge.
SkewMatrix skew_matrix(std::span<const float> q, int64_t n_rows, int64_t d);

// out = x · A with f64 accumulation: x, out: [n, d] f32 (may not alias); a: [d, d] f32 as above.
void rotate_rows(const float* x, int64_t n, int64_t d, const float* a, float* out);

// score[c] += sum_r |x[r, c]| for x: [n, d] f32; score: [d] f64.
void add_abs_column_sums(const float* x, int64_t n, int64_t d, double* score);

// The k columns of largest score (ties: the lower index), in ascending index order.
std::vector<int32_t> top_columns(std::span<const double> score, int64_t k);

// Folds A into one head's projection without RoPE (OPT, §4.2): w: [d_in, d] f32 (x·w gives the head's
// d outputs; row stride ldw >= d), b: [d] f32 or null. Afterwards x·w + b is the old output times A.
void fold_projection(float* w, int64_t d_in, int64_t ldw, float* b, const SkewMatrix& a);

}  // namespace kvtier::skew
