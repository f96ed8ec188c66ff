// Exactness of the offloaded placements on the GPU (design.md "exact means exact"): `layer` and
// `headinfer` (groups of all, 4, 2 and 1 KV heads where they divide, and adaptive with a staging
// budget that makes g shrink as the context grows) give bit-identical logits after every pass and
// identical greedy tokens to `resident` with the same chunk size; also with every copy randomly
// delayed (the debug option), which flushes out missing event waits. Decode runs past 256 keys so
// the split (multi-chunk) attention schedule is exercised; static heads (kept in the arena) mix with
// offloaded units. NOT YET RUN ON A GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>

#include "backend/cuda/spec.h"
#include "gpu_test_util.h"
#include "kv/cuda/kv_layout.h"
#include "kv/cuda/offload_device_kv.h"
#include "model_test_util.h"
#include "policy/infinigen_select.h"
#include "skew/skew_file.h"

namespace kvtier::cuda::test {
namespace {

struct Case {
  std::string name;
  policy::Placement placement;
  uint32_t group = 0;          // headinfer: 0 = adaptive
  uint64_t staging_bytes = 0;  // 0: the rest of the arena
  uint32_t delay_us = 0;
  uint32_t static_heads = 0;  // headinfer: first KV heads (layer-major) kept in the arena
};

runtime_cuda::CudaSessionOptions options(const Case& c, int64_t n_ctx, int64_t chunk) {
  runtime_cuda::CudaSessionOptions o;
  o.n_ctx = n_ctx;
  o.chunk = chunk;
  o.device_mem = uint64_t{3} << 30;
  o.kv.placement.placement = c.placement;
  o.kv.placement.group = c.group;
  o.kv.staging_bytes = c.staging_bytes;
  o.kv.debug_copy_delay_us = c.delay_us;
  o.kv.placement.static_heads = c.static_heads;
  o.kv.debug_seed = 1234;
  return o;
}

// Staging bytes for which the adaptive rule picks g = all heads only up to ~128 positions, then
// halves g each time the context doubles (kv_layout staging_rows: two buffers, rows rounded to 64).
uint64_t shrinking_staging(const model::ModelConfig& cfg) {
  const uint64_t hk = cfg.max_head_kv();
  return 2 * hk * 2 * 128 * uint64_t{cfg.head_dim_k} * 2;  // f16 rows
}

std::vector<Case> cases_for(const model::ModelConfig& cfg) {
  const uint32_t hk = cfg.max_head_kv();
  // With one KV head the group cannot shrink: adaptive then uses the whole arena.
  const uint64_t adaptive_staging = hk > 1 ? shrinking_staging(cfg) : 0;
  std::vector<Case> cs;
  cs.push_back({"layer", policy::Placement::kLayer});
  std::set<uint32_t> groups;
  for (uint32_t g : {hk, 4u, 2u, 1u}) {
    if (g <= hk && hk % g == 0) groups.insert(g);
  }
  for (auto it = groups.rbegin(); it != groups.rend(); ++it) {
    cs.push_back({"headinfer g=" + std::to_string(*it), policy::Placement::kHeadInfer, *it});
  }
  cs.push_back({"headinfer adaptive", policy::Placement::kHeadInfer, 0, adaptive_staging});
  cs.push_back({"headinfer g=1, copies delayed", policy::Placement::kHeadInfer, 1, 0, 300});
  cs.push_back(
      {"headinfer adaptive, copies delayed", policy::Placement::kHeadInfer, 0, adaptive_staging, 300});
  cs.push_back({"layer, copies delayed", policy::Placement::kLayer, 0, 0, 300});
  // Static heads: the whole first layer and part of the second stay in the arena.
  cs.push_back({"headinfer g=1, static heads, copies delayed", policy::Placement::kHeadInfer, 1, 0, 300,
                hk + (hk + 1) / 2});
  return cs;
}

void check_placements(const std::string& path, size_t prompt_tokens, int64_t chunk, int n_decode) {
  const auto model = runtime::load_model(path);
  const auto prompt = test_prompt(prompt_tokens, std::min<uint32_t>(model->config.n_vocab, 256));
  const int64_t n_ctx = static_cast<int64_t>(prompt_tokens) + n_decode + 64;
  SequenceResult ref;
  {
    runtime_cuda::CudaSession s(*model, options({"resident", policy::Placement::kResident}, n_ctx, chunk));
    ref = run_sequence(s, prompt, chunk, n_decode);
  }
  for (const Case& c : cases_for(model->config)) {
    runtime_cuda::CudaSession s(*model, options(c, n_ctx, chunk));
    const SequenceResult r = run_sequence(s, prompt, chunk, n_decode);
    EXPECT_EQ(r.tokens, ref.tokens) << c.name;
    ASSERT_EQ(r.logits.size(), ref.logits.size()) << c.name;
    for (size_t i = 0; i < r.logits.size(); ++i) {
      EXPECT_TRUE(same_bits(r.logits[i], ref.logits[i])) << c.name << ": logits of pass " << i << " differ";
    }
    const auto st = s.kv_stats();
    std::fprintf(
        stderr,
        "[%s] %s: %zu passes bit-identical to resident; %llu units, last g %u, H2D %llu B, D2H %llu B\n",
        path.c_str(), c.name.c_str(), r.logits.size(), static_cast<unsigned long long>(st.units),
        st.last_group, static_cast<unsigned long long>(st.bytes_h2d),
        static_cast<unsigned long long>(st.bytes_d2h));
  }
}

TEST(CudaPlacement, SyntheticGqa8LayerAndHeadInferAreExact) {
  KVTIER_REQUIRE_GPU();
  check_placements(synth_gqa8_file("llama"), 300, 96, 40);
}

TEST(CudaPlacement, SyntheticGqa8ChunkOfOneIsExact) {
  KVTIER_REQUIRE_GPU();
  check_placements(synth_gqa8_file("qwen2"), 20, 1, 8);
}

// Selection infinigen on `layer` (specs/infinigen.md A5): with alpha = +inf and a cap of every row, each
// speculated layer gathers all its rows in order from the host planes, so every pass's logits are those
// of `layer` bit for bit (also with random copy delays); at the default alpha and a 20 % cap the
// speculated layers load at most a fifth of their rows and the run goes on.
runtime_cuda::CudaSessionOptions infinigen_options(const skew::SkewSet& skew, float alpha, double budget,
                                                   uint32_t delay_us, int64_t n_ctx, int64_t chunk) {
  auto o = options({"infinigen", policy::Placement::kLayer, 0, 0, delay_us}, n_ctx, chunk);
  o.kv.selection = policy::Selection::kInfinigen;
  o.kv.skew = &skew;
  o.kv.infinigen.alpha = alpha;
  o.kv.infinigen.budget = budget;
  return o;
}

void check_infinigen(const std::string& path, size_t prompt_tokens, int64_t chunk, int n_decode) {
  const auto model = runtime::load_model(path);
  const auto& cfg = model->config;
  std::vector<uint32_t> hk;
  for (const auto& l : cfg.layers) hk.push_back(l.n_head_kv);
  const skew::SkewSet skew = skew::identity_skew(hk, cfg.head_dim_k, 0.3f);
  const auto prompt = test_prompt(prompt_tokens, std::min<uint32_t>(cfg.n_vocab, 256));
  const int64_t n_ctx = static_cast<int64_t>(prompt_tokens) + n_decode + 64;
  SequenceResult ref;
  {
    runtime_cuda::CudaSession s(*model, options({"layer", policy::Placement::kLayer}, n_ctx, chunk));
    ref = run_sequence(s, prompt, chunk, n_decode);
  }
  uint64_t speculating = 0;
  for (uint32_t l = 2; l < cfg.n_layer; ++l) speculating += cfg.layers[l].window == 0 ? 1 : 0;
  // Passes of one token after the first position speculate (decode steps, and prefill chunks of one).
  uint64_t one_token_passes = static_cast<uint64_t>(n_decode);
  if (chunk == 1) one_token_passes += prompt_tokens - 1;
  const uint64_t steps = speculating * one_token_passes;
  const std::pair<uint32_t, cuda::GatherKernel> variants[] = {{0u, cuda::GatherKernel::kPersistent},
                                                              {300u, cuda::GatherKernel::kPersistent},
                                                              {0u, cuda::GatherKernel::kFlat}};
  for (const auto& [delay, gather] : variants) {
    auto opts = infinigen_options(skew, INFINITY, 1.0, delay, n_ctx, chunk);
    opts.kv.gather = gather;
    runtime_cuda::CudaSession s(*model, opts);
    const SequenceResult r = run_sequence(s, prompt, chunk, n_decode);
    EXPECT_EQ(r.tokens, ref.tokens) << "delay " << delay;
    ASSERT_EQ(r.logits.size(), ref.logits.size());
    for (size_t i = 0; i < r.logits.size(); ++i)
      EXPECT_TRUE(same_bits(r.logits[i], ref.logits[i]))
          << "delay " << delay << ": logits of pass " << i << " differ";
    const auto st = s.kv_stats();
    EXPECT_EQ(st.spec_layer_steps, steps);
    EXPECT_EQ(st.spec_rows_fetched, st.spec_rows_total);
    EXPECT_GT(st.spec_rows_total, 0u);
    std::fprintf(stderr,
                 "[%s] infinigen alpha inf, budget 1, delay %u: %zu passes bit-identical to layer; %llu "
                 "speculations, %llu rows fetched of %llu\n",
                 path.c_str(), delay, r.logits.size(), static_cast<unsigned long long>(st.spec_layer_steps),
                 static_cast<unsigned long long>(st.spec_rows_fetched),
                 static_cast<unsigned long long>(st.spec_rows_total));
  }
  {
    runtime_cuda::CudaSession s(*model, infinigen_options(skew, 5.0f, 0.2, 0, n_ctx, chunk));
    const SequenceResult r = run_sequence(s, prompt, chunk, n_decode);
    const auto st = s.kv_stats();
    EXPECT_EQ(st.spec_layer_steps, steps);
    // At most the cap of each step: min(T, floor(0.2 T) or 1) rows per KV head of each speculated layer.
    uint64_t bound = 0;
    std::vector<int64_t> ts;
    if (chunk == 1)
      for (size_t t = 1; t < prompt_tokens; ++t) ts.push_back(static_cast<int64_t>(t));
    for (int i = 0; i < n_decode; ++i) ts.push_back(static_cast<int64_t>(prompt_tokens) + i);
    for (int64_t T : ts) {
      const int64_t cap = policy::speculation_cap(0.2, T);
      for (uint32_t l = 2; l < cfg.n_layer; ++l)
        if (cfg.layers[l].window == 0)
          bound += static_cast<uint64_t>(std::min(T, cap)) * cfg.layers[l].n_head_kv;
    }
    EXPECT_LE(st.spec_rows_fetched, bound) << "more than the 20 % cap was fetched";
    EXPECT_LT(st.spec_rows_fetched, st.spec_rows_total);
    EXPECT_GT(st.spec_rows_fetched, 0u);
    for (const auto& l : r.logits)
      EXPECT_TRUE(std::all_of(l.begin(), l.end(), [](float v) { return std::isfinite(v); }));
    size_t same = 0;
    while (same < r.tokens.size() && r.tokens[same] == ref.tokens[same]) ++same;
    std::fprintf(
        stderr,
        "[%s] infinigen alpha 5, budget 0.2 (identity skew): %.1f %% of the rows fetched, mean "
        "n_sel %.1f, speculation %.3f ms per decode step; greedy tokens equal to layer's for the first "
        "%zu of %zu\n",
        path.c_str(),
        100.0 * static_cast<double>(st.spec_rows_fetched) / static_cast<double>(st.spec_rows_total),
        static_cast<double>(st.spec_n_sel_sum) / static_cast<double>(st.spec_layer_steps),
        st.spec_ms / static_cast<double>(std::max<uint64_t>(one_token_passes - 1, 1)), same, r.tokens.size());
  }
}

// The prompt's own columns (a prompt of >= 64 tokens): with the identity skew B only picks columns, so
// after the first decode step every partial key of the prompt is, bit for bit, the stored f16 key at the
// chosen columns; the columns are distinct and ascending; truncating to 0 brings the offline ones back,
// and a prompt of fewer than 64 tokens keeps them.
TEST(CudaInfinigen, PromptColumnsRebuildThePartialKeysFromTheHostPlanes) {
  KVTIER_REQUIRE_GPU();
  const auto model = runtime::load_model(synth_gqa8_file("llama"));
  const auto& cfg = model->config;
  std::vector<uint32_t> hk;
  for (const auto& l : cfg.layers) hk.push_back(l.n_head_kv);
  const skew::SkewSet skew = skew::identity_skew(hk, cfg.head_dim_k, 0.3f);
  const int64_t d = cfg.head_dim_k;
  runtime_cuda::CudaSession s(*model, infinigen_options(skew, 5.0f, 0.2, 0, 512, 96));
  const auto* kv = dynamic_cast<const kv_cuda::OffloadDeviceKv*>(&s.kv_cache());
  ASSERT_NE(kv, nullptr);
  const kv_cuda::DeviceSpeculator* sp = kv->speculator();
  ASSERT_NE(sp, nullptr);
  const uint32_t layer = cfg.n_layer - 1;  // speculates (>= 2, no window)
  ASSERT_TRUE(sp->speculates(layer));
  const std::vector<int32_t> offline = sp->columns(layer, 0);
  for (size_t prompt_tokens : {size_t{200}, size_t{40}}) {
    s.truncate(0);
    EXPECT_EQ(sp->columns(layer, 0), offline) << "after truncate(0)";
    const auto prompt = test_prompt(prompt_tokens, std::min<uint32_t>(cfg.n_vocab, 256));
    const auto logits = s.prefill(prompt);
    s.decode(argmax(logits));  // the first one-token pass chooses the columns
    const auto T = static_cast<int64_t>(prompt_tokens);
    int differ_from_offline = 0;
    for (uint32_t g = 0; g < hk[layer]; ++g) {
      const std::vector<int32_t> cols = sp->columns(layer, g);
      ASSERT_EQ(static_cast<int64_t>(cols.size()), sp->k_cols());
      EXPECT_TRUE(std::is_sorted(cols.begin(), cols.end()) &&
                  std::adjacent_find(cols.begin(), cols.end()) == cols.end());
      differ_from_offline += cols != offline;
      if (prompt_tokens < 64) {
        EXPECT_EQ(cols, offline) << "a short prompt keeps the offline columns";
      }
      const auto rows = sp->download_rows(layer, g, T + 1);
      const uint16_t* keys = kv->host_keys(layer, g);
      const int64_t ld = cuda::spec_row_stride(sp->k_cols());
      int bad = 0;
      for (int64_t t = 0; t <= T; ++t) {
        for (int64_t c = 0; c < sp->k_cols(); ++c) bad += rows[t * ld + c] != keys[t * d + cols[c]];
      }
      EXPECT_EQ(bad, 0) << prompt_tokens << "-token prompt, KV head " << g
                        << ": partial keys that are not the stored keys at the chosen columns";
    }
    std::fprintf(stderr,
                 "[infinigen] %zu-token prompt: %d of %u KV heads of layer %u chose columns other than the "
                 "offline ones; every partial key equals the stored key at its columns\n",
                 prompt_tokens, differ_from_offline, hk[layer], layer);
  }
}

TEST(CudaInfinigen, SyntheticGqa8DegenerateIsExactAndDefaultLoadsAFifth) {
  KVTIER_REQUIRE_GPU();
  check_infinigen(synth_gqa8_file("llama"), 300, 96, 40);
}

TEST(CudaInfinigen, SyntheticQwen2ChunkOfOne) {
  KVTIER_REQUIRE_GPU();
  check_infinigen(synth_gqa8_file("qwen2"), 20, 1, 12);
}

TEST(CudaInfinigen, Gemma3SkipsItsSlidingLayers) {
  KVTIER_REQUIRE_GPU();
  const std::string path = model_path("gemma-3-270m-q4_k_m.gguf");
  KVTIER_REQUIRE_FILE(path);
  check_infinigen(path, 600, 128, 16);
}

TEST(CudaPlacement, SmolLM2LayerAndHeadInferAreExact) {
  KVTIER_REQUIRE_GPU();
  const std::string path = model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
  KVTIER_REQUIRE_FILE(path);
  check_placements(path, 300, 128, 64);
}

TEST(CudaPlacement, Gemma3LayerAndHeadInferAreExact) {
  KVTIER_REQUIRE_GPU();
  const std::string path = model_path("gemma-3-270m-q4_k_m.gguf");
  KVTIER_REQUIRE_FILE(path);
  // Past the 512-token sliding window of its local layers.
  check_placements(path, 600, 128, 32);
}

}  // namespace
}  // namespace kvtier::cuda::test
