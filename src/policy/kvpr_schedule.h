// KVPR's split-point scheduler (spec kvpr.md §5): a pure cost model, no backend.
//
// For one layer, one batch and one decode step with s' cached tokens, the K,V of tokens [0, l) are
// recomputed from their stored activation rows X[0, l) and the K,V of tokens [l, s') are transferred.
// Per token (spec §5.3, generalised in bytes and FLOPs as §5.4 allows):
//   A = recompute_flops / v_gpu   recompute one token's K and V
//   B = kv_bytes / v_com_kv       send one token's K and V
//   C = x_bytes / v_com_x         send one token's activation row
// and the step time of the layer's KV phase is (Eq. 10 and its row form)
//   t_col(l) = C·l + max(A·l, B·(s' − l))      X first, then recompute ∥ KV tail
//   t_row(l) =       max(A·l, B·(s' − l))      the paper's "omit the first term"
// Both are convex piecewise linear with their minimum at the crossover l_c = s'·B/(A+B) (column: only
// when C < B; otherwise l* = 0). The closed form evaluates the integers around l_c; the scan (the
// authors' reference routine) evaluates every l. Both keep the smaller l on a tie and never return l
// above the cap (the tokens whose X is stored, spec A1) or above s'.
//
// On the CPU the bytes are the stored representations (quantised activation rows, f16 K/V), not the
// paper's h·p, so the GQA rule of §5.4 (l* = 0 in column mode when C ≥ B) is applied in bytes.
#pragma once

#include <cstdint>
#include <vector>

namespace kvtier::policy {

enum class KvprSchedule {
  kRow,     // t_row: recompute ∥ KV tail (the paper's latency schedule)
  kColumn,  // t_col: X crosses the link first, then recompute ∥ KV tail (Eq. 10)
  // t_pipe(l) = max(W + A·l, C·l + B·(s' − l)): the CPU engine's prefetch pipeline, where one load
  // job carries a unit's X prefix and K,V tail (the link is busy for both) while the compute runs the
  // rest of the unit's visit (W = KvprCosts::hidden_s: projections, attention, FFN share) and its
  // recompute (kvtier's TieredKv with kvpr). Crossover l = (B·s' − W)/(A + B − C); l = 0 when C ≥ B
  // or when W already hides the whole transfer (B·s' ≤ W).
  kPipelined,
};

enum class KvprSplitPolicy {
  kAdaptive,     // l re-solved for every decode step from its s' (the paper, default)
  kStaticFinal,  // one l = min(s, split(s + g)) for the whole request (the authors' code)
};

// Per-token quantities of one layer for one batch (b included), and the rates they move and compute
// at. Rates are > 0 (+inf allowed: a free link or free compute).
struct KvprCosts {
  double x_bytes = 0;          // bytes of one token's activation row(s) (paper: b·h·p)
  double kv_bytes = 0;         // bytes of one token's K and V (paper: 2·b·h·p; GQA: 2·b·d_kv·p_kv)
  double recompute_flops = 0;  // FLOPs to recompute one token's K and V (paper: 4·b·h², GQA: 4·b·h·d_kv)
  double v_com_x = 0;          // link bandwidth for X, B/s
  double v_com_kv = 0;         // link bandwidth for K,V, B/s
  double v_gpu = 0;            // recompute rate, FLOP/s
  double hidden_s = 0;         // kPipelined: the visit's other compute, which hides that much transfer
};

// The paper's model (Eqs. 6–9): MHA, one link, p bytes per element for X and K,V alike.
KvprCosts kvpr_paper_costs(int64_t b, int64_t h, double p, double v_com, double v_gpu);
// §5.4: d_kv = n_kv_heads·head_dim; X and K,V with their own element sizes and bandwidths.
KvprCosts kvpr_gqa_costs(int64_t b, int64_t h, int64_t d_kv, double p_x, double p_kv, double v_com_x,
                         double v_com_kv, double v_gpu);
// Throws Error(kInvalidArgument) naming the bad field (a rate ≤ 0 or NaN, a negative or NaN size).
void check_kvpr_costs(const KvprCosts& c);

// The terms of one layer's KV phase at split l (seconds).
struct KvprStepTime {
  double x = 0;          // M_X(l) / v_com_x
  double recompute = 0;  // N_KV(l) / v_gpu
  double kv = 0;         // M_KV(l) / v_com_kv
  double total = 0;      // t_row or t_col
};
// 0 ≤ l ≤ s_prime.
KvprStepTime kvpr_step_time(const KvprCosts& c, KvprSchedule schedule, int64_t s_prime, int64_t l);

// argmin over integer l in [0, min(l_cap, s_prime)] of the step time, by the closed form. O(1).
int64_t kvpr_split(const KvprCosts& c, KvprSchedule schedule, int64_t s_prime, int64_t l_cap);
// The same by evaluating every l (the reference routine of spec §5.3; O(s')).
int64_t kvpr_split_scan(const KvprCosts& c, KvprSchedule schedule, int64_t s_prime, int64_t l_cap);

// One unit visit's split in kvtier's CPU prefetch pipeline (kPipelined over the visit's rows s' with
// l ≤ l_cap; TieredKv's kvpr auto). Recomputing even one row reads the unit's rows of W_K and W_V
// once: a fixed cost the linear model leaves out. On both default models and the 7B shapes it is
// about one row's projection (a decode matvec is bound by reading those weights); counted as two
// rows, a split is taken only when it beats l = 0 with that cost added.
int64_t kvpr_visit_split(const KvprCosts& c, int64_t s_prime, int64_t l_cap);

// The same for kivi+kvpr (TieredKv with kivi4+kvpr, kivi2+kvpr): only the quantised rows [0, q_rows)
// can be recomputed, in whole key groups of `group` rows, and the f16 residual rows after them cross the
// link on every visit, taking f16_s of the time W hides first. c.kv_bytes is one quantised row's bytes
// (1/3 to 1/5 of an f16 row), so recomputing pays off at a slower link than with f16 rows: on GQA models,
// whose input row is about as large as an f16 K/V row, it is 0 almost always. kvpr_visit_split's l over
// the q_rows with W - f16_s, rounded down to whole groups.
int64_t kvpr_kivi_visit_split(const KvprCosts& c, int64_t q_rows, double f16_s, int64_t l_cap, int64_t group);

// kPipelined's W (KvprCosts::hidden_s) for a unit visit before any decode visit has been timed; TieredKv
// then measures W as the time between the starts of two decode visits less their waiting and
// recomputing (a moving average over all the step's visits), and this estimate only stands in until
// the first such interval is measured (the first two decode steps: step 1's load is planned during the
// prefill, step 2's during step 1's visit).
// Without it those steps planned with W = 0, as if the load had nothing to hide behind, and recomputed
// rows that the step's own compute would have hidden the transfer of (spec P6 at a 1 GB/s link: 15-21
// rows where 0 was best by 3x).
// What is comparable: W is the rest of a decode step's compute, and most of that is one-token
// matvecs, each bound by reading its weight matrix once. The profiler times exactly that
// (runtime::Profile::decode_weights_s: one token through every weight matrix, the output head
// included). The prefill's per-token compute is not comparable (its matmuls reuse each weight across
// the chunk's tokens and are compute-bound; per token they are several times cheaper than a decode
// step's), nor is the profiled projection rate (a 256-token matmul). The step's visits share W
// evenly, as the measured average does: W ≈ decode_weights_s / visits_per_step. It leaves out
// attention, norms and the new rows' store, so it is low, which errs toward recomputing (what W = 0
// did, by less). 0 when either input is ≤ 0 (not profiled: the scheduler then plans as before).
double kvpr_hidden_estimate(double decode_weights_s, int64_t visits_per_step);

// One step's decision (spec §5.5): l = 0 is pure offloading (no X transfer, no recompute launch);
// l = s' transfers no K,V.
struct KvprDecision {
  int64_t l = 0;
  KvprStepTime at_l;     // predicted time with this split
  KvprStepTime at_zero;  // predicted time of pure offloading (l = 0)
  bool recompute() const { return l > 0; }
};
// l_stored: tokens whose X is stored for this layer (L_X); the split never exceeds it.
KvprDecision kvpr_decide(const KvprCosts& c, KvprSchedule schedule, int64_t s_prime, int64_t l_stored);

// The split of every decode step of one request (spec §5.3 [R], §6.2 step indexing): prompt s, g
// generated tokens (counting the one prefill emits), so steps i = 1..g−1 with s'_i = s + i − 1 and
// L_cap = s. Element i−1 is l_i; empty when g ≤ 1.
std::vector<int64_t> kvpr_split_table(const KvprCosts& c, KvprSchedule schedule, KvprSplitPolicy policy,
                                      int64_t s, int64_t g);

// K+V bytes of one layer at s' tokens (paper Table 1: 2·b·s'·h·p).
double kvpr_layer_kv_bytes(int64_t b, int64_t s_prime, int64_t h, double p);

}  // namespace kvtier::policy
