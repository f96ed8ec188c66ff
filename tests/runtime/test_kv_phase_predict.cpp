// `kvtier plan`'s predicted KV phase of a decode step (runtime/kv_phase_predict.h) for the KIVI
// representations on an offloaded placement: the bytes over the home link are the quantised pages of
// the quantised rows plus the f16 residual rows, and with kvpr the inputs of a recomputed prefix of
// whole key groups. The rates are injected (they stand in for a profile); the page sizes below are
// worked out by hand from KIVI's format (docs/policies.md "KIVI"), not taken from kvtier.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <utility>

#include "common/temp_file.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "runtime/kv_phase_predict.h"
#include "runtime/session.h"

namespace kvtier::runtime {
namespace {

// tiny-llama: 2 layers, 2 KV heads of 16 dims; tiny-mha: 2 layers, 4 KV heads of 16 dims. Loaded once
// per binary (the files live until the process exits).
const LoadedModel& synth_model(const std::string& preset) {
  static std::map<std::string,
                  std::pair<std::unique_ptr<::kvtier::test::TempFile>, std::unique_ptr<LoadedModel>>>
      models;
  auto& m = models[preset];
  if (!m.second) {
    m.first = std::make_unique<::kvtier::test::TempFile>("kvtier_test_kv_phase_predict_" + preset, ".gguf");
    model::SynthOptions o;
    o.type = GgmlType::kQ8_0;
    o.seed = 3;
    o.n_ctx = 4096;
    model::synth_writer(*model::find_preset(preset), o).write(m.first->str());
    m.second = load_model(m.first->str());
  }
  return *m.second;
}

constexpr int64_t kCtx = 4096;
constexpr uint32_t kLayers = 2;
constexpr int64_t kDim = 16;
// One head's f16 K and V rows of a token: 2 planes x 16 dims x 2 bytes.
constexpr uint64_t kF16HeadRow = 2 * kDim * 2;
// KIVI pages of one head and 256-token block at d = 16, key group 32 (value groups of the whole 16
// dims, as 32 does not divide it), scale and min in f16:
//   4 bits: K 256 x 16 / 2 = 2048 + 8 groups x 16 x 4 = 512, V 2048 + 256 x 1 x 4 = 1024 -> 5632 -> 8 KiB
//   2 bits: K 1024 + 512, V 1024 + 1024 -> 3584 -> 4 KiB (pages are 4 KiB-rounded for direct I/O)
constexpr uint64_t kQpage4 = 8192, kQpage2 = 4096;

// The stored input row of a token of layer 0 (the model's, as the engine stores it).
uint64_t x_row(const LoadedModel& m) {
  return kv_geometry(m, SessionOptions{}).act_row_bytes.at(0);
}

Profile profile(const LoadedModel& m, double link, double proj_tokens_per_s, uint32_t heads) {
  Profile p;
  p.host.bytes_per_s = link;
  p.proj_tokens_per_s = proj_tokens_per_s;
  p.proj_flops_per_token = 1;
  p.proj_flops_per_s = proj_tokens_per_s;
  p.kv_bytes_per_token = static_cast<double>(heads * kF16HeadRow);
  p.x_bytes_per_token = static_cast<double>(x_row(m));
  return p;
}

SessionOptions options(policy::Representation r, int64_t residual = 128) {
  SessionOptions o;
  o.n_ctx = kCtx;
  o.threads = 1;
  o.kv_placement.placement.placement = policy::Placement::kLayer;
  o.kv_placement.representation = r;
  o.kv_placement.knobs.kivi_residual = residual;
  return o;
}

TEST(KvPhasePredict, KiviMovesItsQuantisedPagesAndTheResidualRows) {
  const LoadedModel& model = synth_model("tiny-llama");
  const uint32_t heads = 2;
  const Profile prof = profile(model, 1e9, 1e6, heads);
  const auto f16 = predict_kv_phase(model, options(policy::Representation::kF16), prof);
  ASSERT_TRUE(f16);
  const uint64_t all = kLayers * heads * kCtx * kF16HeadRow;
  EXPECT_EQ(f16->step_bytes, static_cast<int64_t>(all));
  EXPECT_EQ(f16->offload_bytes, static_cast<int64_t>(all));
  EXPECT_DOUBLE_EQ(f16->step_s, static_cast<double>(all) / 1e9);
  // Residual 128, group 32: rows below 3968 are quantised (15.5 blocks: 16 pages, the last one whole),
  // rows 3968..4095 are f16.
  for (auto [r, page] :
       {std::pair{policy::Representation::kKivi4, kQpage4}, {policy::Representation::kKivi2, kQpage2}}) {
    const auto k = predict_kv_phase(model, options(r), prof);
    ASSERT_TRUE(k);
    EXPECT_EQ(k->quantised_end, 3968);
    EXPECT_EQ(k->split, -1);  // nothing recomputed without kvpr
    const uint64_t want = kLayers * heads * (16 * page + 128 * kF16HeadRow);
    EXPECT_EQ(k->step_bytes, static_cast<int64_t>(want));
    EXPECT_EQ(k->offload_bytes, f16->offload_bytes);
    // The link is all of it: the time scales with the bytes (4 bits: 0.53 of f16, 2 bits: 0.28).
    EXPECT_NEAR(k->step_s / f16->step_s, static_cast<double>(want) / static_cast<double>(all), 1e-12);
    EXPECT_DOUBLE_EQ(k->offload_s, f16->step_s);
  }
  // A residual window at least the context: nothing quantised, the f16 bytes.
  const auto none = predict_kv_phase(model, options(policy::Representation::kKivi4, kCtx), prof);
  ASSERT_TRUE(none);
  EXPECT_EQ(none->quantised_end, 0);
  EXPECT_EQ(none->step_bytes, f16->step_bytes);
}

TEST(KvPhasePredict, KiviKvprSplitsWholeKeyGroupsOfTheQuantisedRows) {
  // MHA: a quantised row of a layer's 4 heads is 4 x 8 KiB / 256 = 128 B on the link against a smaller
  // input row (68 B: q8_0 of the 64-wide input), so at a slow link and fast recompute the scheduler
  // recomputes part of the quantised rows.
  const LoadedModel& model = synth_model("tiny-mha");
  const uint32_t heads = 4;
  const Profile prof = profile(model, 1e5, 1e7, heads);
  const uint64_t x = x_row(model);
  ASSERT_LT(x, heads * kQpage4 / 256);
  const auto k = predict_kv_phase(model, options(policy::Representation::kKivi4Kvpr), prof);
  ASSERT_TRUE(k);
  EXPECT_EQ(k->quantised_end, 3968);
  EXPECT_GT(k->split, 0);
  EXPECT_EQ(k->split % 32, 0);
  EXPECT_LE(k->split, k->quantised_end);
  // The inputs of [0, l), the quantised pages from l on (the block l cuts: K rows from the cut and all
  // K parameters, then V rows from the cut and all V parameters; host home, no rounding), f16 rows.
  const int64_t l = k->split;
  const int64_t t0 = l % 256;
  const uint64_t cut = t0 == 0 || l >= 3968 ? 0 : (256 - t0) * kDim / 2 + 512 + (256 - t0) * kDim / 2 + 1024;
  const int64_t whole = l >= 3968 ? 0 : 16 - (l + 255) / 256;  // pages after the cut one, up to the 16th
  const uint64_t want = kLayers * (x * l + heads * (cut + whole * kQpage4 + 128 * kF16HeadRow));
  EXPECT_EQ(k->step_bytes, static_cast<int64_t>(want));
  // Never slower than loading every quantised page (l = 0).
  auto zero = options(policy::Representation::kKivi4Kvpr);
  zero.kv_placement.knobs.recompute = 0;
  const auto z = predict_kv_phase(model, zero, prof);
  ASSERT_TRUE(z);
  EXPECT_EQ(z->split, 0);
  EXPECT_EQ(z->step_bytes,
            predict_kv_phase(model, options(policy::Representation::kKivi4), prof)->step_bytes);
  EXPECT_LE(k->step_s, z->step_s);
  // A forced split is rounded down to whole groups (100 -> 96), and capped by the quantised rows.
  auto forced = options(policy::Representation::kKivi4Kvpr);
  forced.kv_placement.knobs.recompute = 100;
  EXPECT_EQ(predict_kv_phase(model, forced, prof)->split, 96);
  forced.kv_placement.knobs.recompute = 100000;
  EXPECT_EQ(predict_kv_phase(model, forced, prof)->split, 3968);
  // GQA (SmolLM2-like): a quantised row is smaller than the input row, so auto recomputes nothing.
  const LoadedModel& gqa = synth_model("tiny-llama");
  ASSERT_GT(x_row(gqa), 2 * kQpage4 / 256);
  const auto g =
      predict_kv_phase(gqa, options(policy::Representation::kKivi4Kvpr), profile(gqa, 1e5, 1e7, 2));
  ASSERT_TRUE(g);
  EXPECT_EQ(g->split, 0);
}

}  // namespace
}  // namespace kvtier::runtime
