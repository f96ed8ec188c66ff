// The forward pass on a tiny synthetic llama (f32 and q8_0 weights): logits do not depend on the
// prefill chunk size, the thread count, the KV head grouping, or prefill vs decode (bit-identical:
// the attention tiles follow absolute positions and the matmul rows are batch-independent).
#include <gtest/gtest.h>

#include <unistd.h>
#include <map>
#include <memory>

#include <filesystem>
#include <vector>

#include "common/temp_file.h"
#include "kv/resident_kv.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "runtime/session.h"

namespace kvtier::runtime {
namespace {

// The tiny-llama synthetic model of `type`, written once per process (CTest runs this binary's
// tests as parallel processes) and removed at exit.
std::string synth_file(GgmlType type) {
  static std::map<GgmlType, std::unique_ptr<::kvtier::test::TempFile>> files;
  auto& f = files[type];
  if (!f) {
    f = std::make_unique<::kvtier::test::TempFile>(
        "kvtier_test_tiny_llama_" + std::string(ggml_type_name(type)), ".gguf");
    model::SynthOptions o;
    o.type = type;
    o.seed = 7;
    o.n_ctx = 512;
    model::synth_writer(*model::find_preset("tiny-llama"), o).write(f->str());
  }
  return f->str();
}

std::vector<TokenId> prompt(size_t n) {
  std::vector<TokenId> t;
  for (size_t i = 0; i < n; ++i) t.push_back(static_cast<TokenId>((i * 37 + 11) % 256));
  return t;
}

// All positions' logits of `tokens` evaluated with the given options.
std::vector<float> all_logits(const LoadedModel& m, SessionOptions o, const std::vector<TokenId>& tokens) {
  Session s(m, o);
  std::vector<float> out;
  s.evaluate(tokens, [&](int64_t, std::span<const float> l) { out.insert(out.end(), l.begin(), l.end()); });
  return out;
}

class SyntheticForward : public ::testing::TestWithParam<GgmlType> {};

TEST_P(SyntheticForward, ChunkThreadsGroupingAndDecodeGiveIdenticalLogits) {
  const auto model = load_model(synth_file(GetParam()));
  const auto tokens = prompt(150);
  SessionOptions base;
  base.n_ctx = 256;
  base.kv_block_tokens = 64;
  base.chunk = 150;
  base.threads = 1;
  const std::vector<float> ref = all_logits(*model, base, tokens);
  ASSERT_EQ(ref.size(), tokens.size() * model->config.n_vocab);
  for (int64_t chunk : {1, 7, 64}) {
    SessionOptions o = base;
    o.chunk = chunk;
    o.threads = chunk == 7 ? 3 : 2;
    EXPECT_EQ(all_logits(*model, o, tokens), ref) << "chunk " << chunk;
  }
  // Prefill of a prefix, then token-by-token decode.
  {
    Session s(*model, base);
    s.prefill(std::span(tokens).first(100));
    const size_t V = model->config.n_vocab;
    for (size_t t = 100; t < tokens.size(); ++t) {
      const auto l = s.decode(tokens[t]);
      ASSERT_TRUE(std::equal(l.begin(), l.end(), ref.begin() + static_cast<int64_t>(t * V)))
          << "position " << t;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, SyntheticForward, ::testing::Values(GgmlType::kF32, GgmlType::kQ8_0));

TEST(SyntheticForward, HeadGroupingDoesNotChangeLogits) {
  const auto model = load_model(synth_file(GgmlType::kF32));
  const auto tokens = prompt(70);
  ThreadPool pool(2);
  kv::MemoryLedger ledger;
  std::vector<std::vector<float>> outs;
  for (uint32_t group_heads : {0u, 1u}) {
    model::Forward fwd(model->config, model->weights, 32, pool, cpu::best_isa(), ledger);
    kv::ResidentKv cache(fwd.kv_geometry(32, cpu::KvDtype::kF16, group_heads), 128, model->config.n_head,
                         ledger, pool, cpu::best_isa());
    std::vector<float> logits(32 * model->config.n_vocab);
    std::vector<float> all;
    for (size_t i = 0; i < tokens.size(); i += 32) {
      const size_t n = std::min<size_t>(32, tokens.size() - i);
      fwd.run(std::span(tokens).subspan(i, n), static_cast<int64_t>(i), cache, model::LogitRows::kAll,
              logits.data());
      all.insert(all.end(), logits.begin(), logits.begin() + static_cast<int64_t>(n * model->config.n_vocab));
    }
    outs.push_back(all);
  }
  EXPECT_EQ(outs[0], outs[1]);
}

}  // namespace
}  // namespace kvtier::runtime
