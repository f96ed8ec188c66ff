// kvpr --recompute auto's first decode steps (issue 14, spec P6): before a decode visit has been
// timed, the scheduler's W (the step's other compute that hides a load) is the profiled decode weight
// pass shared among the step's visits (policy::kvpr_hidden_estimate), not 0. The rates are injected
// (they stand in for a profile), and step 1's split is planned during the prefill, before anything of
// a decode step is timed, so its split follows from the injected numbers alone.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "common/temp_file.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "runtime/session.h"

namespace kvtier::runtime {
namespace {

std::string mha_file() {  // tiny-mha: 2 layers, 4 KV heads of 16, 256 B of K,V per row and layer
  static const std::unique_ptr<::kvtier::test::TempFile> f = [] {
    auto t = std::make_unique<::kvtier::test::TempFile>("kvtier_test_kvpr_first_steps", ".gguf");
    model::SynthOptions o;
    o.type = GgmlType::kQ8_0;
    o.seed = 5;
    o.n_ctx = 256;
    model::synth_writer(*model::find_preset("tiny-mha"), o).write(t->str());
    return t;
  }();
  return f->str();
}

struct Decoded {
  std::vector<int64_t> splits;  // per pass: prefill, then each decode step
  std::vector<float> logits;    // every step's
};

Decoded decode(const LoadedModel& model, double decode_weights_s) {
  SessionOptions o;
  o.n_ctx = 256;
  o.chunk = 128;  // the prompt in one chunk: the prefill recomputes nothing (no rate is measured)
  o.threads = 1;
  o.kv_placement.placement.placement = policy::Placement::kLayer;
  o.kv_placement.representation = policy::Representation::kKvpr;
  o.kv_placement.knobs.recompute = policy::PolicyKnobs::kRecomputeAuto;
  // A slow link as the scheduler believes it (nothing is paced): 256 B per row at 100 kB/s is 2.56 ms,
  // 164 ms for the prompt's 64 rows, against 10 µs per recomputed row. With W = 0 the whole prefix
  // is recomputed.
  o.kv_placement.kvpr_link_bytes_per_s = 1e5;
  o.kv_placement.kvpr_tokens_per_s = 1e5;
  o.kv_placement.kvpr_decode_weights_s = decode_weights_s;
  Session s(model, o);
  std::vector<TokenId> prompt;
  for (int i = 0; i < 64; ++i) prompt.push_back(static_cast<TokenId>((i * 37 + 11) % 256));
  Decoded out;
  auto l = s.prefill(prompt);
  out.logits.assign(l.begin(), l.end());
  for (int g = 0; g < 5; ++g) {
    TokenId next = 0;
    for (size_t i = 1; i < l.size(); ++i)
      if (l[i] > l[next]) next = static_cast<TokenId>(i);
    l = s.decode(next);
    out.logits.insert(out.logits.end(), l.begin(), l.end());
  }
  const auto st = s.kv_stats();
  if (st) out.splits = st->pass_splits;
  return out;
}

TEST(KvprFirstSteps, TheDecodeWeightPassStandsInForTheUnmeasuredHiddenCompute) {
  const auto model = load_model(mha_file());
  // No estimate (W = 0 until measured): step 1 recomputes the whole prefix.
  const Decoded bare = decode(*model, 0);
  ASSERT_EQ(bare.splits.size(), 6u);
  EXPECT_EQ(bare.splits[1], 64);
  // A decode weight pass of 10 s (5 s per visit of the 2 layers) hides the 164 ms load: step 1
  // recomputes nothing.
  const Decoded seeded = decode(*model, 10.0);
  ASSERT_EQ(seeded.splits.size(), 6u);
  EXPECT_EQ(seeded.splits[1], 0);
  // Once visits are timed the measured W (far below 164 ms) replaces the estimate and the later
  // steps recompute again.
  int64_t later = 0;
  for (size_t i = 2; i < seeded.splits.size(); ++i) later += seeded.splits[i];
  EXPECT_GT(later, 0);
  // Splits never change results.
  EXPECT_EQ(bare.logits, seeded.logits);
}

}  // namespace
}  // namespace kvtier::runtime
