// HybridServe's mini-batched executor (docs/hybridserve.md "Mini-batches"): Session::step with the
// hybrid cache and streamed weights runs several sequences per pass, one weight load per layer for all
// of them, the cache visiting them in Algorithm 2's mini-batch order. Sequences of different lengths
// (so the order differs from the batch order) must each get the logits they get alone under resident.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "common/temp_file.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "model/weight_stream.h"
#include "runtime/greedy_alone.h"
#include "runtime/session.h"

namespace kvtier::runtime {
namespace {

// tiny-opt (MHA, learned positions, biases) with 8 layers, q8_0: its layers outweigh two staging slots.
std::string opt8_file() {
  static const std::unique_ptr<::kvtier::test::TempFile> f = [] {
    auto t = std::make_unique<::kvtier::test::TempFile>("kvtier_test_hybrid_opt8", ".gguf");
    model::SynthOptions o;
    o.type = GgmlType::kQ8_0;
    o.seed = 11;
    o.n_layer = 8;
    o.n_ctx = 512;
    model::synth_writer(*model::find_preset("tiny-opt"), o).write(t->str());
    return t;
  }();
  return f->str();
}

std::vector<TokenId> prompt_of(size_t len) {
  std::vector<TokenId> p;
  for (size_t i = 0; i < len; ++i) p.push_back(static_cast<TokenId>((i * (29 + len) + 3 * len) % 256));
  return p;
}

TEST(HybridBatch, MiniBatchedStepsWithStreamedWeightsMatchEachSequenceAloneUnderResident) {
  const auto model = load_model(opt8_file());
  const size_t V = model->config.n_vocab;
  constexpr int kGen = 6;
  // 3, 1 and 2 blocks of 128 rows: Algorithm 2's descending-size order is 0, 2, 1.
  const std::vector<std::vector<TokenId>> prompts = {prompt_of(300), prompt_of(40), prompt_of(170)};
  SessionOptions o;
  o.n_ctx = 512;
  o.kv_block_tokens = 128;
  o.chunk = 64;
  o.threads = 2;
  // Alone, resident: the logits each generated token is chosen from.
  std::vector<std::vector<float>> ref;
  for (const auto& p : prompts) ref.push_back(test::greedy_logits_alone(*model, o, p, kGen));
  // The smallest weight budget: the weights outside the layers and two slots (every layer streamed).
  model::WeightStreamOptions probe;
  probe.budget = 1;
  uint64_t slots = 0;
  try {
    (void)model::weight_footprint(*model->file, model->weights, probe);
  } catch (const Error& e) {
    const std::string m = e.what();
    const size_t at = m.find(" bytes are needed");
    ASSERT_NE(at, std::string::npos) << m;
    slots = std::stoull(m.substr(m.rfind(' ', at - 1) + 1));
  }
  ASSERT_GT(slots, 0u);
  // Forced ratios (mini-batches packed by capacity), and auto with given rates (Algorithm 1's ratio and
  // Algorithm 2's balanced mini-batches; the rates stand in for a profile, so nothing is measured).
  for (const double ratio : {1.0, 0.5, policy::PolicyKnobs::kActRatioAuto}) {
    SessionOptions ob = o;
    ob.kv_placement.placement.placement = policy::Placement::kLayer;
    ob.kv_placement.representation = policy::Representation::kHybrid;
    ob.kv_placement.knobs.act_ratio = ratio;
    const bool rated = ratio == policy::PolicyKnobs::kActRatioAuto;
    if (rated) {
      ob.kv_placement.kvpr_link_bytes_per_s = 2e7;
      ob.kv_placement.kvpr_tokens_per_s = 2e5;
    }
    ob.kv_placement.max_seqs = 3;
    ob.weights.budget = slots;
    Session s(*model, ob);
    ASSERT_EQ(s.weight_stats().resident_layers, 0u);
    ASSERT_EQ(s.weight_stats().streamed_layers, 8u);
    // Prefill each alone (different lengths), then decode all three in one pass per step.
    std::vector<TokenId> next;
    std::vector<std::vector<float>> got(prompts.size());
    for (size_t b = 0; b < prompts.size(); ++b) {
      const auto l = s.prefill(static_cast<kv::SeqId>(b), prompts[b]);
      got[b].insert(got[b].end(), l.begin(), l.end());
      next.push_back(test::greedy_argmax(l));
    }
    const uint64_t loads0 = s.weight_stats().layer_loads;
    for (int g = 1; g < kGen; ++g) {
      std::vector<model::SeqTokens> parts;
      for (size_t b = 0; b < prompts.size(); ++b)
        parts.push_back({static_cast<kv::SeqId>(b), {&next[b], 1}, model::LogitRows::kLast});
      const auto logits = s.step(parts);
      for (size_t b = 0; b < prompts.size(); ++b) {
        const auto l = logits.subspan(b * V, V);
        got[b].insert(got[b].end(), l.begin(), l.end());
        next[b] = test::greedy_argmax(l);
      }
    }
    // One weight pass per step for all three sequences (each streamed layer loaded once per pass).
    const uint64_t loads = s.weight_stats().layer_loads - loads0;
    EXPECT_GE(loads, (kGen - 2) * 8u) << ratio;
    EXPECT_LE(loads, kGen * 8u) << ratio;
    const auto st = s.kv_stats();
    ASSERT_TRUE(st.has_value());
    EXPECT_EQ(st->mb_passes, static_cast<uint64_t>(kGen - 1)) << ratio;
    EXPECT_EQ(st->mb_last_seqs, 3u);
    EXPECT_GE(st->mb_last, 1u);
    EXPECT_EQ(st->mb_reordered, st->mb_passes) << ratio << ": the mini-batch order should differ";
    EXPECT_EQ(st->mb_balanced, rated) << ratio;
    if (rated) {
      EXPECT_GT(st->act_ratio, 0.0) << "Algorithm 1 should choose some ACT blocks at these rates";
    }
    EXPECT_GT(st->recomputed_rows, 0u) << ratio;
    for (size_t b = 0; b < prompts.size(); ++b)
      EXPECT_TRUE(got[b] == ref[b]) << "R " << ratio << " seq " << b << ": logits differ from alone";
  }
}

}  // namespace
}  // namespace kvtier::runtime
