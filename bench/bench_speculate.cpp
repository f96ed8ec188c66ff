// kvtier bench_speculate: one layer's InfiniGen speculation (policy::speculate: partial scores, the
// group rule, counts, top rows) at the default models' shapes, on 1 and 2 threads, for the speculation
// share of decode (issue 16, C4). Scores are random; the pool polls as it does during decode.
//   build/cpu/bench/bench_speculate [--benchmark_filter=...] [--benchmark_repetitions=5]
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/spec_scores.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "policy/infinigen_select.h"

namespace kvtier::bench {
namespace {

// Shape of one model's speculating layer: query heads per KV head G, KV heads Hk, partial columns K.
struct Shape {
  int64_t G, Hk, K;
};

void bm_speculate(benchmark::State& state, Shape sh, policy::InfinigenGroup group) {
  const int64_t T = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const cpu::Isa isa = cpu::best_isa();
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  const int64_t H = sh.G * sh.Hk;
  std::vector<float> qp(static_cast<size_t>(H * sh.K));
  for (float& x : qp) x = nd(rng);
  std::vector<std::vector<uint16_t>> pk(static_cast<size_t>(sh.Hk));
  std::vector<const uint16_t*> pk_ptr;
  for (auto& p : pk) {
    p.resize(static_cast<size_t>(T * sh.K));
    for (uint16_t& x : p) x = f32_to_f16(nd(rng));
    pk_ptr.push_back(p.data());
  }
  const std::vector<int64_t> n_tokens{T};
  const std::vector<int64_t> cap{policy::speculation_cap(0.2, T)};
  ThreadPool pool(threads);
  policy::SpecInput in;
  in.n_seq = 1;
  in.n_head = H;
  in.n_head_kv = sh.Hk;
  in.k_cols = sh.K;
  in.scale = 0.6f;  // scores of about 2.6 standard deviations: 5-20 % of the rows within alpha = 5 of the
                    // max, as on the models
  in.qp = qp.data();
  in.pk = pk_ptr;
  in.n_tokens = n_tokens;
  in.cap = cap;
  in.group_scores = cpu::spec_scores_kernel(isa);
  in.head_scores = cpu::spec_head_scores_kernel(isa);
  in.group = group;
  in.pool = &pool;
  policy::SpecResult r;
  for (auto _ : state) {
    policy::speculate(in, 5.0f, r);
    benchmark::DoNotOptimize(r.idx.data());
  }
  state.SetItemsProcessed(state.iterations() * T);
  state.counters["n_sel"] = static_cast<double>(r.n_sel);
}

// SmolLM2-135M: 9 query heads over 3 KV heads, head size 64, r = 0.3 -> 19 columns.
// Gemma-3-270M: 4 query heads over 1 KV head, head size 256 -> 76 columns.
constexpr Shape kSmol{3, 3, 19};
constexpr Shape kGemma{4, 1, 76};

BENCHMARK_CAPTURE(bm_speculate, smollm2_relative, kSmol, policy::InfinigenGroup::kRelative)
    ->ArgsProduct({{1024, 4096}, {1, 2}})
    ->ArgNames({"T", "threads"});
BENCHMARK_CAPTURE(bm_speculate, smollm2_max, kSmol, policy::InfinigenGroup::kMax)
    ->ArgsProduct({{1024, 4096}, {1, 2}})
    ->ArgNames({"T", "threads"});
BENCHMARK_CAPTURE(bm_speculate, gemma3_relative, kGemma, policy::InfinigenGroup::kRelative)
    ->ArgsProduct({{1024, 4096}, {1, 2}})
    ->ArgNames({"T", "threads"});

}  // namespace
}  // namespace kvtier::bench

BENCHMARK_MAIN();
