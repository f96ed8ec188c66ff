#include "policy/infinigen_select.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>

#include "core/error.h"

namespace kvtier::policy {

namespace {

// max of v[0..n) (-inf when n = 0), in 8 independent lanes so that the compiler vectorises it (the max of
// floats is exact: only which of +0 and -0 comes back may depend on the order, and they compare equal).
float max_of(const float* v, int64_t n) {
  constexpr int64_t kLanes = 8;
  float m[kLanes];
  std::fill(m, m + kLanes, -std::numeric_limits<float>::infinity());
  int64_t t = 0;
  for (; t + kLanes <= n; t += kLanes)
    for (int64_t k = 0; k < kLanes; ++k) m[k] = std::max(m[k], v[t + k]);
  for (int64_t k = 0; t < n; ++t, ++k) m[k] = std::max(m[k], v[t]);
  float r = m[0];
  for (int64_t k = 1; k < kLanes; ++k) r = std::max(r, m[k]);
  return r;
}

// #{t : v[t] > bound}.
int64_t count_above(const float* v, int64_t T, float bound) {
  int64_t c = 0;
  for (int64_t t = 0; t < T; ++t) c += v[t] > bound ? 1 : 0;
  return c;
}

// The first n < T rows of v ordered by (score descending, row ascending), in ascending row order, into
// dst: [n]. m = max v and c = #{v > m - alpha} (pass 1). Scratch: rows: [T + 1], vals: [T].
//
// Only rows above a bound with at least n rows above it can be among them (the n-th largest score x is
// above the bound then), so the candidates are those rows: first m - alpha (c of them), else
// m - 2^k alpha for k = 1..4, else every row. Their values' n-th largest is x (nth_element on a copy);
// the rows above x and the lowest rows equal to x until there are n are the answer, in row order.
void top_rows(const float* v, int64_t T, int64_t n, float m, float alpha, int64_t c, int32_t* rows,
              float* vals, int32_t* dst) {
  float bound = m - alpha;
  for (int k = 1; c < n && k <= 4; ++k) {
    bound = m - alpha * static_cast<float>(1 << k);
    c = count_above(v, T, bound);
  }
  int64_t nc = 0;  // candidates, in row order
  if (c >= n) {
    for (int64_t t = 0; t < T; ++t) {  // branch-free: rows has one slot of slack
      rows[nc] = static_cast<int32_t>(t);
      nc += v[t] > bound ? 1 : 0;
    }
  } else {
    for (int64_t t = 0; t < T; ++t) rows[t] = static_cast<int32_t>(t);
    nc = T;
  }
  KVTIER_ASSERT(nc >= n, "{} candidate rows for {} chosen", nc, n);
  for (int64_t i = 0; i < nc; ++i) vals[i] = v[rows[i]];
  std::nth_element(vals, vals + (n - 1), vals + nc, std::greater<float>());
  const float x = vals[n - 1];
  int64_t above = 0;
  for (int64_t i = 0; i < nc; ++i) above += v[rows[i]] > x ? 1 : 0;
  int64_t ties = n - above;  // rows equal to x that are taken
  int64_t k = 0;
  for (int64_t i = 0; i < nc; ++i) {
    const float y = v[rows[i]];
    if (y > x) {
      dst[k++] = rows[i];
    } else if (y == x && ties > 0) {
      dst[k++] = rows[i];
      --ties;
    }
  }
  KVTIER_ASSERT(k == n, "{} rows taken for {} chosen (NaN scores?)", k, n);
}

}  // namespace

void validate(const InfinigenParams& p) {
  if (!(p.alpha > 0.0f))
    fail(ErrorKind::kInvalidArgument, "--infinigen-alpha must be positive (got {})", p.alpha);
  if (!(p.budget > 0.0 && p.budget <= 1.0))
    fail(ErrorKind::kInvalidArgument, "the InfiniGen budget must be in (0, 1] (got {})", p.budget);
  if (!(p.partial_ratio > 0.0 && p.partial_ratio <= 1.0))
    fail(ErrorKind::kInvalidArgument, "the InfiniGen partial ratio must be in (0, 1] (got {})",
         p.partial_ratio);
}

int64_t speculation_cap(double budget, int64_t n_tokens, int64_t final_tokens) {
  const int64_t base = final_tokens > 0 ? final_tokens : n_tokens;
  const auto cap = static_cast<int64_t>(std::floor(budget * static_cast<double>(base)));
  return std::max<int64_t>(cap, 1);
}

namespace {

// Rows [lo, hi) of T that thread w of W takes: slices of whole 8-row blocks (the SIMD kernels' unit, so a
// row's bits do not depend on the slicing), the last thread also the T mod 8 rows after them.
std::pair<int64_t, int64_t> row_slice(int64_t T, int w, int W) {
  constexpr int64_t kBlock = 8;
  const int64_t blocks = T / kBlock;
  const int64_t lo = blocks * w / W * kBlock;
  const int64_t hi = w + 1 == W ? T : blocks * (w + 1) / W * kBlock;
  return {lo, hi};
}

// Below this many score products a sleeping pool's hand-off costs more than it saves.
constexpr int64_t kSleepingMinWork = 1 << 20;

}  // namespace

void speculate(const SpecInput& in, float alpha, SpecResult& out) {
  const int64_t S = in.n_seq, H = in.n_head, Hk = in.n_head_kv, K = in.k_cols;
  KVTIER_ASSERT(S >= 1 && Hk >= 1 && H >= Hk && H % Hk == 0 && K >= 1 && alpha > 0.0f && in.group_scores);
  KVTIER_ASSERT(in.pk.size() == static_cast<size_t>(S * Hk) && in.n_tokens.size() == static_cast<size_t>(S) &&
                in.cap.size() == static_cast<size_t>(S));
  const int64_t G = H / Hk;
  const int64_t SG = S * Hk;
  int64_t t_max = 0;
  int64_t n_scores = 0;
  for (int64_t s = 0; s < S; ++s) {
    KVTIER_ASSERT(in.n_tokens[s] >= 1 && in.cap[s] >= 1);
    t_max = std::max(t_max, in.n_tokens[s]);
    n_scores += Hk * in.n_tokens[s];
  }
  const int W = in.pool == nullptr ? 1 : in.pool->threads_for(n_scores * G * K, kSleepingMinWork);
  const auto run = [&](const std::function<void(int)>& fn) {
    if (W == 1) {
      fn(0);
    } else {
      in.pool->run(W, fn);
    }
  };
  // Thread w's slice of each (s,g): fn(s, T_s, lo, hi, g, i = s * Hk + g), rows [lo, hi) of T_s.
  const auto each_slice = [&](int w, const auto& fn) {
    for (int64_t s = 0; s < S; ++s) {
      const int64_t T = in.n_tokens[s];
      const auto [lo, hi] = row_slice(T, w, W);
      for (int64_t g = 0; g < Hk; ++g) fn(s, T, lo, hi, g, static_cast<size_t>(s * Hk + g));
    }
  };
  // dst[i] = the max over the threads' parts[w * n + i], for i < n.
  const auto reduce_max = [W](const std::vector<float>& parts, int64_t n, std::vector<float>& dst) {
    for (int64_t i = 0; i < n; ++i) {
      float m = -std::numeric_limits<float>::infinity();
      for (int w = 0; w < W; ++w) m = std::max(m, parts[static_cast<size_t>(w * n + i)]);
      dst[static_cast<size_t>(i)] = m;
    }
  };
  out.max.resize(static_cast<size_t>(SG));
  out.count.resize(static_cast<size_t>(SG));
  out.chosen.resize(static_cast<size_t>(S));
  out.offset.resize(static_cast<size_t>(SG + 1));
  out.scores.resize(static_cast<size_t>(n_scores));
  out.order.resize(static_cast<size_t>(W * (t_max + 1)));
  out.values.resize(static_cast<size_t>(W * t_max));
  out.part_max.resize(static_cast<size_t>(W * SG));
  out.part_count.resize(static_cast<size_t>(W * SG));
  std::vector<int64_t>& first = out.first;
  first.resize(static_cast<size_t>(SG));
  {
    int64_t at = 0;
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t g = 0; g < Hk; ++g, at += in.n_tokens[s]) first[static_cast<size_t>(s * Hk + g)] = at;
    }
  }

  // Pass 1a: the scores of every (s,g), packed in (s,g) order (computed once, read by both passes), and
  // each thread's slice maxima. The relative rule first keeps each query head's scores and maxima apart
  // and combines them once every head's maximum is known.
  const bool relative = in.group == InfinigenGroup::kRelative && G > 1;
  if (relative) {
    KVTIER_ASSERT(in.head_scores != nullptr, "the relative group rule needs the per-head score kernel");
    out.heads.resize(static_cast<size_t>(n_scores * G));
    out.head_max.resize(static_cast<size_t>(SG * G));
    out.part_head_max.resize(static_cast<size_t>(W * SG * G));
    run([&](int w) {
      each_slice(w, [&](int64_t s, int64_t T, int64_t lo, int64_t hi, int64_t g, size_t i) {
        float* h = out.heads.data() + first[i] * G;  // [G, T]
        if (hi > lo)
          in.head_scores(in.qp + (s * H + g * G) * K, G, K, in.pk[i] + lo * K, hi - lo, in.scale, h + lo, T);
        for (int64_t j = 0; j < G; ++j)
          out.part_head_max[(static_cast<size_t>(w) * SG + i) * G + j] = max_of(h + j * T + lo, hi - lo);
      });
    });
    reduce_max(out.part_head_max, SG * G, out.head_max);
  }
  run([&](int w) {
    each_slice(w, [&](int64_t s, int64_t T, int64_t lo, int64_t hi, int64_t g, size_t i) {
      float* sc = out.scores.data() + first[i];
      if (relative) {  // heads ascending, each a contiguous pass over the slice (vectorised)
        const float* h = out.heads.data() + first[i] * G;
        const float* hm = out.head_max.data() + i * G;
        std::fill(sc + lo, sc + hi, -std::numeric_limits<float>::infinity());
        for (int64_t j = 0; j < G; ++j) {
          const float* hj = h + j * T;
          const float shift = hm[j];
          for (int64_t t = lo; t < hi; ++t) sc[t] = std::max(sc[t], hj[t] - shift);
        }
      } else if (hi > lo) {
        const float* q = in.qp + (s * H + g * G) * K;
        in.group_scores(q, G, K, in.pk[i] + lo * K, hi - lo, in.scale, sc + lo);
      }
      out.part_max[static_cast<size_t>(w) * SG + i] = max_of(sc + lo, hi - lo);
    });
  });
  reduce_max(out.part_max, SG, out.max);
  // Pass 1b: the per-(s,g) count above m - alpha (-inf for alpha = +inf: every row passes).
  run([&](int w) {
    each_slice(w, [&](int64_t, int64_t, int64_t lo, int64_t hi, int64_t, size_t i) {
      out.part_count[static_cast<size_t>(w) * SG + i] =
          count_above(out.scores.data() + first[i] + lo, hi - lo, out.max[i] - alpha);
    });
  });
  int64_t total = 0;
  for (int64_t i = 0; i < SG; ++i) {
    int64_t c = 0;
    for (int w = 0; w < W; ++w) c += out.part_count[static_cast<size_t>(w * SG + i)];
    out.count[static_cast<size_t>(i)] = c;
    total += c;
  }
  // c >= 1 whenever m - alpha < m; a margin below the float spacing of m could give 0: keep one row.
  out.n_sel = std::max<int64_t>(total / SG, 1);
  int64_t at = 0;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t T = in.n_tokens[s];
    const int64_t n = T <= in.cap[s] ? T : std::min({out.n_sel, in.cap[s], T});
    out.chosen[static_cast<size_t>(s)] = n;
    for (int64_t g = 0; g < Hk; ++g, at += n) out.offset[static_cast<size_t>(s * Hk + g)] = at;
  }
  out.offset[static_cast<size_t>(SG)] = at;
  out.idx.resize(static_cast<size_t>(at));

  // Pass 2: the top rows of each (s,g); the pairs dealt round-robin, each thread with its own scratch.
  run([&](int w) {
    int32_t* order = out.order.data() + static_cast<size_t>(w) * (t_max + 1);
    float* values = out.values.data() + static_cast<size_t>(w) * t_max;
    for (int64_t i = w; i < SG; i += W) {
      const int64_t s = i / Hk;
      const int64_t T = in.n_tokens[s];
      const int64_t n = out.chosen[static_cast<size_t>(s)];
      int32_t* dst = out.idx.data() + out.offset[static_cast<size_t>(i)];
      if (n == T) {
        for (int64_t t = 0; t < T; ++t) dst[t] = static_cast<int32_t>(t);
        continue;
      }
      const auto u = static_cast<size_t>(i);
      top_rows(out.scores.data() + first[u], T, n, out.max[u], alpha, out.count[u], order, values, dst);
    }
  });
}

void partial_rows(const float* x, int64_t n, int64_t d, const float* b, int64_t k, float* out) {
  for (int64_t r = 0; r < n; ++r) {
    float* o = out + r * k;
    std::fill(o, o + k, 0.0f);
    for (int64_t i = 0; i < d; ++i) {
      const float xi = x[r * d + i];
      const float* bi = b + i * k;
      for (int64_t c = 0; c < k; ++c) o[c] += xi * bi[c];
    }
  }
}

std::vector<float> partial_matrix(const float* a, int64_t d, std::span<const int32_t> cols) {
  const auto k = static_cast<int64_t>(cols.size());
  std::vector<float> b(static_cast<size_t>(d * k));
  for (int64_t i = 0; i < d; ++i)
    for (int64_t c = 0; c < k; ++c) {
      KVTIER_ASSERT(cols[c] >= 0 && cols[c] < d);
      b[static_cast<size_t>(i * k + c)] = a[i * d + cols[c]];
    }
  return b;
}

}  // namespace kvtier::policy
