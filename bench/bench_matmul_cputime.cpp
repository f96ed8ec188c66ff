// Prefill matmul throughput per CPU second, for machines shared with other work: the process CPU time
// of a call (CLOCK_PROCESS_CPUTIME_ID; the thread pool sleeps on condition variables, so idle workers
// add nothing) does not grow when the scheduler hands the cores to someone else, while wall time
// does. One thread, the best ISA, Gemma-3-270M's matmul shapes (512 tokens):
//   q5_0 640 -> 2048 (attn_q, ffn_gate/up)   q8_0 640 -> 2048 (attn_v, for comparison)
//   q4_K 1024 -> 640 (attn_output, ffn_down)  q6_K 2048 -> 640 (ffn_down)
//   q4_1 576 -> 1536 (SmolLM2's FFN)          f16 640 -> 2048
// Prints "type tokens x k -> n  GFLOP per CPU second" (2 x tokens x k x n flops), the best of 5
// timings of `iters` calls each, from the GGUF rows and, where the ISA has a lanes kernel for the
// type, with the rows-in-lanes copy attached (which prefill then reads where the table says
// lanes_any_tokens). Then decode: one token against [rows, 2048] weights of each type
// (rows 16384: 23-34 MB, past the L2 but partly in a 32 MB L3; rows 256: in L2, the kernel's own
// speed), "GB of weights per CPU second", and the same from the rows-in-lanes copy (weight_lanes.h)
// where the ISA has a lanes kernel for the type.
//   build/cpu/bench/bench_matmul_cputime [iters=10] [scalar|avx2|avx512 (default: the best)] [rows=16384]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <string_view>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/weight_lanes.h"
#include "core/ggml_type.h"
#include "core/half.h"
#include "core/thread_pool.h"

namespace kvtier::bench {
namespace {

double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Shape {
  GgmlType type;
  int64_t k, n;
  std::vector<int> f16_fields;  // byte offsets of f16 scales in a block (set to a finite value)
};

// Pseudo-random weights [n, k] of the shape's type with finite scales.
std::vector<uint8_t> make_weights(const Shape& s) {
  const size_t bytes = static_cast<size_t>(*ggml_row_bytes(s.type, static_cast<uint64_t>(s.k))) * s.n;
  std::vector<uint8_t> w(bytes);
  uint64_t st = 88172645463325252ull;
  for (uint8_t& b : w) {
    st ^= st << 13;
    st ^= st >> 7;
    st ^= st << 17;
    b = static_cast<uint8_t>(st);
  }
  if (s.type == GgmlType::kF16) {
    for (size_t i = 0; i < bytes / 2; ++i) {
      const uint16_t h = f32_to_f16(static_cast<float>(static_cast<int>(w[2 * i]) - 128) / 128.0f);
      std::memcpy(&w[2 * i], &h, 2);
    }
    return w;
  }
  const size_t block = ggml_traits(s.type).type_size;
  const uint16_t h = f32_to_f16(0.01f);
  for (size_t b = 0; b < bytes / block; ++b)
    for (int off : s.f16_fields) std::memcpy(&w[b * block + static_cast<size_t>(off)], &h, 2);
  return w;
}

double best_seconds(int iters, const std::function<void()>& call) {
  call();  // warm-up
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = cpu_seconds();
    for (int i = 0; i < iters; ++i) call();
    best = std::min(best, (cpu_seconds() - t0) / iters);
  }
  return best;
}

int run(int iters, cpu::Isa isa, int64_t matvec_rows) {
  const std::vector<Shape> shapes = {
      {GgmlType::kQ5_0, 640, 2048, {0}},    {GgmlType::kQ8_0, 640, 2048, {0}},
      {GgmlType::kQ4_K, 1024, 640, {0, 2}}, {GgmlType::kQ6_K, 2048, 640, {208}},
      {GgmlType::kQ4_1, 576, 1536, {0, 2}}, {GgmlType::kF16, 640, 2048, {}}};
  const int64_t tokens = 512;
  ThreadPool pool(1);
  std::printf("isa %s, 1 thread, best of 5 x %d calls\n", std::string(cpu::isa_name(isa)).c_str(), iters);
  for (const Shape& s : shapes) {
    const auto w = make_weights(s);
    std::vector<float> x(static_cast<size_t>(tokens * s.k));  // [tokens, k]
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = static_cast<float>(static_cast<int>(i * 2654435761u % 1000) - 500) / 250.0f;
    std::vector<float> y(static_cast<size_t>(tokens * s.n));  // [tokens, n]
    std::vector<uint8_t> scratch(cpu::matmul_scratch_bytes(s.type, s.k, tokens));
    const cpu::WeightMatrix m{s.type, w.data(), s.n, s.k};
    const double best =
        best_seconds(iters, [&] { cpu::matmul(pool, isa, m, x.data(), tokens, y.data(), scratch); });
    const double flops = 2.0 * static_cast<double>(tokens * s.k * s.n);
    std::printf("%-5s %lld x %lld -> %lld  %.1f GFLOP per CPU second\n", ggml_type_name(s.type).data(),
                static_cast<long long>(tokens), static_cast<long long>(s.k), static_cast<long long>(s.n),
                flops / best / 1e9);
    if (!cpu::has_lanes_layout(s.type) ||
        cpu::kernel_table(isa).lanes[static_cast<size_t>(s.type)] == nullptr)
      continue;
    const cpu::LanesWeights packed = cpu::pack_lanes(m);  // the same product where a copy exists
    cpu::WeightMatrix ml = m;
    ml.lanes = packed.data();
    const double best_lanes =
        best_seconds(iters, [&] { cpu::matmul(pool, isa, ml, x.data(), tokens, y.data(), scratch); });
    std::printf("%-5s %lld x %lld -> %lld  %.1f GFLOP per CPU second (with the rows-in-lanes copy)\n",
                ggml_type_name(s.type).data(), static_cast<long long>(tokens), static_cast<long long>(s.k),
                static_cast<long long>(s.n), flops / best_lanes / 1e9);
  }
  for (const Shape& s0 : shapes) {
    const Shape s{s0.type, 2048, matvec_rows, s0.f16_fields};
    const auto w = make_weights(s);
    std::vector<float> x(static_cast<size_t>(s.k));  // [1, k]
    for (size_t i = 0; i < x.size(); ++i)
      x[i] = static_cast<float>(static_cast<int>(i * 2654435761u % 1000) - 500) / 250.0f;
    std::vector<float> y(static_cast<size_t>(s.n));  // [1, n]
    std::vector<uint8_t> scratch(cpu::matmul_scratch_bytes(s.type, s.k, 1));
    cpu::WeightMatrix m{s.type, w.data(), s.n, s.k};
    const double best =
        best_seconds(iters * 4, [&] { cpu::matmul(pool, isa, m, x.data(), 1, y.data(), scratch); });
    std::printf("%-5s 1 x %lld -> %lld  %.1f GB of weights per CPU second\n", ggml_type_name(s.type).data(),
                static_cast<long long>(s.k), static_cast<long long>(s.n),
                static_cast<double>(w.size()) / best / 1e9);
    if (!cpu::has_lanes_layout(s.type) ||
        cpu::kernel_table(isa).lanes[static_cast<size_t>(s.type)] == nullptr)
      continue;
    const cpu::LanesWeights packed = cpu::pack_lanes(m);  // the same product from the rows-in-lanes copy
    m.lanes = packed.data();
    const double best_lanes =
        best_seconds(iters * 4, [&] { cpu::matmul(pool, isa, m, x.data(), 1, y.data(), scratch); });
    std::printf("%-5s 1 x %lld -> %lld  %.1f GB of weights per CPU second (rows in lanes)\n",
                ggml_type_name(s.type).data(), static_cast<long long>(s.k), static_cast<long long>(s.n),
                static_cast<double>(w.size()) / best_lanes / 1e9);
  }
  return 0;
}

}  // namespace
}  // namespace kvtier::bench

int main(int argc, char** argv) {
  using kvtier::cpu::Isa;
  Isa isa = kvtier::cpu::best_isa();
  if (argc > 2) {
    const std::string_view name = argv[2];
    bool known = false;
    for (Isa i : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
      if (kvtier::cpu::isa_name(i) == name) {
        isa = i;
        known = true;
      }
    }
    if (!known || !kvtier::cpu::isa_supported(isa)) {
      std::fprintf(stderr, "unknown or unsupported ISA '%s'\n", argv[2]);
      return 2;
    }
  }
  return kvtier::bench::run(argc > 1 ? std::max(1, std::atoi(argv[1])) : 10, isa,
                            argc > 3 ? std::max(16, std::atoi(argv[3])) : 16384);
}
