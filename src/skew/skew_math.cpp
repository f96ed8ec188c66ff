#include "skew/skew_math.h"

#include <lapacke.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace kvtier::skew {

int64_t partial_columns(double ratio, int64_t d) {
  if (!(ratio > 0.0 && ratio <= 1.0))
    fail(ErrorKind::kInvalidArgument, "partial ratio {} is not in (0, 1]", ratio);
  KVTIER_ASSERT(d >= 1);
  const auto k = static_cast<int64_t>(std::floor(ratio * static_cast<double>(d)));
  return std::clamp<int64_t>(k, 1, d);
}

SkewMatrix skew_matrix(std::span<const float> q, int64_t n_rows, int64_t d) {
  if (d < 1 || n_rows < 1)
    fail(ErrorKind::kInvalidArgument, "skew sample of {} rows of {} columns", n_rows, d);
  KVTIER_ASSERT(q.size() == static_cast<size_t>(n_rows * d), "sample of {} floats, expected {} x {}",
                q.size(), n_rows, d);
  // The row-major [n_rows, d] sample read column-major is Q^T (d x n_rows): Q^T = V diag(sigma) U^T,
  // so its left singular vectors are the V we want, and no transposed copy is needed.
  std::vector<double> qt(q.begin(), q.end());  // [n_rows, d] f64 = col-major [d, n_rows]
  const int64_t m = d;
  const int64_t n = n_rows;
  const int64_t k = std::min(m, n);
  std::vector<double> s(static_cast<size_t>(k));
  std::vector<double> u(static_cast<size_t>(d * d));  // col-major [d, d]: u[i + j*d] = V[i][j]
  std::vector<double> superb(static_cast<size_t>(std::max<int64_t>(k - 1, 1)));
  double vt_unused = 0.0;
  const lapack_int info =
      LAPACKE_dgesvd(LAPACK_COL_MAJOR, 'A', 'N', static_cast<lapack_int>(m), static_cast<lapack_int>(n),
                     qt.data(), static_cast<lapack_int>(m), s.data(), u.data(), static_cast<lapack_int>(d),
                     &vt_unused, 1, superb.data());
  if (info != 0)
    fail(ErrorKind::kInternal, "LAPACK dgesvd failed (info {}) on a {} x {} sample", info, n_rows, d);
  SkewMatrix out;
  out.d = d;
  out.a.resize(static_cast<size_t>(d * d));
  out.sigma.assign(static_cast<size_t>(d), 0.0f);
  for (int64_t j = 0; j < k; ++j)
    out.sigma[static_cast<size_t>(j)] = static_cast<float>(s[static_cast<size_t>(j)]);
  for (int64_t j = 0; j < d; ++j) {
    const double* col = &u[static_cast<size_t>(j * d)];
    int64_t big = 0;
    for (int64_t i = 1; i < d; ++i)
      if (std::abs(col[i]) > std::abs(col[big])) big = i;
    const double sign = col[big] < 0.0 ? -1.0 : 1.0;
    for (int64_t i = 0; i < d; ++i) out.a[static_cast<size_t>(i * d + j)] = static_cast<float>(sign * col[i]);
  }
  return out;
}

void rotate_rows(const float* x, int64_t n, int64_t d, const float* a, float* out) {
  std::vector<double> acc(static_cast<size_t>(d));
  for (int64_t r = 0; r < n; ++r) {
    std::fill(acc.begin(), acc.end(), 0.0);
    const float* xr = x + r * d;
    for (int64_t i = 0; i < d; ++i) {
      const double xi = xr[i];
      const float* ai = a + i * d;
      for (int64_t j = 0; j < d; ++j) acc[static_cast<size_t>(j)] += xi * ai[j];
    }
    for (int64_t j = 0; j < d; ++j) out[r * d + j] = static_cast<float>(acc[static_cast<size_t>(j)]);
  }
}

void add_abs_column_sums(const float* x, int64_t n, int64_t d, double* score) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < d; ++c) score[c] += std::abs(static_cast<double>(x[r * d + c]));
}

std::vector<int32_t> top_columns(std::span<const double> score, int64_t k) {
  const auto d = static_cast<int64_t>(score.size());
  KVTIER_ASSERT(k >= 1 && k <= d, "top {} of {} columns", k, d);
  std::vector<int32_t> idx(static_cast<size_t>(d));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t x, int32_t y) { return score[x] > score[y]; });
  idx.resize(static_cast<size_t>(k));
  std::sort(idx.begin(), idx.end());
  return idx;
}

void fold_projection(float* w, int64_t d_in, int64_t ldw, float* b, const SkewMatrix& a) {
  const int64_t d = a.d;
  KVTIER_ASSERT(ldw >= d);
  std::vector<float> row(static_cast<size_t>(d));
  for (int64_t r = 0; r < d_in; ++r) {
    rotate_rows(w + r * ldw, 1, d, a.a.data(), row.data());
    std::copy(row.begin(), row.end(), w + r * ldw);
  }
  if (b != nullptr) {
    rotate_rows(b, 1, d, a.a.data(), row.data());
    std::copy(row.begin(), row.end(), b);
  }
}

}  // namespace kvtier::skew
