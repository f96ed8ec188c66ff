#include "policy/hybrid_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"

namespace kvtier::policy {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

void check_nonneg(double v, const char* what) {
  if (!(v >= 0) || std::isinf(v))
    fail(ErrorKind::kInvalidArgument, "HybridServe planner: {} must be finite and ≥ 0, got {}", what, v);
}

void check_pos(double v, const char* what) {
  if (!(v > 0) || std::isinf(v))
    fail(ErrorKind::kInvalidArgument, "HybridServe planner: {} must be finite and > 0, got {}", what, v);
}

// f(n) with the intercept only when there is something to do (an empty load or recompute is not
// launched).
double cost(const LinearFit& f, double n) {
  return n > 0 ? f.at(n) : 0.0;
}

double lact_slope_of(HybridCostModel model, double slope) {
  return model == HybridCostModel::kLiteral ? 0.0 : slope;
}

}  // namespace

double hybrid_t_pcie(const HostAllocInput& in, int64_t n_act_host, int64_t n_kv_host) {
  const double b = static_cast<double>(in.block_tokens);
  return in.t_w + cost(in.load, static_cast<double>(n_kv_host) * b) +
         lact_slope_of(in.model, in.lact_slope) * static_cast<double>(n_act_host) * b;
}

double hybrid_t_comp(const HostAllocInput& in, int64_t n_act_host) {
  const double b = static_cast<double>(in.block_tokens);
  const double fwd = in.model == HybridCostModel::kLiteral ? 0.0 : in.t_fwd;
  return cost(in.gen, static_cast<double>(in.n_act_gpu + n_act_host) * b) + fwd;
}

HostAllocInput engine_alloc_input(double kv_bytes_token, double x_bytes_token, uint32_t n_layer,
                                  int64_t block_tokens, double home_blocks, double link_bytes_per_s,
                                  double recompute_tokens_per_s, double t_w) {
  const double bt = static_cast<double>(block_tokens);
  HostAllocInput in;
  in.block_tokens = block_tokens;
  in.s_kv = kv_bytes_token * bt;
  in.s_act = x_bytes_token * bt;
  in.m_host = in.s_kv * home_blocks;
  in.t_w = t_w;
  in.gen = {1.0 / recompute_tokens_per_s, 0};
  in.load = {kv_bytes_token / n_layer / link_bytes_per_s, 0};
  in.lact_slope = x_bytes_token / n_layer / link_bytes_per_s;
  return in;
}

HostAllocResult host_block_allocation(const HostAllocInput& in) {
  check_nonneg(in.m_host, "m_host");
  check_nonneg(in.m_w_host, "m_w_host");
  check_pos(in.s_kv, "s_kv (bytes of a KV block)");
  check_pos(in.s_act, "s_act (bytes of an ACT block)");
  check_pos(static_cast<double>(in.block_tokens), "block_tokens");
  check_nonneg(static_cast<double>(in.n_act_gpu), "n_act_gpu");
  check_nonneg(in.t_w, "t_w");
  check_nonneg(in.t_fwd, "t_fwd");
  check_pos(in.gen.slope, "f_gen slope");
  check_pos(in.load.slope, "f_load slope");
  check_nonneg(in.lact_slope, "f_lact slope");

  const double b = static_cast<double>(in.block_tokens);
  const double a_g = in.gen.slope;
  const double a_l = in.load.slope;
  const double a_la = lact_slope_of(in.model, in.lact_slope);
  const double free_bytes = std::max(0.0, in.m_host - in.m_w_host);

  // Step 1: the initial allocation balances T_w against the recompute of the compute-local ACT.
  const double t_gpu = hybrid_t_comp(in, 0);
  double d_act = 0, d_kv = 0;  // may be +inf before the clamp
  if (in.t_w > t_gpu) {
    d_act = a_g > a_la ? std::ceil((in.t_w - t_gpu) / ((a_g - a_la) * b)) : kInf;
  } else {
    d_kv = std::max(0.0, std::ceil((t_gpu - in.t_w - in.load.intercept) / (a_l * b)));
  }
  double x = 0, y = 0;
  const double m_rem = free_bytes - (d_act > 0 ? d_act * in.s_act : 0.0) - (d_kv > 0 ? d_kv * in.s_kv : 0.0);
  if (m_rem <= 0) {
    // The home cannot hold the initial allocation: shrink it to what fits.
    if (d_act > 0) d_act = std::floor(free_bytes / in.s_act);
    if (d_kv > 0) d_kv = std::floor(free_bytes / in.s_kv);
  } else if (a_g <= a_la) {
    // Recomputing is cheaper than loading the checkpoint's K,V: all ACT.
    x = std::floor(m_rem / in.s_act);
  } else {
    // Step 2: x·S_act + y·S_kv = M_rem and a_g·x·B = a_l·y·B + a_la·x·B.
    const double r = a_l / (a_g - a_la);
    y = std::floor(m_rem / (r * in.s_act + in.s_kv));
    x = std::floor(r * y);
  }
  // The floors leave up to a few blocks of the home unused: fill it block by block with the type
  // that keeps T_pcie and T_comp closer, until neither fits (the gap is then below the smaller block).
  double left = free_bytes - (d_act + x) * in.s_act - (d_kv + y) * in.s_kv;
  for (int guard = 0; guard < 4096 && left >= std::min(in.s_act, in.s_kv); ++guard) {
    const auto n_a = static_cast<int64_t>(d_act + x), n_k = static_cast<int64_t>(d_kv + y);
    const bool act_fits = left >= in.s_act, kv_fits = left >= in.s_kv;
    const double gap_act = std::fabs(hybrid_t_pcie(in, n_a + 1, n_k) - hybrid_t_comp(in, n_a + 1));
    const double gap_kv = std::fabs(hybrid_t_pcie(in, n_a, n_k + 1) - hybrid_t_comp(in, n_a));
    if (act_fits && (!kv_fits || gap_act <= gap_kv)) {
      x += 1;
      left -= in.s_act;
    } else {
      y += 1;
      left -= in.s_kv;
    }
  }
  if (left >= in.s_act) {  // a degenerate ratio left more than the guard's worth: the rest is ACT
    const double more = std::floor(left / in.s_act);
    x += more;
    left -= more * in.s_act;
  }
  HostAllocResult out;
  out.step1_act = static_cast<int64_t>(d_act);
  out.step1_kv = static_cast<int64_t>(d_kv);
  out.n_act_host = static_cast<int64_t>(d_act + x);
  out.n_kv_host = static_cast<int64_t>(d_kv + y);
  out.ratio = out.n_kv_host == 0 ? (out.n_act_host == 0 ? 0.0 : kInf)
                                 : static_cast<double>(out.n_act_host) / static_cast<double>(out.n_kv_host);
  out.t_pcie = hybrid_t_pcie(in, out.n_act_host, out.n_kv_host);
  out.t_comp = hybrid_t_comp(in, out.n_act_host);
  return out;
}

BlockKind next_block_type(double ratio, int64_t n_act, int64_t n_kv) {
  KVTIER_ASSERT(n_act >= 0 && n_kv >= 0 && !(ratio < 0) && !std::isnan(ratio), "R {} a {} k {}", ratio, n_act,
                n_kv);
  if (std::isinf(ratio)) return BlockKind::kAct;
  if (ratio == 0) return BlockKind::kKv;
  const double phi = ratio / (1 + ratio);
  const double a = static_cast<double>(n_act);
  const double total = static_cast<double>(n_act + n_kv + 1);
  const double e_act = std::fabs((a + 1) / total - phi);
  const double e_kv = std::fabs(a / total - phi);
  return e_act <= e_kv ? BlockKind::kAct : BlockKind::kKv;
}

int64_t act_blocks_of(double ratio, int64_t n_blocks) {
  int64_t a = 0;
  for (int64_t i = 0; i < n_blocks; ++i)
    if (next_block_type(ratio, a, i - a) == BlockKind::kAct) ++a;
  return a;
}

BlockKind block_type_at(double ratio, int64_t index) {
  const int64_t a = act_blocks_of(ratio, index);
  return next_block_type(ratio, a, index - a);
}

double mb_rho(const std::vector<MbRequest>& all, const std::vector<int64_t>& members, const MbCosts& c) {
  const double b = static_cast<double>(c.block_tokens);
  double kv = 0, acth = 0, act = 0;
  for (int64_t i : members) {
    const MbRequest& r = all[static_cast<size_t>(i)];
    kv += static_cast<double>(r.kv_host);
    acth += static_cast<double>(r.act_host);
    act += static_cast<double>(r.act_host + r.act_gpu);
  }
  double pcie = cost(c.load, kv * b);
  double comp = cost(c.gen, act * b);
  if (c.model == HybridCostModel::kRecommended) {
    const double share =
        all.empty() ? 0.0 : static_cast<double>(members.size()) / static_cast<double>(all.size());
    pcie += c.t_w * share + c.lact_slope * acth * b;
    comp += c.fwd_per_request * static_cast<double>(members.size());
  }
  if (pcie == 0 && comp == 0) return 1.0;
  if (comp == 0) return kInf;
  return pcie / comp;
}

std::vector<std::vector<int64_t>> form_mini_batches(const std::vector<MbRequest>& requests, int64_t k_max,
                                                    int64_t a_max, const MbCosts& c) {
  if (k_max < 0 || a_max < 0)
    fail(ErrorKind::kInvalidArgument, "HybridServe mini-batches: K_max {} and A_max {} must be ≥ 0", k_max,
         a_max);
  check_nonneg(c.tau, "tau");
  std::vector<int64_t> pending(requests.size());
  std::iota(pending.begin(), pending.end(), int64_t{0});
  auto size_of = [&](int64_t i) {
    const MbRequest& r = requests[static_cast<size_t>(i)];
    return r.kv_host + r.act_host + r.act_gpu;
  };
  std::stable_sort(pending.begin(), pending.end(),
                   [&](int64_t a, int64_t b) { return size_of(a) > size_of(b); });

  std::vector<std::vector<int64_t>> out;
  while (!pending.empty()) {
    std::vector<int64_t> s;
    int64_t kv = 0, act = 0;
    double cost_s = 0;
    bool added = true;
    while (added) {
      added = false;
      for (size_t p = 0; p < pending.size();) {
        const int64_t i = pending[p];
        const MbRequest& r = requests[static_cast<size_t>(i)];
        if (kv + r.kv_host > k_max || act + r.act_host + r.act_gpu > a_max) {
          ++p;
          continue;
        }
        std::vector<int64_t> with = s;
        with.push_back(i);
        const double cost_with = mb_cost(mb_rho(requests, with, c));
        const bool accept = s.empty() || (c.tau == 0 ? cost_with < cost_s
                                                     : cost_with <= std::max(cost_s, c.tau) * (1 + 1e-12));
        if (!accept) {
          ++p;
          continue;
        }
        s = std::move(with);
        cost_s = cost_with;
        kv += r.kv_host;
        act += r.act_host + r.act_gpu;
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(p));
        added = true;
      }
    }
    if (s.empty()) {
      // The first pending request alone exceeds K_max or A_max: a mini-batch of its own.
      s.push_back(pending.front());
      pending.erase(pending.begin());
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace kvtier::policy
