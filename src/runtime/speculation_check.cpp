#include "runtime/speculation_check.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/spec_scores.h"
#include "core/error.h"
#include "kv/partial_keys.h"

namespace kvtier::runtime {

std::vector<LayerSpeculation> check_speculation(const model::ModelConfig& cfg, const skew::SkewSet& set,
                                                const std::vector<LayerSamples>& held_out,
                                                const policy::InfinigenParams& params, bool lookahead) {
  policy::validate(params);
  KVTIER_ASSERT(held_out.size() == cfg.n_layer && set.layers.size() == cfg.n_layer);
  const int64_t n = held_out.front().n;
  if (n < 8) fail(ErrorKind::kInvalidArgument, "the speculation check needs at least 8 tokens (got {})", n);
  const int64_t d = set.head_dim;
  const int64_t H = cfg.n_head;
  const int64_t prompt = n / 2;
  kv::MemoryLedger ledger;
  kv::PartialKeys pk(set, {H, n, 1, 1}, ledger);  // min_prompt 1: columns from the "prompt" itself
  std::vector<LayerSpeculation> out;
  std::vector<float> q_all, qa_all, k_all, qp, probs;
  policy::SpecResult spec;
  for (uint32_t l = 2; l < cfg.n_layer; ++l) {
    if (cfg.layers[l].window > 0) continue;  // a sliding-window layer attends densely at run time
    const LayerSamples& s = held_out[l];
    const int64_t hk = s.n_head_kv, G = s.group;
    // Back to the forward pass's layouts: q [n, H, d], k [n, hk, d].
    if (lookahead && s.q_ahead.size() != s.q.size())
      fail(ErrorKind::kInternal, "layer {}: the samples carry no look-ahead queries", l);
    const auto& spec_q = lookahead ? s.q_ahead : s.q;  // the rows the partial queries come from
    q_all.assign(static_cast<size_t>(n * H * d), 0.0f);
    qa_all.assign(static_cast<size_t>(n * H * d), 0.0f);
    k_all.assign(static_cast<size_t>(n * hk * d), 0.0f);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t g = 0; g < hk; ++g) {
        std::copy_n(&s.k[static_cast<size_t>(g)][static_cast<size_t>(t * d)], d,
                    &k_all[static_cast<size_t>((t * hk + g) * d)]);
        for (int64_t j = 0; j < G; ++j) {
          const auto src = static_cast<size_t>((t * G + j) * d);
          const auto dst = static_cast<size_t>((t * H + g * G + j) * d);
          std::copy_n(&s.q[static_cast<size_t>(g)][src], d, &q_all[dst]);
          std::copy_n(&spec_q[static_cast<size_t>(g)][src], d, &qa_all[dst]);
        }
      }
    pk.reset(0);
    pk.observe(0, l, q_all.data(), k_all.data(), prompt);
    // choose_columns picks for every layer; only this one's scores were observed (others unused).
    pk.choose_columns(0);
    pk.write(0, l, 0, k_all.data(), n);
    LayerSpeculation r;
    r.layer = l;
    int64_t steps = 0, heads_seen = 0;
    const int64_t k_cols = pk.k_cols();
    qp.resize(static_cast<size_t>(H * k_cols));
    std::vector<const uint16_t*> pk_rows(static_cast<size_t>(hk));
    for (int64_t g = 0; g < hk; ++g)
      pk_rows[static_cast<size_t>(g)] = pk.rows(0, l, static_cast<uint32_t>(g));
    for (int64_t t = prompt; t < n; ++t) {
      const int64_t T = t;  // keys before the current token
      for (int64_t h = 0; h < H; ++h)
        policy::partial_rows(&qa_all[static_cast<size_t>((t * H + h) * d)], 1, d,
                             pk.projection(0, l, static_cast<uint32_t>(h / G)), k_cols,
                             &qp[static_cast<size_t>(h * k_cols)]);
      const int64_t cap = policy::speculation_cap(params.budget, T);
      policy::SpecInput in;
      in.n_seq = 1;
      in.n_head = H;
      in.n_head_kv = hk;
      in.k_cols = k_cols;
      in.scale = cfg.attn_scale;
      in.qp = qp.data();
      in.pk = pk_rows;
      in.n_tokens = {&T, 1};
      in.cap = {&cap, 1};
      in.group_scores = cpu::spec_scores_kernel(cpu::best_isa());  // the scalar loop's bits on every ISA
      in.group = params.group;
      in.head_scores = cpu::spec_head_scores_kernel(cpu::best_isa());
      policy::speculate(in, params.alpha, spec);
      r.fetched += static_cast<double>(spec.chosen[0]) / static_cast<double>(T);
      r.n_sel += static_cast<double>(spec.chosen[0]);
      ++steps;
      // Exact attention of each query head over keys 0..t (window and softcap as the layer has them).
      const int64_t window = cfg.layers[l].window;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t g = h / G;
        const float* q = &q_all[static_cast<size_t>((t * H + h) * d)];
        probs.assign(static_cast<size_t>(t + 1), 0.0f);
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= t; ++j) {
          if (window > 0 && t - j >= window) {
            probs[static_cast<size_t>(j)] = -std::numeric_limits<float>::infinity();
            continue;
          }
          double dot = 0.0;
          for (int64_t c = 0; c < d; ++c)
            dot += static_cast<double>(q[c]) * k_all[static_cast<size_t>((j * hk + g) * d + c)];
          double sc = dot * cfg.attn_scale;
          if (cfg.attn_softcap > 0.0f) sc = cfg.attn_softcap * std::tanh(sc / cfg.attn_softcap);
          probs[static_cast<size_t>(j)] = static_cast<float>(sc);
          mx = std::max(mx, sc);
        }
        double total = 0.0, kept = 0.0;
        std::vector<bool> chosen(static_cast<size_t>(t + 1), false);
        for (const int32_t j : spec.rows(0, g, hk)) chosen[static_cast<size_t>(j)] = true;
        chosen[static_cast<size_t>(t)] = true;  // the current token is always attended
        for (int64_t j = 0; j <= t; ++j) {
          if (std::isinf(probs[static_cast<size_t>(j)])) continue;
          const double p = std::exp(static_cast<double>(probs[static_cast<size_t>(j)]) - mx);
          total += p;
          if (chosen[static_cast<size_t>(j)]) kept += p;
        }
        const double rec = kept / total;
        r.recall += rec;
        r.min_recall = std::min(r.min_recall, rec);
        ++heads_seen;
      }
    }
    r.fetched /= static_cast<double>(steps);
    r.n_sel /= static_cast<double>(steps);
    r.recall /= static_cast<double>(heads_seen);
    out.push_back(r);
  }
  return out;
}

}  // namespace kvtier::runtime
