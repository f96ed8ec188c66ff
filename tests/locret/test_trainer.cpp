// The trainer on the match-head fixture (spec locret.md §7 A5 causality, A7, C1, C2), the capture
// decorator, checkpoints and resume.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>

#include "common/temp_file.h"
#include "core/content_hash.h"
#include "kv/locret_kv.h"
#include "kv/resident_kv.h"
#include "locret/capture_kv.h"
#include "locret/data_jsonl.h"
#include "locret/head_file.h"
#include "locret/head_scorer.h"
#include "locret/labels.h"
#include "locret/match_fixture.h"
#include "locret/train_loop.h"
#include "runtime/model_files.h"

namespace kvtier::locret {
namespace {

std::string fixture_path() {
  static const test::TempFile file("locret_match_model", ".gguf");
  static const bool written = [] {
    write_match_model(file.str());
    return true;
  }();
  (void)written;
  return file.str();
}

const runtime::LoadedModel& fixture() {
  static const auto model = runtime::load_model(fixture_path());
  return *model;
}

// Records every capture of a pass (copies of the rows).
struct Recorder : LayerObserver {
  struct Layer {
    std::vector<float> q, k, q_pre, k_pre, v;
    float scale = 0.0f;
  };
  std::vector<Layer> layers;
  void on_layer(const LayerCapture& c) override {
    const auto& cfg = fixture().config;
    const int64_t H = c.n_head, hk = cfg.layers[c.layer].n_head_kv, d = cfg.head_dim_k;
    Layer L;
    L.q.assign(c.q, c.q + c.n * H * d);
    L.q_pre.assign(c.q_pre, c.q_pre + c.n * H * d);
    L.k.assign(c.k, c.k + c.n * hk * d);
    L.k_pre.assign(c.k_pre, c.k_pre + c.n * hk * d);
    L.v.assign(c.v, c.v + c.n * hk * d);
    L.scale = c.attention.scale;
    ASSERT_EQ(c.layer, layers.size());
    layers.push_back(std::move(L));
  }
};

struct Backbone {
  ThreadPool pool{2};
  kv::MemoryLedger ledger;
  kv::ResidentKv kv;
  model::Forward fwd;
  explicit Backbone(int64_t n, uint32_t needs)
      : kv(model::kv_geometry(fixture().config, 256, cpu::KvDtype::kF16), n, fixture().config.n_head, ledger,
           pool, cpu::best_isa()),
        fwd(fixture().config, fixture().weights, n, pool, cpu::best_isa(), ledger, needs) {}
};

Recorder capture(const std::vector<int32_t>& tokens, std::vector<float>* logits = nullptr) {
  const auto n = static_cast<int64_t>(tokens.size());
  Backbone b(n, kv::kNeedPreRope);
  Recorder rec;
  CaptureKv cap(b.kv, rec);
  if (logits) logits->resize(static_cast<size_t>(n * fixture().config.n_vocab));
  b.fwd.run(tokens, 0, cap, logits ? model::LogitRows::kAll : model::LogitRows::kNone,
            logits ? logits->data() : nullptr);
  return rec;
}

TEST(LocretCapture, LeavesTheForwardPassUnchangedAndSeesEveryLayer) {
  const Sample s = match_samples(1, {64, 64, 8, 8}, 3)[0];
  std::vector<float> with, without;
  const Recorder rec = capture(s.tokens, &with);
  ASSERT_EQ(rec.layers.size(), fixture().config.n_layer);
  const auto n = static_cast<int64_t>(s.tokens.size());
  Backbone b(n, kv::kNeedNone);
  without.resize(with.size());
  b.fwd.run(s.tokens, 0, b.kv, model::LogitRows::kAll, without.data());
  EXPECT_EQ(with, without);
  // Pre-RoPE rows rotated to their positions are the post-RoPE rows the attention used.
  std::vector<float> rotated(static_cast<size_t>(fixture().config.n_head * 32));
  Backbone hook(n, kv::kNeedPreRope);
  for (int64_t t : {int64_t{0}, int64_t{17}, n - 1}) {
    hook.fwd.rope_q(2, rec.layers[2].q_pre.data() + t * 4 * 32, 1, t, rotated.data());
    for (int64_t i = 0; i < 4 * 32; ++i) EXPECT_EQ(rotated[i], rec.layers[2].q[t * 4 * 32 + i]);
  }
  EXPECT_FLOAT_EQ(rec.layers[0].scale, 1.0f / std::sqrt(32.0f));
}

TEST(LocretCapture, FeaturesOfAPrefixDoNotDependOnLaterTokens) {
  // A5 causality: the heads' input rows of the first T' tokens are the same with or without the
  // tokens after them (to the attention kernels' rounding: their tiling follows the pass length).
  const Sample s = match_samples(1, {300, 300, 8, 8}, 4)[0];
  const Recorder full = capture(s.tokens);
  const std::vector<int32_t> prefix(s.tokens.begin(), s.tokens.begin() + 100);
  const Recorder part = capture(prefix);
  for (size_t l = 0; l < full.layers.size(); ++l) {
    for (size_t i = 0; i < part.layers[l].k_pre.size(); ++i)
      ASSERT_NEAR(part.layers[l].k_pre[i], full.layers[l].k_pre[i], 1e-4f) << l;
    for (size_t i = 0; i < part.layers[l].v.size(); ++i)
      ASSERT_NEAR(part.layers[l].v[i], full.layers[l].v[i], 1e-4f);
  }
  // Layer 0 sees only the token itself: identical bits.
  EXPECT_TRUE(
      std::equal(part.layers[0].q_pre.begin(), part.layers[0].q_pre.end(), full.layers[0].q_pre.begin()));
}

TEST(LocretFixture, MatchHeadLabelsPointAtTheNeedle) {
  // C1: in every layer's match head (KV head 0) the needle's positions carry the largest labels.
  const auto& cfg = fixture().config;
  for (const Sample& s : match_samples(3, {400, 600, 8, 16}, 5)) {
    const Recorder rec = capture(s.tokens);
    const int64_t nq = s.n_prompt, na = static_cast<int64_t>(s.tokens.size()) - nq;
    for (uint32_t l = 0; l < cfg.n_layer; ++l) {
      std::vector<float> Y(static_cast<size_t>(2 * nq));
      cis_labels({rec.layers[l].q.data() + nq * 4 * 32, rec.layers[l].k.data(), na, nq, 4, 2, 32,
                  rec.layers[l].scale, 0.0f},
                 Y.data());
      std::vector<int64_t> order(static_cast<size_t>(nq));
      std::iota(order.begin(), order.end(), int64_t{0});
      std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return Y[a] > Y[b]; });
      // The needle's tokens are nearly all among the top 10% of the labels; other tokens rarely.
      const auto k10 = nq / 10;
      int64_t needle_in_top = 0;
      for (int64_t r = 0; r < k10; ++r)
        needle_in_top += s.tokens[static_cast<size_t>(order[static_cast<size_t>(r)])] >= kMatchNeedleFirst;
      const double needle_rate = static_cast<double>(needle_in_top) / static_cast<double>(na);
      const double other_rate = static_cast<double>(k10 - needle_in_top) / static_cast<double>(nq - na);
      EXPECT_GE(needle_rate, 0.75) << "layer " << l;
      EXPECT_LE(other_rate, 0.1) << "layer " << l;
    }
  }
}

TrainerOptions fixture_options(int64_t steps, int64_t max_tokens) {
  TrainerOptions o;
  o.max_tokens = max_tokens;
  o.schedule = {5e-4, steps * 2 / 3, steps};
  return o;
}

// C2 at CTest scale: alpha 0.0025, lr 5e-4 with warmup 2/3 of the steps, batch 1, d_m 64 (C5's other
// sizes, 32 and 256, at the spec's full scale: docs/locret.md; at this scale d_m 32 misses the 50 %
// loss drop by a hair, 49.5 %, and d_m 256 takes 27 s).
class LocretTrainerDm : public ::testing::TestWithParam<int64_t> {};

// Spec §7 C3 on the fixture: the prompt prefilled through `kv` in its planned chunks of 64, then the
// answer teacher-forced through the decode path; the logits of every answer token ([n_answer, V]).
std::vector<float> answer_logits(kv::KvCache& cache, model::Forward& fwd, const Sample& s) {
  const int64_t V = fixture().config.n_vocab;
  const std::span<const int32_t> all(s.tokens);
  std::vector<float> buf(static_cast<size_t>(V)), out;
  cache.set_compute(&fwd);
  int64_t i = 0;
  for (int64_t m : cache.plan_prefill(0, s.n_prompt, 64)) {
    fwd.run(all.subspan(static_cast<size_t>(i), static_cast<size_t>(m)), 0, cache,
            i + m == s.n_prompt ? model::LogitRows::kLast : model::LogitRows::kNone, buf.data());
    i += m;
  }
  out.insert(out.end(), buf.begin(), buf.end());
  for (int64_t t = s.n_prompt; t + 1 < static_cast<int64_t>(s.tokens.size()); ++t) {
    fwd.run(all.subspan(static_cast<size_t>(t), 1), 0, cache, model::LogitRows::kLast, buf.data());
    out.insert(out.end(), buf.begin(), buf.end());
  }
  return out;
}

// Recency-only eviction (4 sinks + the most recent): the C3 baseline.
struct RecencyScorer final : kv::UnitScorer {
  void score(ThreadPool&, cpu::Isa, uint32_t layer, int64_t pos0, const float*, const float*, const float*,
             int64_t n, float* scores) override {
    const int64_t hk = fixture().config.layers[layer].n_head_kv;
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t h = 0; h < hk; ++h)
        scores[t * hk + h] = pos0 + t < 4 ? 1e9f : static_cast<float>(pos0 + t);
    }
  }
};

// Mean relative L2 error of the answer logits under locret (budget T/8, B 64, n_s b/4 unless given,
// n_loc 16) with this scorer, against full attention.
double locret_logit_error(const std::vector<Sample>& samples, const std::shared_ptr<kv::UnitScorer>& scorer,
                          int64_t stabilizers = -1) {
  double sum = 0.0;
  int64_t count = 0;
  const auto& cfg = fixture().config;
  for (const Sample& s : samples) {
    const auto n = static_cast<int64_t>(s.tokens.size());
    ThreadPool pool(2);
    kv::MemoryLedger ledger;
    model::Forward fwd(cfg, fixture().weights, 64, pool, cpu::best_isa(), ledger, kv::kNeedPreRope);
    const kv::KvGeometry geo = model::kv_geometry(cfg, 256, cpu::KvDtype::kF16);
    kv::ResidentKv full(geo, n, cfg.n_head, ledger, pool, cpu::best_isa());
    kv::KvOptions o;
    o.retention = policy::Retention::kLocret;
    o.knobs.budget = s.n_prompt / 8;
    o.knobs.stabilizers = stabilizers >= 0 ? stabilizers : o.knobs.budget / 4;
    o.knobs.local_tail = 16;
    o.max_new_rows = 64;
    o.scorer = scorer;
    kv::LocretKv evicting(geo, n, cfg.n_head, ledger, pool, cpu::best_isa(), o);
    const std::vector<float> ref = answer_logits(full, fwd, s), got = answer_logits(evicting, fwd, s);
    EXPECT_GT(evicting.evictions(), 0u);
    const size_t V = cfg.n_vocab;
    for (size_t r = 0; r < ref.size() / V; ++r) {
      double d = 0.0, z = 0.0;
      for (size_t j = r * V; j < (r + 1) * V; ++j)
        d += (got[j] - ref[j]) * double{got[j] - ref[j]}, z += ref[j] * double{ref[j]};
      sum += std::sqrt(d / z);
      ++count;
    }
  }
  return sum / static_cast<double>(count);
}

// The answer logits of one sample under locret (as locret_logit_error's), on a pool of `threads`.
std::vector<float> locret_answer_logits(const Sample& s, const std::shared_ptr<kv::UnitScorer>& scorer,
                                        int threads) {
  const auto& cfg = fixture().config;
  ThreadPool pool(threads);
  kv::MemoryLedger ledger;
  model::Forward fwd(cfg, fixture().weights, 64, pool, cpu::best_isa(), ledger, kv::kNeedPreRope);
  const kv::KvGeometry geo = model::kv_geometry(cfg, 256, cpu::KvDtype::kF16);
  kv::KvOptions o;
  o.retention = policy::Retention::kLocret;
  o.knobs.budget = s.n_prompt / 8;
  o.knobs.local_tail = 16;
  o.max_new_rows = 64;
  o.scorer = scorer;
  kv::LocretKv evicting(geo, static_cast<int64_t>(s.tokens.size()), cfg.n_head, ledger, pool, cpu::best_isa(),
                        o);
  std::vector<float> out = answer_logits(evicting, fwd, s);
  EXPECT_GT(evicting.evictions(), 0u);
  return out;
}

// B8: bit-identical results across runs and thread counts (the scores, the eviction's ties and the
// re-rotated keys do not depend on how the work is split).
TEST(LocretDeterminism, SameBitsAcrossRunsAndThreadCounts) {
  const auto samples = match_samples(2, MatchSampleOptions{256, 384, 8, 16}, 31);
  const auto scorer =
      std::make_shared<HeadScorer>(RetainingHeads::random(head_shapes(fixture().config, 32), 5));
  for (const Sample& s : samples) {
    const std::vector<float> one = locret_answer_logits(s, scorer, 1);
    EXPECT_EQ(locret_answer_logits(s, scorer, 1), one) << "two runs on one thread";
    EXPECT_EQ(locret_answer_logits(s, scorer, 2), one) << "two threads";
    EXPECT_EQ(locret_answer_logits(s, scorer, 3), one) << "three threads";
  }
}

TEST_P(LocretTrainerDm, TrainedHeadsFindTheNeedle) {
  const MatchSampleOptions so{256, 512, 8, 16};
  const auto train = match_samples(200, so, 10);
  const auto held = match_samples(20, so, 11);
  const int64_t steps = 200;
  const auto& m = fixture();
  RetainingHeads heads = RetainingHeads::random(head_shapes(m.config, GetParam()), 0);
  OptimizerState state = OptimizerState::zeros(heads.shapes());
  ThreadPool pool(2);
  LocretTrainer trainer(m.config, m.weights, pool, cpu::best_isa(), heads, state,
                        fixture_options(steps, 512 + 16));
  TrainLoopOptions lo;
  lo.steps = steps;
  const TrainResult r = train_loop(trainer, heads, state, train, held, lo, {}, {});
  ASSERT_TRUE(r.first_eval && r.last_eval);
  std::printf("d_m %lld held-out: reg %.4f -> %.4f, acc %.3f -> %.3f\n", static_cast<long long>(GetParam()),
              r.first_eval->reg, r.last_eval->reg, r.first_eval->acc, r.last_eval->acc);
  EXPECT_TRUE(r.last_eval->finite);
  EXPECT_LE(r.last_eval->reg, 0.5 * r.first_eval->reg);
  EXPECT_GE(r.last_eval->acc, 0.30);
  EXPECT_GT(r.last_eval->acc, r.first_eval->acc);
  EXPECT_EQ(state.step, steps);
  // C3: evicting to T/8 by the trained heads disturbs the answer's logits less than random heads (the
  // paper's Table 7) and less than recency-only eviction (4 sinks + recent).
  const double trained = locret_logit_error(held, std::make_shared<HeadScorer>(heads));
  const double random = locret_logit_error(
      held, std::make_shared<HeadScorer>(RetainingHeads::random(head_shapes(m.config, GetParam()), 0)));
  const double recency = locret_logit_error(held, std::make_shared<RecencyScorer>());
  std::printf("C3 answer-logit error at b = T/8: trained %.4f, random %.4f, recency %.4f\n", trained, random,
              recency);
  EXPECT_LT(trained, random);
  EXPECT_LT(trained, recency);
  // C4 (the paper's Fig. 3 ablation): without stabilizers the same trained heads evict worse.
  const double no_stabilizers = locret_logit_error(held, std::make_shared<HeadScorer>(heads), 0);
  std::printf("C4 answer-logit error: n_s = b/4 %.4f, n_s = 0 %.4f\n", trained, no_stabilizers);
  EXPECT_GT(no_stabilizers, trained);
}

INSTANTIATE_TEST_SUITE_P(C2, LocretTrainerDm, ::testing::Values(int64_t{64}));

// --labels centered moves each (layer, KV head)'s target by its mean over the prompt: the ranking the
// overlap measures (and eviction uses) is the same, the label diagnostics (taken before centering) are
// the same, and the regression loss of near-zero predictions shrinks to the labels' spread.
TEST(LocretTrainer, CenteredLabelsShiftTheTargetNotTheRanking) {
  const auto& m = fixture();
  const auto samples = match_samples(2, MatchSampleOptions{256, 384, 8, 16}, 41);
  SampleStats st[2];
  for (int c = 0; c < 2; ++c) {
    RetainingHeads heads = RetainingHeads::random(head_shapes(m.config, 16), 3);
    OptimizerState state = OptimizerState::zeros(heads.shapes());
    ThreadPool pool(1);
    TrainerOptions o = fixture_options(10, 384 + 16);
    o.labels = c == 0 ? LabelTarget::kRaw : LabelTarget::kCentered;
    LocretTrainer trainer(m.config, m.weights, pool, cpu::best_isa(), heads, state, o);
    st[c] = trainer.run(samples[0], false);
  }
  EXPECT_EQ(st[0].overlap.hits, st[1].overlap.hits);
  EXPECT_EQ(st[0].overlap.total, st[1].overlap.total);
  EXPECT_EQ(st[0].recency.hits, st[1].recency.hits);
  EXPECT_EQ(st[0].label_mean, st[1].label_mean);
  EXPECT_EQ(st[0].label_std, st[1].label_std);
  const double mean = st[0].label_mean / static_cast<double>(st[0].label_cells);
  ASSERT_GT(std::fabs(mean), 1.0);  // the fixture's logits have an offset for centering to remove
  EXPECT_LT(st[1].reg, st[0].reg);
}

}  // namespace
}  // namespace kvtier::locret

namespace kvtier::locret {
namespace {

TEST(LocretTrainer, ResumedRunEqualsAnUninterruptedOne) {
  const MatchSampleOptions so{64, 128, 8, 12};
  const auto train = match_samples(8, so, 20);
  const int64_t steps = 12;
  const auto& m = fixture();
  const HeadFileMeta meta{file_xxh3_tag(fixture_path()), "fixture", {}};
  ThreadPool pool(2);
  auto fresh = [&] { return RetainingHeads::random(head_shapes(m.config, 16), 7); };

  RetainingHeads straight = fresh();
  OptimizerState s1 = OptimizerState::zeros(straight.shapes());
  {
    LocretTrainer t(m.config, m.weights, pool, cpu::best_isa(), straight, s1, fixture_options(steps, 140));
    TrainLoopOptions lo;
    lo.steps = steps;
    lo.seed = 3;
    train_loop(t, straight, s1, train, {}, lo, meta, {});
  }

  const test::TempFile ckpt("locret_ckpt", ".gguf");
  {
    RetainingHeads h = fresh();
    OptimizerState s = OptimizerState::zeros(h.shapes());
    LocretTrainer t(m.config, m.weights, pool, cpu::best_isa(), h, s, fixture_options(steps, 140));
    TrainLoopOptions lo;
    lo.steps = steps;
    lo.seed = 3;
    lo.checkpoint_every = 4;
    lo.checkpoint_path = ckpt.str();
    int64_t calls = 0;
    lo.stop = [&] { return ++calls > 7; };  // stops after 7 steps (not a checkpoint step)
    const TrainResult r = train_loop(t, h, s, train, {}, lo, meta, {});
    EXPECT_TRUE(r.stopped);
    EXPECT_EQ(s.step, 7);
  }
  HeadFile hf = load_heads(ckpt.str(), meta.model_hash, m.config);
  ASSERT_TRUE(hf.optimizer.has_value());
  EXPECT_EQ(hf.optimizer->step, 7);
  {
    LocretTrainer t(m.config, m.weights, pool, cpu::best_isa(), hf.heads, *hf.optimizer,
                    fixture_options(steps, 140));
    TrainLoopOptions lo;
    lo.steps = steps;
    lo.seed = 3;
    train_loop(t, hf.heads, *hf.optimizer, train, {}, lo, meta, {});
  }
  EXPECT_EQ(hf.optimizer->step, steps);
  for (uint32_t l = 0; l < straight.n_layer(); ++l) {
    EXPECT_EQ(hf.heads.layer(l).fc1, straight.layer(l).fc1) << l;
    EXPECT_EQ(hf.heads.layer(l).fc2, straight.layer(l).fc2) << l;
  }
  // A different seed sees other samples: different weights (the comparison above can fail).
  RetainingHeads other = fresh();
  OptimizerState s3 = OptimizerState::zeros(other.shapes());
  LocretTrainer t(m.config, m.weights, pool, cpu::best_isa(), other, s3, fixture_options(steps, 140));
  TrainLoopOptions lo;
  lo.steps = steps;
  lo.seed = 4;
  train_loop(t, other, s3, train, {}, lo, meta, {});
  EXPECT_NE(other.layer(0).fc1, straight.layer(0).fc1);
}

TEST(LocretTrainLoop, SampleOrderIsASeededShufflePerEpoch) {
  std::vector<int64_t> seen;
  for (int64_t s = 0; s < 10; ++s) seen.push_back(sample_for_step(10, 5, s));
  std::vector<int64_t> sorted = seen;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 10; ++i)
    EXPECT_EQ(sorted[static_cast<size_t>(i)], i);  // each sample once per epoch
  std::vector<int64_t> next;
  for (int64_t s = 10; s < 20; ++s) next.push_back(sample_for_step(10, 5, s));
  EXPECT_NE(next, seen);  // a new order each epoch
  EXPECT_EQ(sample_for_step(10, 5, 13), next[3]);
}

}  // namespace
}  // namespace kvtier::locret

namespace kvtier::locret {
namespace {

TEST(LocretJsonl, ReadsSamplesSkipsLongOnesAndNamesBadLines) {
  const test::TempFile f("locret_data", ".jsonl");
  std::ofstream(f.path()) << "{\"prompt\": \"abc\", \"answer\": \"xy\", \"source\": \"t\"}\n\n"
                          << "{\"prompt\": \"" << std::string(300, 'q') << "\", \"answer\": \"z\"}\n";
  const auto& tok = *fixture().tokenizer;
  JsonlStats st;
  const auto s = read_jsonl_samples(f.str(), tok, std::nullopt, 100, &st);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(st.lines, 3);
  EXPECT_EQ(st.too_long, 1);
  // Raw: the prompt's tokens (with the model's BOS), then " " + answer.
  const auto p = tok.encode("abc");
  const auto a = tok.encode(" xy", {.add_special = false});
  EXPECT_EQ(s[0].n_prompt, static_cast<int64_t>(p.size()));
  std::vector<int32_t> want = p;
  want.insert(want.end(), a.begin(), a.end());
  EXPECT_EQ(s[0].tokens, want);
  for (const char* bad : {"[1, 2]", "{\"prompt\": \"p\"}", "{\"prompt\": \"p\", \"answer\": 3}",
                          "{\"prompt\": \"p\", \"answer\": \"\"}", "not json"}) {
    std::ofstream(f.path(), std::ios::trunc) << "{\"prompt\": \"p\", \"answer\": \"a\"}\n" << bad << "\n";
    try {
      read_jsonl_samples(f.str(), tok, std::nullopt, 100);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidFile);
      EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kvtier::locret
