// The storage of a retention that keeps a bounded set of positions per KV head (h2o, locret): per
// (sequence, layer), for each KV head up to `cap` rows of K, V (and K before RoPE when the retention
// re-rotates keys), each row's true position and its retention score; rows are dropped by compacting
// the survivors in place, in position order. Every KV head holds the same number of rows; which
// positions they are differs per head. The two retentions differ only in how rows are scored and
// which positions the kept rows take (h2o: their own, counted back from the pass; locret: compact).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "backend/cpu/attention.h"
#include "kv/footprint.h"
#include "kv/geometry.h"
#include "kv/kv_cache.h"

namespace kvtier::kv {

struct BoundedRows {
  // links: each row also keeps whether its token continues the span of the row before it.
  BoundedRows(const KvGeometry& geo, uint32_t layer, int64_t cap, bool pre_rope, bool links = false);

  int64_t cap = 0;  // rows per KV head
  KvDtype dtype = KvDtype::kF16;
  int64_t dk = 0, dv = 0;     // head dimensions of K and V
  size_t rk = 0, rv = 0;      // bytes of one K row and one V row
  std::vector<uint8_t> k;     // [n_head_kv][cap][head_dim_k] KV dtype, after RoPE
  std::vector<uint8_t> kpre;  // [n_head_kv][cap][head_dim_k] KV dtype, before RoPE (empty unless pre_rope)
  std::vector<uint8_t> v;     // [n_head_kv][cap][head_dim_v] KV dtype
  std::vector<int64_t> pos;   // [n_head_kv][cap] true position of each row
  std::vector<float> score;   // [n_head_kv][cap] the retention's score of each row
  // [n_head_kv][cap] 1: the row's token continues the span (word, number) of row r - 1, which holds
  // the position before it (empty unless links)
  std::vector<uint8_t> link;

  size_t cell(int64_t h, int64_t r) const { return static_cast<size_t>(h * cap + r); }
  // Stores one token's rows of KV head h (k, kpre: [head_dim_k] f32, v: [head_dim_v] f32; kpre is
  // ignored unless the rows keep pre-RoPE keys) as row r.
  void put(int64_t h, int64_t r, const float* k_row, const float* kpre_row, const float* v_row,
           int64_t position, float row_score);
  // Keeps rows [0, n) of KV head h whose keep[r] is set, in order, and returns how many. K before
  // RoPE, V, positions, scores and links move (a kept row whose row before was dropped links no more); K
  // after RoPE moves too unless the rows keep pre-RoPE keys (a moved row changes position, so a caller with
  // compact positions re-rotates its key: `moved(new_row, old_row)` is called for each row that moved, in
  // order, after its bytes moved).
  int64_t compact(int64_t h, int64_t n, std::span<const uint8_t> keep,
                  const std::function<void(int64_t, int64_t)>& moved = {});
  // The rows of every KV head as one attention span: row i at position pos0 + i, n_tokens rows.
  cpu::KvSpan span(const KvGeometry& geo, int64_t pos0, int64_t n_tokens) const;
};

// Bytes one row of one KV head costs: K (twice with pre-RoPE keys), V, its position and n_scores floats.
uint64_t bounded_row_bytes(const KvGeometry& geo, bool pre_rope, int n_scores);

// Compute-local bytes of a bounded-rows cache: the rows with their positions and scores (kv), and
// attention scratch plus the policy's work buffers (scratch).
struct BoundedLayout {
  uint64_t kv_bytes = 0;
  uint64_t scratch_bytes = 0;
};
// Throws Error(kBudget) when the layout does not fit --kv-mem (0: as needed); `lower` names the flags
// that shrink it.
void check_bounded_budget(const char* policy, const BoundedLayout& lay, const KvOptions& o,
                          const char* lower);

// Sets keep[r] = 1 for the k best of rows [0, n) under `better` (a strict total order, so ties are
// decided by the caller's rule), 0 for the others; order is work space of at least n entries.
void mark_best(int64_t n, int64_t k, std::span<int64_t> order, std::span<uint8_t> keep,
               const std::function<bool(int64_t, int64_t)>& better);

// Attention parameters of one layer's pass for the geometry's rows.
cpu::AttnParams layer_attn_params(const KvGeometry& geo, uint32_t layer, int64_t n_head,
                                  const LayerAttention& la);

}  // namespace kvtier::kv
