#include "policy/kvpr_schedule.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace kvtier::policy {
namespace {

// count·per / rate in seconds; nothing to do costs nothing, even at a zero-width rate (so that
// 0·inf never appears).
double term(double per, int64_t count, double rate) {
  if (count == 0 || per == 0) return 0;
  return per * static_cast<double>(count) / rate;
}

void check_rate(double v, const char* what) {
  if (!(v > 0)) fail(ErrorKind::kInvalidArgument, "KVPR cost model: {} must be > 0, got {}", what, v);
}

void check_size(double v, const char* what) {
  if (!(v >= 0) || std::isinf(v))
    fail(ErrorKind::kInvalidArgument, "KVPR cost model: {} must be finite and ≥ 0, got {}", what, v);
}

int64_t cap_of(int64_t s_prime, int64_t l_cap) {
  KVTIER_ASSERT(s_prime >= 0 && l_cap >= 0, "s' {} cap {}", s_prime, l_cap);
  return std::min(s_prime, l_cap);
}

}  // namespace

KvprCosts kvpr_paper_costs(int64_t b, int64_t h, double p, double v_com, double v_gpu) {
  return kvpr_gqa_costs(b, h, h, p, p, v_com, v_com, v_gpu);
}

KvprCosts kvpr_gqa_costs(int64_t b, int64_t h, int64_t d_kv, double p_x, double p_kv, double v_com_x,
                         double v_com_kv, double v_gpu) {
  KvprCosts c;
  const double bd = static_cast<double>(b);
  const double hd = static_cast<double>(h);
  const double dkv = static_cast<double>(d_kv);
  c.x_bytes = bd * hd * p_x;
  c.kv_bytes = 2.0 * bd * dkv * p_kv;
  c.recompute_flops = 4.0 * bd * hd * dkv;  // two [b, h] x [h, d_kv] GEMMs, 2 FLOPs per MAC
  c.v_com_x = v_com_x;
  c.v_com_kv = v_com_kv;
  c.v_gpu = v_gpu;
  return c;
}

void check_kvpr_costs(const KvprCosts& c) {
  check_size(c.x_bytes, "x_bytes");
  check_size(c.kv_bytes, "kv_bytes");
  check_size(c.recompute_flops, "recompute_flops");
  check_size(c.hidden_s, "hidden_s");
  check_rate(c.v_com_x, "v_com_x (X link bandwidth)");
  check_rate(c.v_com_kv, "v_com_kv (KV link bandwidth)");
  check_rate(c.v_gpu, "v_gpu (recompute rate)");
}

KvprStepTime kvpr_step_time(const KvprCosts& c, KvprSchedule schedule, int64_t s_prime, int64_t l) {
  KVTIER_ASSERT(l >= 0 && l <= s_prime, "split {} outside [0, {}]", l, s_prime);
  KvprStepTime t;
  t.x = term(c.x_bytes, l, c.v_com_x);
  t.recompute = term(c.recompute_flops, l, c.v_gpu);
  t.kv = term(c.kv_bytes, s_prime - l, c.v_com_kv);
  t.total = std::max(t.recompute, t.kv);
  if (schedule == KvprSchedule::kColumn) t.total = t.x + t.total;
  if (schedule == KvprSchedule::kPipelined) t.total = std::max(c.hidden_s + t.recompute, t.x + t.kv);
  return t;
}

int64_t kvpr_split(const KvprCosts& c, KvprSchedule schedule, int64_t s_prime, int64_t l_cap) {
  const int64_t cap = cap_of(s_prime, l_cap);
  if (cap == 0) return 0;
  const double a = c.recompute_flops / c.v_gpu;  // s per recomputed token (0 when free)
  const double b = c.kv_bytes / c.v_com_kv;      // s per transferred token's K,V
  const double x = c.x_bytes / c.v_com_x;        // s per transferred token's X
  if (a + b == 0) return 0;                      // the step costs nothing or only X: the smallest l
  // Column: before the crossover the slope is C − B; if it is not negative, l = 0 is optimal (§5.4).
  if ((schedule == KvprSchedule::kColumn || schedule == KvprSchedule::kPipelined) && x >= b) return 0;
  double r = b / (a + b);                      // crossover share of s'
  if (schedule == KvprSchedule::kPipelined) {  // W + A·l = C·l + B·(s' − l)
    const double sp = static_cast<double>(s_prime);
    r = std::max(0.0, (b * sp - c.hidden_s) / (a + b - x)) / sp;
  }
  if (std::isinf(b)) r = std::isinf(a) ? 0.0 : 1.0;
  const double lc = static_cast<double>(s_prime) * r;
  // The integer optimum is floor(l_c) or ceil(l_c); one more on each side absorbs rounding in l_c.
  const int64_t lo = static_cast<int64_t>(std::floor(std::min(lc, static_cast<double>(cap))));
  int64_t best = -1;
  double best_t = std::numeric_limits<double>::infinity();
  for (int64_t l = std::max<int64_t>(lo - 1, 0); l <= std::min(lo + 2, cap); ++l) {
    const double t = kvpr_step_time(c, schedule, s_prime, l).total;
    if (best < 0 || t < best_t) {
      best_t = t;
      best = l;
    }
  }
  return best;
}

int64_t kvpr_split_scan(const KvprCosts& c, KvprSchedule schedule, int64_t s_prime, int64_t l_cap) {
  const int64_t cap = cap_of(s_prime, l_cap);
  int64_t best = -1;
  double best_t = std::numeric_limits<double>::infinity();
  for (int64_t l = 0; l <= cap; ++l) {
    const double t = kvpr_step_time(c, schedule, s_prime, l).total;
    if (best < 0 || t < best_t) {  // strict: a tie keeps the smaller l, as the authors' scan does
      best_t = t;
      best = l;
    }
  }
  return best;
}

KvprDecision kvpr_decide(const KvprCosts& c, KvprSchedule schedule, int64_t s_prime, int64_t l_stored) {
  KvprDecision d;
  d.l = kvpr_split(c, schedule, s_prime, l_stored);
  KVTIER_ASSERT(d.l >= 0 && d.l <= l_stored && d.l <= s_prime, "split {} (X stored for {}, s' {})", d.l,
                l_stored, s_prime);
  d.at_l = kvpr_step_time(c, schedule, s_prime, d.l);
  d.at_zero = kvpr_step_time(c, schedule, s_prime, 0);
  return d;
}

int64_t kvpr_visit_split(const KvprCosts& c, int64_t s_prime, int64_t l_cap) {
  const double fixed_s = 2 * c.recompute_flops / c.v_gpu;  // the weight pass, as two rows
  KvprCosts cf = c;
  cf.hidden_s += fixed_s;
  const int64_t l = kvpr_split(cf, KvprSchedule::kPipelined, s_prime, l_cap);
  if (l == 0) return 0;
  const double t_l = kvpr_step_time(cf, KvprSchedule::kPipelined, s_prime, l).total;
  const double t_0 = kvpr_step_time(c, KvprSchedule::kPipelined, s_prime, 0).total;
  return t_l < t_0 ? l : 0;
}

int64_t kvpr_kivi_visit_split(const KvprCosts& c, int64_t q_rows, double f16_s, int64_t l_cap,
                              int64_t group) {
  KVTIER_ASSERT(group >= 1 && q_rows >= 0, "key group {} quantised rows {}", group, q_rows);
  KvprCosts cq = c;
  cq.hidden_s = std::max(0.0, c.hidden_s - f16_s);  // the residual rows' transfer is hidden first
  const int64_t l = kvpr_visit_split(cq, q_rows, std::min(l_cap, q_rows));
  return l / group * group;
}

double kvpr_hidden_estimate(double decode_weights_s, int64_t visits_per_step) {
  if (!(decode_weights_s > 0) || visits_per_step <= 0) return 0;
  return decode_weights_s / static_cast<double>(visits_per_step);
}

std::vector<int64_t> kvpr_split_table(const KvprCosts& c, KvprSchedule schedule, KvprSplitPolicy policy,
                                      int64_t s, int64_t g) {
  KVTIER_ASSERT(s >= 0 && g >= 0, "prompt {} generation {}", s, g);
  std::vector<int64_t> out;
  if (g <= 1) return out;
  out.reserve(static_cast<size_t>(g - 1));
  if (policy == KvprSplitPolicy::kStaticFinal) {
    const int64_t l = std::min(s, kvpr_split(c, schedule, s + g, s + g));
    out.assign(static_cast<size_t>(g - 1), l);
    return out;
  }
  for (int64_t i = 1; i < g; ++i) out.push_back(kvpr_split(c, schedule, s + i - 1, s));
  return out;
}

double kvpr_layer_kv_bytes(int64_t b, int64_t s_prime, int64_t h, double p) {
  return 2.0 * static_cast<double>(b) * static_cast<double>(s_prime) * static_cast<double>(h) * p;
}

}  // namespace kvtier::policy
