// Every ISA path against the scalar path and against exact (f64) arithmetic, on the real models'
// tensors (models/*.gguf; skipped when a file is missing). The random-data tests (test_vec_dot.cpp,
// test_float_ops.cpp) prove the error bounds; these show that no path loses precision on the data
// the engine actually runs: every weight tensor of both default models (rows from its start, middle
// and end), activations with the heavy-tailed per-channel scales of real hidden states, and the
// float ops with the models' own norm weights.
//
// Per matmul output the exact value is sum_i w_i a_i in f64 over the dequantised weights w_i and the
// dequantised activations a_i = d q_i (the very bytes every path reads: all ISAs quantise to the same
// bytes, test_vec_dot.cpp). Each path's error is scaled by S = sum_i (|w_i| + 2 |o_i|) |a_i| (o_i the
// block's offset term), the quantity the rounding-error bound of test_vec_dot.cpp is proportional to:
//   * every path stays within the bound (3 n_blocks + 16) u S of exact (u = 2^-24);
//   * every SIMD path's RMS scaled error is at most 1.5 x the scalar path's + 0.1 u (a path that lost
//     precision, e.g. a sum in f16 or a dropped term, is 10-1000 x worse);
//   * matmul (register-blocked tiles, threads) equals the same ISA's vec_dot bit for bit.
// The measured figures are printed (run the binary, build/cpu/tests/backend/test_isa_models) for
// docs/benchmarks.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/dequant.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/quantize_act.h"
#include "core/thread_pool.h"
#include "gguf/reader.h"
#include "random_weights.h"

namespace kvtier::cpu {
namespace {

constexpr double kU = 1.0 / (1 << 24);
constexpr int64_t kRowsPerSlice = 32;  // rows taken at the start, middle and end of each tensor
constexpr int64_t kTokens = 7;         // activation rows (full tiles and edges)

const std::vector<std::string>& model_files() {
  static const std::vector<std::string> files = {
      std::string(KVTIER_SOURCE_DIR) + "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
      std::string(KVTIER_SOURCE_DIR) + "/models/gemma-3-270m-q4_k_m.gguf"};
  return files;
}

std::vector<Isa> isas() {
  std::vector<Isa> out;
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512}) {
    if (isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

// Activation rows like the residual stream entering a matmul: N(0, 1) times a log-normal scale per
// channel (sigma 1: a few channels 10-30 x the median), and two outlier channels at 40 x.
std::vector<float> activations(int64_t k, int64_t n_tokens, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> scale(static_cast<size_t>(k));
  for (float& s : scale) s = std::exp(normal(rng));
  scale[static_cast<size_t>(k / 3)] = 40.0f;
  scale[static_cast<size_t>(k - 2)] = -40.0f;
  std::vector<float> x(static_cast<size_t>(k * n_tokens));
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t i = 0; i < k; ++i) x[t * k + i] = scale[i] * normal(rng);
  return x;
}

struct ErrStats {
  double sum_sq = 0.0;  // of the scaled errors |y - exact| / (u S)
  double max = 0.0;
  int64_t n = 0;
  void add(double e) {
    sum_sq += e * e;
    max = std::max(max, e);
    ++n;
  }
  double rms() const { return n ? std::sqrt(sum_sq / static_cast<double>(n)) : 0.0; }
};

bool is_matmul_weight(const gguf::TensorInfo& t) {
  return t.ne.size() == 2 && t.name.size() > 7 && t.name.ends_with(".weight") &&
         is_supported_weight_type(t.type);
}

TEST(IsaModels, MatmulEveryPathIsAsPreciseAsScalarOnRealWeights) {
  const auto paths = isas();
  if (paths.size() < 2) GTEST_SKIP() << "only the scalar path on this CPU";
  ThreadPool pool(2);
  int n_files = 0;
  for (const auto& file_name : model_files()) {
    if (!std::filesystem::exists(file_name)) continue;
    ++n_files;
    const gguf::File file(file_name);
    std::mt19937 rng(1234);
    // [type] -> [isa] error statistics over all tensors of that type
    std::map<GgmlType, std::map<Isa, ErrStats>> stats;
    for (const auto& t : file.tensors()) {
      if (!is_matmul_weight(t)) continue;
      const int64_t k = static_cast<int64_t>(t.ne[0]);
      const int64_t n_rows = static_cast<int64_t>(t.ne[1]);
      const size_t row_bytes = static_cast<size_t>(*ggml_row_bytes(t.type, static_cast<uint64_t>(k)));
      const ActFormat f = act_format_for(t.type);
      const auto x = activations(k, kTokens, rng);
      std::vector<uint8_t> act(act_row_bytes(f, k) * kTokens);
      std::vector<std::vector<double>> a(kTokens);
      for (int64_t tok = 0; tok < kTokens; ++tok) {
        uint8_t* row = act.data() + tok * act_row_bytes(f, k);
        quantize_act_row(f, x.data() + tok * k, k, row);
        a[tok] = test::act_values(f, row, std::vector<float>(x.begin() + tok * k, x.begin() + (tok + 1) * k));
      }
      const int64_t rows = std::min(kRowsPerSlice, n_rows);
      for (int64_t r0 : {int64_t{0}, (n_rows - rows) / 2, n_rows - rows}) {
        const uint8_t* w = t.data + static_cast<size_t>(r0) * row_bytes;
        const WeightMatrix wm{t.type, w, rows, k};
        std::map<Isa, std::vector<float>> y;
        for (Isa isa : paths) {
          std::vector<uint8_t> scratch(matmul_scratch_bytes(t.type, k, kTokens));
          y[isa].assign(static_cast<size_t>(rows * kTokens), 0.0f);
          matmul(pool, isa, wm, x.data(), kTokens, y[isa].data(), scratch);
        }
        std::vector<float> wd(static_cast<size_t>(k));
        for (int64_t r = 0; r < rows; ++r) {
          const uint8_t* wr = w + static_cast<size_t>(r) * row_bytes;
          dequantize_row(t.type, wr, wd.data(), k);
          const auto off = test::offset_terms(t.type, wr, k);
          for (int64_t tok = 0; tok < kTokens; ++tok) {
            double exact = 0.0, s = 0.0;
            for (int64_t i = 0; i < k; ++i) {
              exact += static_cast<double>(wd[i]) * a[tok][i];
              s += (std::fabs(wd[i]) + 2.0 * std::fabs(off[i])) * std::fabs(a[tok][i]);
            }
            if (s == 0.0) continue;
            const int64_t bs = ggml_traits(t.type).block_size;
            const double n_terms = bs == 1 ? static_cast<double>(k + k / 32 + 24) : 3.0 * (k / bs) + 16.0;
            for (Isa isa : paths) {
              const float got = y[isa][static_cast<size_t>(tok * rows + r)];
              const double e = std::fabs(got - exact) / (kU * s);
              stats[t.type][isa].add(e);
              ASSERT_LE(e, n_terms) << t.name << " row " << r0 + r << " token " << tok << " isa "
                                    << isa_name(isa) << ": " << got << " vs exact " << exact;
              // The tiles/threads of matmul give exactly the ISA's vec_dot.
              const float vd = vec_dot(isa, t.type, wr, act.data() + tok * act_row_bytes(f, k), k);
              ASSERT_EQ(got, vd) << t.name << " row " << r0 + r << " token " << tok << " " << isa_name(isa);
            }
          }
        }
      }
    }
    std::printf("%s\n  %-6s", std::filesystem::path(file_name).filename().c_str(), "type");
    for (Isa isa : paths) std::printf("  %8s rms/max [u S]", std::string(isa_name(isa)).c_str());
    std::printf("\n");
    for (const auto& [type, by_isa] : stats) {
      std::printf("  %-6s", std::string(ggml_type_name(type)).c_str());
      for (Isa isa : paths) std::printf("  %10.3f / %8.3f  ", by_isa.at(isa).rms(), by_isa.at(isa).max);
      std::printf(" (%lld outputs)\n", static_cast<long long>(by_isa.at(paths[0]).n));
      const double ref = by_isa.at(Isa::kScalar).rms();
      for (Isa isa : paths) {
        EXPECT_LE(by_isa.at(isa).rms(), 1.5 * ref + 0.1) << file_name << " " << ggml_type_name(type) << ": "
                                                         << isa_name(isa) << " is less precise than scalar";
      }
    }
  }
  if (n_files == 0) GTEST_SKIP() << "no model file in models/ (scripts/setup.sh)";
}

// The float ops on the models' own vectors: RMS norm with every norm weight of the models, and the
// activations (silu, gelu_tanh), softmax and RoPE on rows of realistic ranges, each ISA against f64.
// Errors in units of u = 2^-24 per element, relative to |y| (rms_norm, softmax) or |x| (silu, gelu).
TEST(IsaModels, FloatOpsEveryPathMatchesExactOnRealNormWeights) {
  const auto paths = isas();
  if (paths.size() < 2) GTEST_SKIP() << "only the scalar path on this CPU";
  int n_files = 0;
  for (const auto& file_name : model_files()) {
    if (!std::filesystem::exists(file_name)) continue;
    ++n_files;
    const gguf::File file(file_name);
    std::mt19937 rng(99);
    std::map<Isa, double> worst_norm;
    for (const auto& t : file.tensors()) {
      if (t.type != GgmlType::kF32 || t.ne.size() != 1 || t.name.find("norm") == std::string::npos) continue;
      const int64_t n = static_cast<int64_t>(t.ne[0]);
      std::vector<float> w(static_cast<size_t>(n));
      std::memcpy(w.data(), t.data, static_cast<size_t>(n) * 4);
      const auto x = activations(n, 1, rng);
      double ss = 0.0;
      for (float v : x) ss += static_cast<double>(v) * v;
      const double eps = 1e-6;
      const double scale = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
      for (Isa isa : paths) {
        std::vector<float> y(static_cast<size_t>(n));
        kernel_table(isa).fops.rms_norm(x.data(), w.data(), static_cast<float>(eps), n, y.data());
        double worst = 0.0;
        for (int64_t i = 0; i < n; ++i) {
          const double exact = x[i] * scale * w[i];
          worst = std::max(worst, std::fabs(y[i] - exact) / (std::fabs(exact) + 1e-30));
        }
        worst_norm[isa] = std::max(worst_norm[isa], worst / kU);
        EXPECT_LE(worst, (static_cast<double>(n) + 8.0) * kU) << t.name << " rms_norm " << isa_name(isa);
      }
    }
    // Activations and softmax on a row of typical pre-activation values (and a logits-sized row).
    const int64_t n = 4096;
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = normal(rng);
    std::map<Isa, std::map<std::string, double>> worst;
    for (Isa isa : paths) {
      const FloatKernels& fo = kernel_table(isa).fops;
      std::vector<float> y(static_cast<size_t>(n));
      fo.silu(x.data(), n, y.data());
      for (int64_t i = 0; i < n; ++i) {
        const double v = x[i], exact = v / (1.0 + std::exp(-v));
        // absolute error relative to |x| (silu(x) ~ 0 for x << 0: relative error there is meaningless)
        worst[isa]["silu"] =
            std::max(worst[isa]["silu"], std::fabs(y[i] - exact) / (std::fabs(v) * kU + 1e-30));
      }
      fo.gelu_tanh(x.data(), n, y.data());
      for (int64_t i = 0; i < n; ++i) {
        const double v = x[i];
        const double exact = 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
        worst[isa]["gelu"] =
            std::max(worst[isa]["gelu"], std::fabs(y[i] - exact) / (std::fabs(v) * kU + 1e-30));
      }
      fo.softmax(x.data(), n, y.data());
      double m = -INFINITY, s = 0.0;
      for (float v : x) m = std::max(m, static_cast<double>(v));
      for (float v : x) s += std::exp(v - m);
      for (int64_t i = 0; i < n; ++i) {
        const double exact = std::exp(x[i] - m) / s;
        worst[isa]["softmax"] = std::max(worst[isa]["softmax"], std::fabs(y[i] - exact) / (exact * kU));
      }
    }
    std::printf("%s: worst error in u (rms_norm, silu, gelu_tanh: per |x|; softmax: relative)\n",
                std::filesystem::path(file_name).filename().c_str());
    for (Isa isa : paths) {
      std::printf("  %-7s rms_norm %6.2f  silu %6.2f  gelu_tanh %6.2f  softmax %6.2f\n",
                  std::string(isa_name(isa)).c_str(), worst_norm[isa], worst[isa]["silu"], worst[isa]["gelu"],
                  worst[isa]["softmax"]);
      // A few ulp for the elementwise ops. rms_norm and softmax carry a sum over the row (error up to
      // (n - 1) u, typically ~sqrt(n) u): held to the scalar path's own figure (the SIMD sums are
      // shorter chains, so in fact more precise).
      EXPECT_LE(worst[isa]["silu"], 8.0) << isa_name(isa);
      EXPECT_LE(worst[isa]["gelu"], 8.0) << isa_name(isa);
      EXPECT_LE(worst[isa]["softmax"], 1.5 * worst[Isa::kScalar]["softmax"] + 8.0) << isa_name(isa);
      EXPECT_LE(worst_norm[isa], 1.5 * worst_norm[Isa::kScalar] + 8.0) << isa_name(isa);
    }
  }
  if (n_files == 0) GTEST_SKIP() << "no model file in models/ (scripts/setup.sh)";
}

}  // namespace
}  // namespace kvtier::cpu
