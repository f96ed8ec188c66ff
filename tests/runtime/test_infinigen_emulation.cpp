// Spec infinigen.md §14 A6: on a 512-token prompt and 64 generated tokens, InfiniGen's real decode path
// (layer placement, selection infinigen: one decode pass per token) and the teacher-forced emulation
// (kv::InfinigenEmulationKv over a resident cache: the prompt and the 64 tokens in one pass) choose the
// same n_sel per (layer, step) and the same rows per (layer, KV head, step) in >= 99 % of the cases.
// On a synthetic GQA llama (always) and on the default models (skipped, loudly, without their files).
// Then the same through runtime::Session (SessionOptions::infinigen_emulate_from, what `kvtier perplexity
// --infinigen-emulate-from` runs): the logits of every emulated position equal, bit for bit, those of a
// layer+infinigen session that prefills the prompt and then decodes the rest one teacher-forced token at
// a time, window after window (each window its own columns).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/temp_file.h"
#include "kv/infinigen_emulation.h"
#include "kv/resident_kv.h"
#include "kv/speculation_observer.h"
#include "kv/tiered_kv.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "runtime/model_files.h"
#include "runtime/session.h"
#include "runtime/skew_sample.h"
#include "skew/skew_math.h"

namespace kvtier::runtime {
namespace {

using model::TokenId;

struct Choice {
  int64_t n_past = 0, n_sel = 0, chosen = 0;
  std::vector<std::vector<int32_t>> rows;  // [KV head] ascending
};

// (layer, position) -> the speculation's choice.
class Recorder final : public kv::SpeculationObserver {
 public:
  void on_speculation(kv::SeqId, uint32_t layer, int64_t position, int64_t n_past,
                      const policy::SpecResult& r, int64_t b, int64_t n_head_kv) override {
    Choice c;
    c.n_past = n_past;
    c.n_sel = r.n_sel;
    c.chosen = r.chosen[static_cast<size_t>(b)];
    for (int64_t g = 0; g < n_head_kv; ++g) {
      const auto rows = r.rows(b, g, n_head_kv);
      c.rows.emplace_back(rows.begin(), rows.end());
    }
    EXPECT_TRUE(choices.emplace(std::make_pair(layer, position), std::move(c)).second)
        << "layer " << layer << " position " << position << " speculated twice";
  }
  std::map<std::pair<uint32_t, int64_t>, Choice> choices;
};

struct Agreement {
  int64_t steps = 0, n_sel_equal = 0;  // (layer, step)
  int64_t heads = 0, rows_equal = 0;   // (layer, KV head, step)
  int64_t dropped = 0;                 // (layer, step) where the decode path left rows out
};

Agreement compare(const Recorder& decode, const Recorder& emulated) {
  Agreement a;
  for (const auto& [key, d] : decode.choices) {
    ++a.steps;
    a.dropped += d.chosen < d.n_past;
    const auto it = emulated.choices.find(key);
    if (it == emulated.choices.end()) {
      a.heads += static_cast<int64_t>(d.rows.size());
      continue;
    }
    const Choice& e = it->second;
    EXPECT_EQ(e.n_past, d.n_past);
    a.n_sel_equal += e.n_sel == d.n_sel;
    for (size_t g = 0; g < d.rows.size(); ++g) {
      ++a.heads;
      a.rows_equal += g < e.rows.size() && e.rows[g] == d.rows[g];
    }
  }
  return a;
}

constexpr int64_t kPrompt = 512, kGen = 64, kChunk = 128;

struct A6Run {
  Recorder decode, emulated;
  std::vector<TokenId> fed;  // the decode passes' tokens (positions kPrompt ..)
};

int argmax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

// The decode path over `prompt` then kGen greedy tokens, and the emulation over the same tokens in one
// pass (emulate_from: where its decode steps begin; kPrompt is the decode path's own).
void run_a6(const LoadedModel& m, const skew::SkewSet& skew, std::span<const TokenId> prompt,
            int64_t emulate_from, A6Run& out) {
  ASSERT_EQ(static_cast<int64_t>(prompt.size()), kPrompt);
  const model::ModelConfig& cfg = m.config;
  ThreadPool pool(2);
  const cpu::Isa isa = cpu::best_isa();
  const int64_t capacity = kPrompt + kGen;
  std::vector<float> logits(cfg.n_vocab);
  {  // the decode path
    kv::MemoryLedger ledger;
    model::Forward probe(cfg, m.weights, kChunk, pool, isa, ledger, kv::kNeedLayerInput);
    kv::KvOptions o;
    o.placement.placement = policy::Placement::kLayer;
    o.selection = policy::Selection::kInfinigen;
    o.skew = std::make_shared<const skew::SkewSet>(skew);
    o.max_new_rows = kChunk;
    o.speculation_observer = &out.decode;
    kv::TieredKv kv(probe.kv_geometry(128, cpu::KvDtype::kF16), capacity, cfg.n_head, ledger, pool, isa, o);
    model::Forward fwd(cfg, m.weights, kChunk, pool, isa, ledger, kv.needs());
    kv.set_compute(&fwd);
    for (int64_t i = 0; i < kPrompt; i += kChunk) {
      const bool last = i + kChunk >= kPrompt;
      fwd.run(prompt.subspan(static_cast<size_t>(i), static_cast<size_t>(kChunk)), 0, kv,
              last ? model::LogitRows::kLast : model::LogitRows::kNone, last ? logits.data() : nullptr);
    }
    out.fed.clear();
    for (int64_t t = 0; t < kGen; ++t) {
      out.fed.push_back(static_cast<TokenId>(argmax(logits)));
      fwd.run(std::span(&out.fed.back(), 1), 0, kv, model::LogitRows::kLast, logits.data());
    }
    const kv::InfinigenStats st = kv.stats().infinigen;
    EXPECT_GT(st.layer_steps, 0u);
  }
  {  // the emulation: prompt and continuation in one pass
    kv::MemoryLedger ledger;
    model::Forward probe(cfg, m.weights, capacity, pool, isa, ledger, kv::kNeedLayerInput);
    kv::ResidentKv inner(probe.kv_geometry(128, cpu::KvDtype::kF16), capacity, cfg.n_head, ledger, pool, isa);
    kv::InfinigenEmulationOptions eo;
    eo.emulate_from = emulate_from;
    eo.n_head = cfg.n_head;
    eo.n_embd = cfg.n_embd;
    eo.isa = isa;
    eo.observer = &out.emulated;
    kv::InfinigenEmulationKv kv(inner, skew, eo, pool);
    model::Forward fwd(cfg, m.weights, capacity, pool, isa, ledger, kv.needs());
    kv.set_compute(&fwd);
    std::vector<TokenId> all(prompt.begin(), prompt.end());
    all.insert(all.end(), out.fed.begin(), out.fed.end());
    fwd.run(all, 0, kv, model::LogitRows::kNone, nullptr);
    EXPECT_GT(kv.stats().queries, 0u);
  }
}

void expect_a6(const A6Run& run, uint32_t speculating_layers) {
  const Agreement a = compare(run.decode, run.emulated);
  std::printf(
      "A6: %lld (layer, step) speculations, rows dropped in %lld; n_sel equal in %lld, row sets equal in "
      "%lld of %lld (layer, KV head, step)\n",
      static_cast<long long>(a.steps), static_cast<long long>(a.dropped),
      static_cast<long long>(a.n_sel_equal), static_cast<long long>(a.rows_equal),
      static_cast<long long>(a.heads));
  ASSERT_EQ(a.steps, int64_t{kGen} * speculating_layers);
  EXPECT_GT(a.dropped, a.steps / 2)
      << "the selection must leave rows out for the comparison to mean anything";
  EXPECT_GE(a.n_sel_equal * 100, a.steps * 99);
  EXPECT_GE(a.rows_equal * 100, a.heads * 99);
}

// A random skew set for the model's geometry (any orthogonal A serves the comparison).
skew::SkewSet random_skew(const model::ModelConfig& cfg, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  const int64_t d = cfg.head_dim_k;
  skew::SkewSet set;
  set.head_dim = static_cast<uint32_t>(d);
  set.partial_ratio = 0.3f;
  set.partial_columns = static_cast<uint32_t>(0.3 * static_cast<double>(d));
  for (const auto& layer : cfg.layers) {
    skew::LayerSkew L;
    L.n_head_kv = layer.n_head_kv;
    for (uint32_t g = 0; g < layer.n_head_kv; ++g) {
      std::vector<float> rows(static_cast<size_t>(8 * d * d));
      for (float& x : rows) x = nd(rng);
      const auto a = skew::skew_matrix(rows, 8 * d, d);
      L.a.insert(L.a.end(), a.a.begin(), a.a.end());
      L.sigma.insert(L.sigma.end(), a.sigma.begin(), a.sigma.end());
      for (uint32_t c = 0; c < set.partial_columns; ++c) L.cols.push_back(static_cast<int32_t>(c));
    }
    set.layers.push_back(std::move(L));
  }
  return set;
}

std::vector<TokenId> random_tokens(uint32_t vocab, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<TokenId> t;
  for (int64_t i = 0; i < n; ++i) t.push_back(static_cast<TokenId>(rng() % vocab));
  return t;
}

// A synthetic tiny-llama (GQA, q8_0 weights) of `layers` layers written to `file` and loaded.
std::unique_ptr<LoadedModel> synthetic_llama(const test::TempFile& file, uint32_t seed, uint32_t layers) {
  model::SynthOptions so;
  so.type = GgmlType::kQ8_0;
  so.seed = seed;
  so.n_layer = layers;
  so.n_ctx = 1024;
  model::synth_writer(*model::find_preset("tiny-llama"), so).write(file.str());
  return load_model(file.str());
}

TEST(InfinigenEmulation, A6SyntheticModelDecodeAndEmulationChooseTheSameRows) {
  const test::TempFile file("kvtier_test_a6", ".gguf");
  const auto m = synthetic_llama(file, 5, 6);
  const skew::SkewSet skew = random_skew(m->config, 9);
  const auto prompt = random_tokens(m->config.n_vocab, kPrompt, 3);
  A6Run run;
  run_a6(*m, skew, prompt, kPrompt, run);
  expect_a6(run, m->config.n_layer - 2);
  // The comparison notices a different choice: the offline columns (emulate_from 0: every query a decode
  // step, no prompt to choose columns from) pick other rows at many steps.
  A6Run offline;
  run_a6(*m, skew, prompt, 0, offline);
  const Agreement a = compare(run.decode, offline.emulated);
  EXPECT_LT(a.rows_equal * 100, a.heads * 99) << "the offline columns chose the prompt columns' rows";
}

// The default models with a skew set computed on the spot (128 tokens of sample text, the partial columns
// from it, as `kvtier skew --tokens 128`) and a 512-token prompt of licence text.
void real_model_a6(const std::string& name, uint32_t speculating_layers) {
  const auto path = std::filesystem::path(KVTIER_SOURCE_DIR) / "models" / name;
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "SKIPPED: " << path << " is absent (scripts/setup.sh fetches it)";
  const auto m = load_model(path.string());
  std::ifstream f("/usr/share/common-licenses/GPL-2");
  if (!f) GTEST_SKIP() << "SKIPPED: /usr/share/common-licenses/GPL-2 is absent";
  std::stringstream ss;
  ss << f.rdbuf();
  const std::vector<TokenId> ids = m->tokenizer->encode(ss.str());
  ASSERT_GE(static_cast<int64_t>(ids.size()), kPrompt + 128);
  SkewOptions so;
  so.threads = 2;
  const auto samples = collect_samples(*m, std::span(ids).subspan(kPrompt, 128), so);
  const skew::SkewSet skew = compute_skew(*m, samples, 0.3);
  A6Run run;
  run_a6(*m, skew, std::span(ids).first(kPrompt), kPrompt, run);
  expect_a6(run, speculating_layers);
}

TEST(InfinigenEmulation, A6SmolLM2) {
  real_model_a6("SmolLM2-135M-Instruct.Q4_1.gguf", 28);
}

TEST(InfinigenEmulation, A6Gemma3GlobalLayers) {
  real_model_a6("gemma-3-270m-q4_k_m.gguf", 3);
}

// A session over `m` with the selection infinigen: placement layer, or with emulate_from >= 0 the
// emulation from that position on.
SessionOptions infinigen_session(const skew::SkewSet& skew, int64_t n_ctx, int64_t emulate_from) {
  SessionOptions o;
  o.n_ctx = n_ctx;
  o.chunk = kChunk;
  o.threads = 2;
  o.kv_placement.placement.placement = policy::Placement::kLayer;
  o.kv_placement.selection = policy::Selection::kInfinigen;
  o.kv_placement.skew = std::make_shared<const skew::SkewSet>(skew);
  if (emulate_from >= 0) {
    o.infinigen_emulation = true;
    o.infinigen_emulate_from = emulate_from;
  }
  return o;
}

TEST(InfinigenEmulation, SessionEmulateFromGivesThePromptThenDecodeLogitsBitForBit) {
  const test::TempFile file("kvtier_test_emulate_from", ".gguf");
  const auto m = synthetic_llama(file, 11, 5);
  const skew::SkewSet skew = random_skew(m->config, 4);
  constexpr int64_t kWindow = 384, kFrom = 200;  // a prompt of 200 tokens chooses the columns
  Session decode(*m, infinigen_session(skew, kWindow, -1));
  Session emulated(*m, infinigen_session(skew, kWindow, kFrom));
  Session offline(*m, infinigen_session(skew, kWindow, 0));
  int64_t differs_from_offline = 0;
  for (uint32_t w = 0; w < 2; ++w) {  // two windows: the columns are chosen again after truncate(0)
    const auto tokens = random_tokens(m->config.n_vocab, kWindow, 20 + w);
    std::vector<std::vector<float>> want(kWindow);
    decode.truncate(0);
    const auto last = decode.prefill(std::span(tokens).first(kFrom));
    want[kFrom - 1].assign(last.begin(), last.end());
    for (int64_t p = kFrom; p < kWindow; ++p) {
      const auto l = decode.decode(tokens[static_cast<size_t>(p)]);
      want[static_cast<size_t>(p)].assign(l.begin(), l.end());
    }
    const kv::TieredStats st = *decode.kv_stats();
    ASSERT_LT(st.infinigen.rows_fetched, st.infinigen.rows_total) << "the selection must drop rows";
    emulated.truncate(0);
    int64_t compared = 0;
    emulated.evaluate(tokens, [&](int64_t pos, std::span<const float> l) {
      if (pos < kFrom - 1) return;
      ++compared;
      const auto& x = want[static_cast<size_t>(pos)];
      ASSERT_TRUE(l.size() == x.size() && std::equal(l.begin(), l.end(), x.begin()))
          << "window " << w << " position " << pos;
    });
    EXPECT_EQ(compared, kWindow - kFrom + 1);
    offline.truncate(0);
    offline.evaluate(tokens, [&](int64_t pos, std::span<const float> l) {
      if (pos >= kFrom && !std::equal(l.begin(), l.end(), want[static_cast<size_t>(pos)].begin()))
        ++differs_from_offline;
    });
  }
  const auto st = *emulated.emulation_stats();
  EXPECT_EQ(st.queries, uint64_t{2} * (kWindow - kFrom) * (m->config.n_layer - 2));
  EXPECT_LT(st.rows_chosen, st.rows_total);
  // The prompt's columns matter: the offline set (emulate_from 0) gives other logits at some positions.
  EXPECT_GT(differs_from_offline, 0);
}

}  // namespace
}  // namespace kvtier::runtime
