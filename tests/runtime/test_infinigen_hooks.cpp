// The model-side pieces InfiniGen uses: kv::RecordingKv sees each pass's rows and queries without
// changing the pass's results, and Forward::project_q gives the very queries a pass attends with
// (the look-ahead feeds layer l-1's input through it, spec infinigen.md §6.2).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/temp_file.h"
#include "kv/recording_kv.h"
#include "kv/resident_kv.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "runtime/session.h"

namespace kvtier::runtime {
namespace {

class Store final : public kv::KvObserver {
 public:
  void on_write(uint32_t, const kv::LayerRows& rows, int64_t n) override {
    ASSERT_NE(rows.x, nullptr);
    x.emplace_back(rows.x, rows.x + n * n_embd);
  }
  void on_queries(uint32_t, const float* q, int64_t n, int64_t n_head) override {
    queries.emplace_back(q, q + n * n_head * head_dim);
  }
  int64_t n_embd = 0, head_dim = 0;
  std::vector<std::vector<float>> x, queries;  // [layer] of the last pass
};

TEST(InfinigenHooks, ProjectQGivesTheQueriesThePassAttendedWithAndRecordingChangesNothing) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kQ8_0}) {
    const test::TempFile file("kvtier_test_hooks_" + std::string(ggml_type_name(type)), ".gguf");
    model::SynthOptions so;
    so.type = type;
    so.seed = 11;
    so.n_ctx = 256;
    model::synth_writer(*model::find_preset("tiny-llama"), so).write(file.str());
    const auto model = load_model(file.str());
    const auto& cfg = model->config;
    std::vector<TokenId> tokens;
    for (int i = 0; i < 40; ++i) tokens.push_back(static_cast<TokenId>((i * 29 + 5) % 256));
    ThreadPool pool(2);
    auto logits_of = [&](bool record, Store* store) {
      kv::MemoryLedger ledger;
      model::Forward fwd(cfg, model->weights, 32, pool, cpu::best_isa(), ledger,
                         record ? kv::kNeedLayerInput : kv::kNeedNone);
      kv::ResidentKv inner(fwd.kv_geometry(32, cpu::KvDtype::kF16), 128, cfg.n_head, ledger, pool,
                           cpu::best_isa());
      std::vector<float> logits(cfg.n_vocab);
      if (!record) {
        fwd.run(std::span(tokens).first(32), 0, inner, model::LogitRows::kNone, nullptr);
        fwd.run(std::span(tokens).subspan(32, 8), 0, inner, model::LogitRows::kLast, logits.data());
        return logits;
      }
      kv::RecordingKv rec(inner, *store, kv::kNeedLayerInput);
      EXPECT_EQ(rec.needs(), kv::kNeedLayerInput);
      fwd.run(std::span(tokens).first(32), 0, rec, model::LogitRows::kNone, nullptr);
      store->x.clear();
      store->queries.clear();
      fwd.run(std::span(tokens).subspan(32, 8), 0, rec, model::LogitRows::kLast, logits.data());
      // The second pass's queries (positions 32..39) again from the recorded layer inputs.
      std::vector<int64_t> pos;
      for (int64_t t = 32; t < 40; ++t) pos.push_back(t);
      for (uint32_t l = 0; l < cfg.n_layer; ++l) {
        std::vector<float> q(store->queries[l].size());
        fwd.project_q(l, store->x[l].data(), pos, q.data());
        EXPECT_EQ(0, std::memcmp(q.data(), store->queries[l].data(), q.size() * sizeof(float)))
            << "layer " << l;
        // The look-ahead: layer l's projection of layer l-1's input is a different query.
        if (l > 0) {
          std::vector<float> ahead(q.size());
          fwd.project_q(l, store->x[l - 1].data(), pos, ahead.data());
          EXPECT_NE(ahead, q) << "layer " << l;
        }
      }
      return logits;
    };
    Store store;
    store.n_embd = cfg.n_embd;
    store.head_dim = cfg.head_dim_k;
    const auto plain = logits_of(false, nullptr);
    const auto recorded = logits_of(true, &store);
    EXPECT_EQ(plain, recorded) << ggml_type_name(type);
    ASSERT_EQ(store.x.size(), cfg.n_layer);
  }
}

}  // namespace
}  // namespace kvtier::runtime
