#include "kv/bounded_rows.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "kv/kv_row.h"

namespace kvtier::kv {

BoundedRows::BoundedRows(const KvGeometry& geo, uint32_t layer, int64_t cap_rows, bool pre_rope, bool links)
    : cap(cap_rows),
      dtype(geo.dtype),
      dk(geo.head_dim_k),
      dv(geo.head_dim_v),
      rk(static_cast<size_t>(geo.head_dim_k) * cpu::kv_dtype_bytes(geo.dtype)),
      rv(static_cast<size_t>(geo.head_dim_v) * cpu::kv_dtype_bytes(geo.dtype)) {
  const auto cells = static_cast<size_t>(geo.n_head_kv[layer]) * static_cast<size_t>(cap);
  k.resize(cells * rk);
  if (pre_rope) kpre.resize(cells * rk);
  v.resize(cells * rv);
  pos.resize(cells);
  score.resize(cells);
  if (links) link.resize(cells);
}

void BoundedRows::put(int64_t h, int64_t r, const float* k_row, const float* kpre_row, const float* v_row,
                      int64_t position, float row_score) {
  const size_t c = cell(h, r);
  store_kv_row(dtype, k_row, dk, k.data() + c * rk);
  if (!kpre.empty()) store_kv_row(dtype, kpre_row, dk, kpre.data() + c * rk);
  store_kv_row(dtype, v_row, dv, v.data() + c * rv);
  pos[c] = position;
  score[c] = row_score;
}

int64_t BoundedRows::compact(int64_t h, int64_t n, std::span<const uint8_t> keep,
                             const std::function<void(int64_t, int64_t)>& moved) {
  KVTIER_ASSERT(n <= cap && static_cast<size_t>(n) <= keep.size(), "compact of {} rows in {}", n, cap);
  const bool rerotate = !kpre.empty();
  int64_t w = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (!keep[static_cast<size_t>(r)]) continue;
    if (w != r) {
      const size_t src = cell(h, r), dst = cell(h, w);
      if (rerotate) {
        std::memmove(kpre.data() + dst * rk, kpre.data() + src * rk, rk);
      } else {
        std::memmove(k.data() + dst * rk, k.data() + src * rk, rk);
      }
      std::memmove(v.data() + dst * rv, v.data() + src * rv, rv);
      pos[dst] = pos[src];
      score[dst] = score[src];
      // Row r moved, so some row before it went: it still links only if its own predecessor stayed.
      if (!link.empty()) link[dst] = link[src] != 0 && keep[static_cast<size_t>(r - 1)] != 0 ? 1 : 0;
      if (moved) moved(w, r);
    }
    ++w;
  }
  return w;
}

cpu::KvSpan BoundedRows::span(const KvGeometry& geo, int64_t pos0, int64_t n_tokens) const {
  cpu::KvSpan s;
  s.pos0 = pos0;
  s.n_tokens = n_tokens;
  s.k = k.data();
  s.v = v.data();
  s.k_head_stride = cap * geo.head_dim_k;
  s.v_head_stride = cap * geo.head_dim_v;
  return s;
}

uint64_t bounded_row_bytes(const KvGeometry& geo, bool pre_rope, int n_scores) {
  const uint64_t k_rows = pre_rope ? 2 : 1;
  return (k_rows * geo.head_dim_k + geo.head_dim_v) * cpu::kv_dtype_bytes(geo.dtype) + sizeof(int64_t) +
         static_cast<uint64_t>(n_scores) * sizeof(float);
}

void check_bounded_budget(const char* policy, const BoundedLayout& lay, const KvOptions& o,
                          const char* lower) {
  if (o.kv_mem == 0 || lay.kv_bytes + lay.scratch_bytes <= o.kv_mem) return;
  fail(ErrorKind::kBudget,
       "{} with --kv-budget {} needs {} bytes of compute-local memory ({} of KV rows and scores, {} of "
       "scratch) but --kv-mem is {} bytes; lower {}, or raise --kv-mem",
       policy, o.knobs.budget, lay.kv_bytes + lay.scratch_bytes, lay.kv_bytes, lay.scratch_bytes, o.kv_mem,
       lower);
}

void mark_best(int64_t n, int64_t k, std::span<int64_t> order, std::span<uint8_t> keep,
               const std::function<bool(int64_t, int64_t)>& better) {
  KVTIER_ASSERT(k >= 0 && static_cast<size_t>(n) <= order.size() && static_cast<size_t>(n) <= keep.size(),
                "best {} of {} rows", k, n);
  std::fill(keep.begin(), keep.begin() + n, uint8_t{0});
  if (k <= 0) return;
  if (k >= n) {
    std::fill(keep.begin(), keep.begin() + n, uint8_t{1});
    return;
  }
  std::iota(order.begin(), order.begin() + n, int64_t{0});
  std::nth_element(order.begin(), order.begin() + (k - 1), order.begin() + n, better);
  for (int64_t i = 0; i < k; ++i) keep[static_cast<size_t>(order[static_cast<size_t>(i)])] = 1;
}

cpu::AttnParams layer_attn_params(const KvGeometry& geo, uint32_t layer, int64_t n_head,
                                  const LayerAttention& la) {
  cpu::AttnParams ap;
  ap.head_dim_k = geo.head_dim_k;
  ap.head_dim_v = geo.head_dim_v;
  ap.q_per_kv = n_head / geo.n_head_kv[layer];
  ap.scale = la.scale;
  ap.softcap = la.softcap;
  ap.window = la.window;
  ap.kv_dtype = geo.dtype;
  return ap;
}

}  // namespace kvtier::kv
