// CPU kernel benchmarks.
//   copy/threads:T            STREAM-like copy (2 x 256 MiB, bytes read + written), the DRAM reference
//   read/threads:T            read-only sweep of 256 MiB (what a matvec does to its weights): 32-byte
//                             loads where the CPU has AVX2 (scalar 8-byte loads reached 55-70 % of
//                             their speed on an Intel Xeon), bytes read per second
//   read4/threads:T           the same bytes, each thread's share read as 4 streams in turn (128 bytes
//                             from each): how far the prefetchers take one core past a single stream
//   read512/threads:T         one stream of 64-byte loads, where the CPU has AVX-512 (the loads of that
//                             path's one-token kernels; on an Intel Xeon guest 1.4x the 32-byte sweep)
//   matvec/TYPE/ISA/threads:T one token x a [n_rows, 4096] matrix of ~256 MiB (far beyond the caches);
//                             GB/s of weight bytes, and pct_copy = GB/s / copy GB/s at the same threads
//   matvec_lanes/...          the same product from the matrix's rows-in-lanes copy (weight_lanes.h),
//                             where the ISA has a lanes kernel for the type; GB/s of the GGUF bytes
//   matmul/TYPE/TOKxK->N/threads:T  prefill shapes (2048 -> 640: Gemma-3-270M's FFN down, a K-quant size);
//                             matmul_lanes/...: the same from the rows-in-lanes copy, for the types whose
//                             lanes kernel serves prefill (KernelTable::lanes_any_tokens: q8_0; on the
//                             AVX-512 path without AMX every lanes type)
//   GFLOP/s (2 * tokens * k * n) and pct_peak = GFLOP/s
//                             / measured FMA peak (f32 lanes of the ISA used, same thread count);
//                             quantised types also pct_int8_peak = GFLOP/s / measured int8 dot peak
//                             (AVX2: vpmaddubsw + vpmaddwd + vpaddd; AVX-512: vpdpbusd), and on CPUs
//                             whose AVX-512 path uses AMX (cpu::uses_amx) pct_amx_int8_peak against a
//                             TDPBSSD loop's peak (peak_amx.cpp)
//   attend/ISA/Q:N/ctx:C      causal attention of N query tokens at the end of a C-token f16 context,
//                             SmolLM2's shape (9 query heads, 3 KV heads, head size 64), 1 thread;
//                             keys per second = N * C / time (Q:1 is a decode step's attention)
// Run with --benchmark_repetitions=N --benchmark_report_aggregates_only=true and read medians.
#include <benchmark/benchmark.h>

#include "backend/cpu/spec_scores.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/quantize_act.h"
#include "backend/cpu/weight_lanes.h"
#include "core/ggml_type.h"
#include "core/half.h"
#include "core/thread_pool.h"

namespace kvtier::bench {

float fma_loop_avx2(int64_t iters);
float fma_loop_avx512(int64_t iters);
int int8_loop_avx2(int64_t iters);
int int8_loop_avx512(int64_t iters);
int int8_loop_amx(int64_t iters);
uint64_t read_loop_avx2(const uint8_t* p, int64_t bytes, int streams);
uint64_t read_loop_avx512(const uint8_t* p, int64_t bytes);

namespace {

using cpu::Isa;
constexpr size_t kBigBytes = size_t{256} << 20;

uint64_t next_random(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}

// Byte offsets of f16 scale fields per block (random bits there could be inf/nan or denormal).
std::vector<int> f16_fields(GgmlType t) {
  switch (t) {
    case GgmlType::kQ4_0:
    case GgmlType::kQ5_0:
    case GgmlType::kQ8_0:
      return {0};
    case GgmlType::kQ4_1:
    case GgmlType::kQ5_1:
    case GgmlType::kQ4_K:
    case GgmlType::kQ5_K:
      return {0, 2};
    case GgmlType::kQ2_K:
      return {80, 82};
    case GgmlType::kQ3_K:
      return {108};
    case GgmlType::kQ6_K:
      return {208};
    default:
      return {};
  }
}

// Random weights of `type`: [n_rows, k]; floats and scales are finite normal numbers.
std::vector<uint8_t> random_matrix(GgmlType type, int64_t n_rows, int64_t k) {
  const auto& tr = ggml_traits(type);
  const size_t bytes = static_cast<size_t>(*ggml_row_bytes(type, static_cast<uint64_t>(k))) * n_rows;
  std::vector<uint8_t> w(bytes);
  uint64_t s = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t r = next_random(s);
    std::memcpy(w.data() + i, &r, 8);
  }
  auto small_float = [&s]() { return static_cast<float>(next_random(s) % 2000) / 1000.0f - 1.0f; };
  if (type == GgmlType::kF32) {
    for (size_t i = 0; i < bytes / 4; ++i) {
      const float v = small_float();
      std::memcpy(w.data() + 4 * i, &v, 4);
    }
  } else if (type == GgmlType::kF16 || type == GgmlType::kBF16) {
    for (size_t i = 0; i < bytes / 2; ++i) {
      const uint16_t h = type == GgmlType::kF16 ? f32_to_f16(small_float()) : f32_to_bf16(small_float());
      std::memcpy(w.data() + 2 * i, &h, 2);
    }
  } else {
    for (size_t b = 0; b < bytes / tr.type_size; ++b) {
      for (int off : f16_fields(type)) {
        const uint16_t h = f32_to_f16(0.01f * (1.0f + small_float()));
        std::memcpy(w.data() + b * tr.type_size + off, &h, 2);
      }
    }
  }
  return w;
}

double seconds_of(const auto& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Copy bandwidth (bytes read + written per second), median of 5, per thread count; measured once.
double copy_bandwidth(int threads) {
  static const std::vector<double> by_threads = [] {
    std::vector<double> out(3, 0.0);
    std::vector<uint8_t> src(kBigBytes, 1), dst(kBigBytes, 0);
    for (int t = 1; t <= 2; ++t) {
      ThreadPool pool(t);
      std::vector<double> runs;
      for (int rep = 0; rep < 5; ++rep) {
        runs.push_back(seconds_of([&] {
          pool.run(t, [&](int p) {
            const Range r = split_range(static_cast<int64_t>(kBigBytes), t, p, 4096);
            std::memcpy(dst.data() + r.begin, src.data() + r.begin, static_cast<size_t>(r.size()));
          });
        }));
      }
      std::sort(runs.begin(), runs.end());
      out[static_cast<size_t>(t)] = 2.0 * static_cast<double>(kBigBytes) / runs[2];
    }
    return out;
  }();
  return by_threads[static_cast<size_t>(std::min(threads, 2))];
}

// Throughput of a peak loop on `threads` threads, measured once per (isa, threads): ops_per_iter ops
// per iteration of loop(isa, iters), the fastest of 7 timings (a peak is what the core reaches when
// nothing else runs; on a shared VM the middle of 3 read 387-712 GOP/s int8 in three processes).
double loop_peak(Isa isa, int threads, double ops_per_iter, float (*loop)(Isa, int64_t)) {
  const int64_t iters = 20'000'000;
  ThreadPool pool(threads);
  std::vector<float> sink(static_cast<size_t>(threads));
  double fastest = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < 7; ++rep) {
    fastest = std::min(fastest, seconds_of([&] {
                         pool.run(threads, [&](int p) { sink[static_cast<size_t>(p)] = loop(isa, iters); });
                       }));
  }
  benchmark::DoNotOptimize(sink.data());
  return ops_per_iter * static_cast<double>(iters) * threads / fastest;
}

float fma_loop(Isa isa, int64_t iters) {
  return isa == Isa::kAvx512 ? fma_loop_avx512(iters) : fma_loop_avx2(iters);
}
float int8_loop(Isa isa, int64_t iters) {
  return static_cast<float>(isa == Isa::kAvx512 ? int8_loop_avx512(iters) : int8_loop_avx2(iters));
}

// FMA peak in FLOP/s (2 per lane per FMA, 12 FMAs per iteration) of `isa`'s vector width on `threads`
// threads, measured once.
double fma_peak(Isa isa, int threads) {
  auto measure = [](Isa i, int t) {
    return loop_peak(i, t, 2.0 * (i == Isa::kAvx512 ? 16 : 8) * 12, fma_loop);
  };
  static const double avx2_1 = measure(Isa::kAvx2, 1), avx2_2 = measure(Isa::kAvx2, 2);
  if (isa == Isa::kAvx512) {
    static const double avx512_1 = measure(Isa::kAvx512, 1), avx512_2 = measure(Isa::kAvx512, 2);
    return threads == 1 ? avx512_1 : avx512_2;
  }
  return threads == 1 ? avx2_1 : avx2_2;
}

// int8 dot peak in OP/s (2 per u8 x s8 product) of `isa`'s integer dot instructions on `threads`
// threads, measured once: AVX2 vpmaddubsw + vpmaddwd + vpaddd per 32 products, AVX-512 one
// vpdpbusd per 64, 12 per iteration. The quantised kernels are built from exactly these.
double int8_peak(Isa isa, int threads) {
  auto measure = [](Isa i, int t) {
    return loop_peak(i, t, 2.0 * (i == Isa::kAvx512 ? 64 : 32) * 12, int8_loop);
  };
  static const double avx2_1 = measure(Isa::kAvx2, 1), avx2_2 = measure(Isa::kAvx2, 2);
  if (isa == Isa::kAvx512) {
    static const double avx512_1 = measure(Isa::kAvx512, 1), avx512_2 = measure(Isa::kAvx512, 2);
    return threads == 1 ? avx512_1 : avx512_2;
  }
  return threads == 1 ? avx2_1 : avx2_2;
}

// AMX-INT8 peak in OP/s (2 per s8 x s8 product, 4 TDPBSSD of 16 x 16 x 64 per iteration) on `threads`
// threads, measured once; only where cpu::uses_amx(Isa::kAvx512).
double amx_int8_peak(int threads) {
  auto loop = [](Isa, int64_t iters) { return static_cast<float>(int8_loop_amx(iters / 16)); };
  auto measure = [&](int t) { return loop_peak(Isa::kAvx512, t, 2.0 * 4 * 16 * 16 * 64 / 16, loop); };
  static const double one = measure(1), two = measure(2);
  return threads == 1 ? one : two;
}

void bm_copy(benchmark::State& state, int threads) {
  std::vector<uint8_t> src(kBigBytes, 1), dst(kBigBytes, 0);
  ThreadPool pool(threads);
  for (auto _ : state) {
    pool.run(threads, [&](int p) {
      const Range r = split_range(static_cast<int64_t>(kBigBytes), threads, p, 4096);
      std::memcpy(dst.data() + r.begin, src.data() + r.begin, static_cast<size_t>(r.size()));
    });
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * static_cast<int64_t>(kBigBytes));
}

// streams 0: read512's 64-byte loads (AVX-512 CPUs only).
void bm_read(benchmark::State& state, int threads, int streams) {
  std::vector<uint64_t> src(kBigBytes / 8, 3);
  ThreadPool pool(threads);
  std::vector<uint64_t> sums(static_cast<size_t>(threads));
  const bool vector = cpu::isa_supported(Isa::kAvx2);
  for (auto _ : state) {
    pool.run(threads, [&](int p) {
      const Range r = split_range(static_cast<int64_t>(src.size()), threads, p, 512);
      if (streams == 0) {
        sums[static_cast<size_t>(p)] =
            read_loop_avx512(reinterpret_cast<const uint8_t*>(src.data() + r.begin), r.size() * 8);
        return;
      }
      if (vector) {  // 512 words per unit: a multiple of the loop's 128 bytes
        sums[static_cast<size_t>(p)] =
            read_loop_avx2(reinterpret_cast<const uint8_t*>(src.data() + r.begin), r.size() * 8, streams);
        return;
      }
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      int64_t i = r.begin;
      for (; i + 4 <= r.end; i += 4) s0 += src[i], s1 += src[i + 1], s2 += src[i + 2], s3 += src[i + 3];
      for (; i < r.end; ++i) s0 += src[i];
      sums[static_cast<size_t>(p)] = s0 + s1 + s2 + s3;
    });
    benchmark::DoNotOptimize(sums.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(kBigBytes));
}

// m's rows-in-lanes copy, attached to it, where `lanes` (null otherwise); it must outlive m's use.
std::unique_ptr<cpu::LanesWeights> with_lanes(cpu::WeightMatrix& m, bool lanes) {
  if (!lanes) return nullptr;
  auto packed = std::make_unique<cpu::LanesWeights>(cpu::pack_lanes(m));
  m.lanes = packed->data();
  return packed;
}

void bm_matvec(benchmark::State& state, GgmlType type, Isa isa, int threads, bool lanes) {
  const int64_t k = 4096;
  const int64_t row_bytes = static_cast<int64_t>(*ggml_row_bytes(type, k));
  const int64_t n_rows = static_cast<int64_t>(kBigBytes) / row_bytes / 16 * 16;
  const auto w = random_matrix(type, n_rows, k);
  std::vector<float> x(static_cast<size_t>(k), 0.5f), y(static_cast<size_t>(n_rows));
  std::vector<uint8_t> scratch(cpu::matmul_scratch_bytes(type, k, 1));
  ThreadPool pool(threads);
  cpu::WeightMatrix m{type, w.data(), n_rows, k};
  const auto packed = with_lanes(m, lanes);
  for (auto _ : state) {
    cpu::matmul(pool, isa, m, x.data(), 1, y.data(), scratch);
    benchmark::DoNotOptimize(y.data());
  }
  const double bytes = static_cast<double>(w.size());  // the GGUF bytes either way
  state.counters["GBps"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["copy_GBps"] = copy_bandwidth(threads) / 1e9;
  state.counters["pct_copy"] = benchmark::Counter(bytes * 100.0 / copy_bandwidth(threads),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

void bm_matmul(benchmark::State& state, GgmlType type, Isa isa, int threads, int64_t tokens, int64_t k,
               int64_t n, bool lanes) {
  const auto w = random_matrix(type, n, k);
  std::vector<float> x(static_cast<size_t>(tokens * k), 0.25f), y(static_cast<size_t>(tokens * n));
  std::vector<uint8_t> scratch(cpu::matmul_scratch_bytes(type, k, tokens));
  ThreadPool pool(threads);
  cpu::WeightMatrix m{type, w.data(), n, k};
  const auto packed = with_lanes(m, lanes);
  for (auto _ : state) {
    cpu::matmul(pool, isa, m, x.data(), tokens, y.data(), scratch);
    benchmark::DoNotOptimize(y.data());
  }
  const double flops = 2.0 * static_cast<double>(tokens) * static_cast<double>(k) * static_cast<double>(n);
  const double peak = fma_peak(isa, threads);
  state.counters["GFLOPs"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["peak_GFLOPs"] = peak / 1e9;
  state.counters["pct_peak"] =
      benchmark::Counter(flops * 100.0 / peak, benchmark::Counter::kIsIterationInvariantRate);
  if (cpu::act_format_for(type) != cpu::ActFormat::kF32) {  // quantised weights: integer dots
    const double ipeak = int8_peak(isa, threads);
    state.counters["int8_peak_GOPs"] = ipeak / 1e9;
    state.counters["pct_int8_peak"] =
        benchmark::Counter(flops * 100.0 / ipeak, benchmark::Counter::kIsIterationInvariantRate);
    if (cpu::uses_amx(isa)) {  // the matmul takes AMX tiles for this type where the table has them
      const double apeak = amx_int8_peak(threads);
      state.counters["amx_int8_peak_GOPs"] = apeak / 1e9;
      state.counters["pct_amx_int8_peak"] =
          benchmark::Counter(flops * 100.0 / apeak, benchmark::Counter::kIsIterationInvariantRate);
    }
  }
}

// InfiniGen's estimated scores for one KV head: SmolLM2's shape (3 query heads per KV head, 19
// partial columns) over T rows; items = rows scored. units > 1: each call scores the next of `units`
// separate partial key caches (a decode step's 28 layers x 3 KV heads: 84 x T x 38 B of f16, out of cache).
void bm_spec_scores(benchmark::State& state, Isa isa, int64_t T, int64_t units) {
  const int64_t G = 3, K = 19;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> q(static_cast<size_t>(G * K)), out(static_cast<size_t>(T));
  std::vector<uint16_t> pk(static_cast<size_t>(units * T * K));  // [units, T, K] f16
  for (float& x : q) x = nd(rng);
  for (uint16_t& x : pk) x = f32_to_f16(nd(rng));
  const cpu::SpecScoresFn fn = cpu::spec_scores_kernel(isa);
  int64_t u = 0;
  for (auto _ : state) {
    fn(q.data(), G, K, pk.data() + u * T * K, T, 0.125f, out.data());
    benchmark::DoNotOptimize(out.data());
    u = u + 1 == units ? 0 : u + 1;
  }
  state.SetItemsProcessed(state.iterations() * T);
}

// One layer's attention of SmolLM2 (9 query heads over 3 KV heads, head size 64, f16 KV): the last
// n_q of ctx positions attend over the whole context; 1 thread; items = query tokens x keys.
void bm_attend(benchmark::State& state, Isa isa, int64_t n_q, int64_t ctx) {
  const int64_t Hkv = 3, G = 3, D = 64;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<uint16_t> k(static_cast<size_t>(Hkv * ctx * D)), v(k.size());  // [Hkv][ctx, D] f16
  for (uint16_t& x : k) x = f32_to_f16(nd(rng));
  for (uint16_t& x : v) x = f32_to_f16(nd(rng));
  std::vector<float> q(static_cast<size_t>(n_q * Hkv * G * D)), o(q.size());  // [n_q, Hkv * G, D]
  for (float& x : q) x = nd(rng);
  cpu::AttnParams p;
  p.head_dim_k = p.head_dim_v = D;
  p.q_per_kv = G;
  p.scale = 0.125f;
  p.kv_dtype = cpu::KvDtype::kF16;
  cpu::KvSpan span;
  span.n_tokens = ctx;
  span.k = k.data();
  span.v = v.data();
  span.k_head_stride = span.v_head_stride = ctx * D;
  cpu::AttnQueries aq;
  aq.q = q.data();
  aq.token_stride = Hkv * G * D;
  aq.n_tokens = n_q;
  aq.n_heads = Hkv * G;
  aq.pos0 = ctx - n_q;
  cpu::AttnOutput out;
  out.o = o.data();
  out.token_stride = Hkv * G * D;
  ThreadPool pool(1);
  std::vector<uint8_t> scratch(cpu::attention_scratch_bytes(p, 1));
  for (auto _ : state) {
    cpu::attend(pool, isa, p, aq, {&span, 1}, out, scratch);
    benchmark::DoNotOptimize(o.data());
  }
  state.SetItemsProcessed(state.iterations() * n_q * ctx);
}

void register_all() {
  const Isa best = cpu::best_isa();
  const std::vector<GgmlType> types = {GgmlType::kF32,  GgmlType::kF16,  GgmlType::kBF16, GgmlType::kQ4_0,
                                       GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ8_0,
                                       GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K,
                                       GgmlType::kQ6_K};
  std::vector<Isa> isas = {best};
  if (best == Isa::kAvx512) isas.push_back(Isa::kAvx2);
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (!cpu::isa_supported(isa)) continue;
    benchmark::RegisterBenchmark(("spec_scores/" + std::string(cpu::isa_name(isa)) + "/T:4096").c_str(),
                                 bm_spec_scores, isa, int64_t{4096}, int64_t{1});
    benchmark::RegisterBenchmark(
        ("spec_scores/" + std::string(cpu::isa_name(isa)) + "/T:3545/units:84").c_str(), bm_spec_scores, isa,
        int64_t{3545}, int64_t{84});
  }
  for (Isa isa : isas) {
    for (const auto& [n_q, ctx] : {std::pair<int64_t, int64_t>{1, 4096}, {16, 4096}, {512, 4096}}) {
      const std::string name = "attend/" + std::string(cpu::isa_name(isa)) + "/Q:" + std::to_string(n_q) +
                               "/ctx:" + std::to_string(ctx);
      benchmark::RegisterBenchmark(name.c_str(), bm_attend, isa, n_q, ctx)->Unit(benchmark::kMicrosecond);
    }
  }
  for (int t : {1, 2}) {
    benchmark::RegisterBenchmark(("copy/threads:" + std::to_string(t)).c_str(), bm_copy, t)->UseRealTime();
    benchmark::RegisterBenchmark(("read/threads:" + std::to_string(t)).c_str(), bm_read, t, 1)->UseRealTime();
    if (cpu::isa_supported(Isa::kAvx2))  // the scalar sweep has one stream only
      benchmark::RegisterBenchmark(("read4/threads:" + std::to_string(t)).c_str(), bm_read, t, 4)
          ->UseRealTime();
    if (cpu::isa_supported(Isa::kAvx512))
      benchmark::RegisterBenchmark(("read512/threads:" + std::to_string(t)).c_str(), bm_read, t, 0)
          ->UseRealTime();
  }
  for (GgmlType type : types) {
    for (Isa isa : isas) {
      for (int t : {1, 2}) {
        const std::string name = "matvec/" + std::string(ggml_type_name(type)) + "/" +
                                 std::string(cpu::isa_name(isa)) + "/threads:" + std::to_string(t);
        benchmark::RegisterBenchmark(name.c_str(), bm_matvec, type, isa, t, false)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
        if (cpu::has_lanes_layout(type) &&
            cpu::kernel_table(isa).lanes[static_cast<size_t>(type)] != nullptr) {
          benchmark::RegisterBenchmark(("matvec_lanes" + name.substr(6)).c_str(), bm_matvec, type, isa, t,
                                       true)
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
      }
    }
  }
  struct Shape {
    int64_t tokens, k, n;
  };
  for (const Shape s :
       {Shape{512, 576, 1536}, Shape{512, 640, 2048}, Shape{512, 2048, 640}, Shape{512, 4096, 4096}}) {
    for (GgmlType type : types) {
      for (Isa isa : isas) {
        const bool big = s.k == 4096;
        if (big && type != GgmlType::kF16 && type != GgmlType::kQ8_0)
          continue;                                             // the slow shape: goal types only
        if (s.k % ggml_traits(type).block_size != 0) continue;  // 576 is not a K-quant size
        for (int t : {1, 2}) {
          const std::string name = "matmul/" + std::string(ggml_type_name(type)) + "/" +
                                   std::to_string(s.tokens) + "x" + std::to_string(s.k) + "->" +
                                   std::to_string(s.n) + "/" + std::string(cpu::isa_name(isa)) +
                                   "/threads:" + std::to_string(t);
          auto* b =
              benchmark::RegisterBenchmark(name.c_str(), bm_matmul, type, isa, t, s.tokens, s.k, s.n, false);
          b->UseRealTime()->Unit(benchmark::kMillisecond);
          if (big) b->Iterations(1);
          const auto ti = static_cast<size_t>(type);
          if (cpu::has_lanes_layout(type) && cpu::kernel_table(isa).lanes[ti] != nullptr &&
              cpu::kernel_table(isa).lanes_any_tokens[ti]) {  // prefill reads the copy too
            b = benchmark::RegisterBenchmark(("matmul_lanes" + name.substr(6)).c_str(), bm_matmul, type, isa,
                                             t, s.tokens, s.k, s.n, true);
            b->UseRealTime()->Unit(benchmark::kMillisecond);
            if (big) b->Iterations(1);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  kvtier::bench::register_all();
  benchmark::AddCustomContext("isa", std::string(kvtier::cpu::isa_name(kvtier::cpu::best_isa())));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
