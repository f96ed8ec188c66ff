// HybridServe's planners (spec hybridserve.md §4.7–4.10): pure functions, no backend.
//
// - host_block_allocation: Algorithm 1, how many blocks of the home tier are KV and how many are
//   activation checkpoints (ACT), so that the link time per layer equals the compute time per layer.
// - next_block_type: Eq. 11, the type of a sequence's next block so that its ACT:KV count follows R.
// - form_mini_batches: Algorithm 2, greedy packing of requests into mini-batches whose link/compute
//   ratio is close to 1.
//
// Times are seconds per decoder layer per decode step; f(n) are linear fits in tokens.
#pragma once

#include <cstdint>
#include <vector>

namespace kvtier::policy {

// f(n) = slope·n + intercept, n in tokens.
struct LinearFit {
  double slope = 0;
  double intercept = 0;
  double at(double n) const { return slope * n + intercept; }
};

enum class HybridCostModel {
  kRecommended,  // spec §4.7 [D]: host ACT blocks cross the link too (f_lact), T_comp includes T_fwd
  kLiteral,      // the paper's Eq. 9–10 as printed: a_la = 0, no T_fwd
};

struct HostAllocInput {
  double m_host = 0;         // usable home-tier bytes
  double m_w_host = 0;       // of them, taken by weights
  double s_kv = 0;           // bytes of one KV block (all layers)
  double s_act = 0;          // bytes of one ACT block (all layers)
  int64_t block_tokens = 0;  // B
  int64_t n_act_gpu = 0;     // ACT blocks already in compute-local memory
  double t_w = 0;            // one layer's weight load time
  double t_fwd = 0;          // kRecommended: one layer's forward of the batch
  LinearFit gen;             // f_gen: recompute K,V of n tokens
  LinearFit load;            // f_load: load K,V of n tokens
  double lact_slope = 0;     // f_lact(n) = lact_slope·n: load ACT rows of n tokens (kRecommended)
  HybridCostModel model = HybridCostModel::kRecommended;
};

struct HostAllocResult {
  int64_t n_act_host = 0;
  int64_t n_kv_host = 0;
  int64_t step1_act = 0;  // ΔA of the initial allocation
  int64_t step1_kv = 0;   // ΔK of the initial allocation
  double ratio = 0;       // R = n_act_host / n_kv_host (+inf when n_kv_host = 0 and n_act_host > 0)
  double t_pcie = 0;      // predicted, with these counts
  double t_comp = 0;
};

// Algorithm 1 (spec §4.8). Throws Error(kInvalidArgument) on negative sizes, B ≤ 0, S_kv or S_act
// ≤ 0, or load/gen slopes ≤ 0. A home too small for the weights gives 0 blocks of each.
HostAllocResult host_block_allocation(const HostAllocInput& in);

// Algorithm 1's input for this engine (TieredKv's --act-ratio auto and kvtier plan's prediction):
// one token's K/V and stored-input bytes summed over the n_layer layers, a home of home_blocks
// blocks of block_tokens tokens, the home link and the K/V recompute rate (per layer), and T_w.
// Per-layer times are the layers' average; no compute-local ACT pool.
HostAllocInput engine_alloc_input(double kv_bytes_token, double x_bytes_token, uint32_t n_layer,
                                  int64_t block_tokens, double home_blocks, double link_bytes_per_s,
                                  double recompute_tokens_per_s, double t_w);

// The predicted link and compute time per layer of a given split (spec §4.7).
double hybrid_t_pcie(const HostAllocInput& in, int64_t n_act_host, int64_t n_kv_host);
double hybrid_t_comp(const HostAllocInput& in, int64_t n_act_host);

enum class BlockKind : uint8_t { kKv, kAct };

// Eq. 11 (spec §4.9): with n_act ACT and n_kv KV blocks so far, the type of the next block under the
// ratio R = ACT/KV (R = 0: always KV; R = +inf: always ACT). Ties go to ACT (the paper's example:
// R = 3, 5 ACT, 2 KV -> ACT).
BlockKind next_block_type(double ratio, int64_t n_act, int64_t n_kv);
// How many of the first n blocks of a sequence are ACT under R (applying next_block_type n times).
int64_t act_blocks_of(double ratio, int64_t n_blocks);
// The type of block index i (0-based) of a sequence under R: ACT iff act_blocks_of(i + 1) grew.
BlockKind block_type_at(double ratio, int64_t index);

// One request's blocks for Algorithm 2.
struct MbRequest {
  int64_t kv_host = 0;   // host KV blocks
  int64_t act_host = 0;  // host ACT blocks
  int64_t act_gpu = 0;   // compute-local ACT blocks
};

struct MbCosts {
  int64_t block_tokens = 0;
  double t_w = 0;              // one layer's weight load time (shared over the batch)
  double fwd_per_request = 0;  // T_fwd(S) = fwd_per_request·|S|
  LinearFit gen, load;
  double lact_slope = 0;
  HybridCostModel model = HybridCostModel::kRecommended;
  double tau = 0.01;  // acceptance tolerance (spec A5 says 0.10; 0.01 measured better, see
                      // docs/hybridserve.md); 0 = the literal strict-improvement test
};

// rho(S) of Eq. 12 for the requests `members` of `all` (recommended form with the weight share
// T_w·|S|/|Rq|; literal: f_load / f_gen). 1 when both sides are 0, +inf when only T_comp is.
double mb_rho(const std::vector<MbRequest>& all, const std::vector<int64_t>& members, const MbCosts& c);
inline double mb_cost(double rho) {
  return rho > 1 ? rho - 1 : 1 - rho;
}

// Algorithm 2 (spec §4.10): indices of `requests` per mini-batch. Each request lands in exactly one
// mini-batch; a mini-batch holds at most k_max KV and a_max ACT blocks, except a request that alone
// exceeds them, which gets a mini-batch of its own (the caller splits it, spec A15).
std::vector<std::vector<int64_t>> form_mini_batches(const std::vector<MbRequest>& requests, int64_t k_max,
                                                    int64_t a_max, const MbCosts& c);

}  // namespace kvtier::policy
