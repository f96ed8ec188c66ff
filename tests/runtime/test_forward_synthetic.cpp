// The forward pass on a tiny synthetic llama (f32 and q8_0 weights): logits do not depend on the
// prefill chunk size, the thread count, the KV head grouping, or prefill vs decode (bit-identical:
// the attention tiles follow absolute positions and the matmul rows are batch-independent). The
// model-side compute hook recomputes the very bits a pass wrote; sequences interleaved in one
// session give what each gives alone.
#include <gtest/gtest.h>

#include <unistd.h>
#include <map>
#include <memory>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <tuple>
#include <vector>

#include "backend/cpu/kernels.h"
#include "common/temp_file.h"
#include "core/error.h"
#include "kv/resident_kv.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "runtime/greedy_alone.h"
#include "runtime/session.h"

namespace kvtier::runtime {
namespace {

// The synthetic model of `preset` (tiny-llama by default) and `type`, written once per process (CTest
// runs this binary's tests as parallel processes) and removed at exit.
std::string synth_file(GgmlType type, const std::string& preset = "tiny-llama", uint32_t n_ctx = 512) {
  static std::map<std::tuple<GgmlType, std::string, uint32_t>, std::unique_ptr<::kvtier::test::TempFile>>
      files;
  auto& f = files[{type, preset, n_ctx}];
  if (!f) {
    f = std::make_unique<::kvtier::test::TempFile>(
        "kvtier_test_" + preset + "_" + std::string(ggml_type_name(type)) + "_" + std::to_string(n_ctx),
        ".gguf");
    model::SynthOptions o;
    o.type = type;
    o.seed = 7;
    o.n_ctx = n_ctx;
    model::synth_writer(*model::find_preset(preset), o).write(f->str());
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

void expect_chunk_threads_and_decode_invariant(const std::string& path) {
  const auto model = load_model(path);
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

TEST_P(SyntheticForward, ChunkThreadsGroupingAndDecodeGiveIdenticalLogits) {
  expect_chunk_threads_and_decode_invariant(synth_file(GetParam()));
}

// OPT (LayerNorm with biases, learned positions, ReLU FFN) holds the same invariances.
TEST_P(SyntheticForward, OptChunkThreadsAndDecodeGiveIdenticalLogits) {
  expect_chunk_threads_and_decode_invariant(synth_file(GetParam(), "tiny-opt"));
}

INSTANTIATE_TEST_SUITE_P(Types, SyntheticForward, ::testing::Values(GgmlType::kF32, GgmlType::kQ8_0));

TEST(SyntheticForward, OptPositionsBeyondTheLearnedOnesAreAnError) {
  const auto model = load_model(synth_file(GgmlType::kF32, "tiny-opt", 64));
  SessionOptions o;
  o.n_ctx = 128;
  o.kv_block_tokens = 64;
  o.chunk = 32;
  Session s(*model, o);
  s.prefill(prompt(60));
  try {
    s.prefill(prompt(10));  // positions 60..69
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("position 69 is beyond the 64 learned positions"), std::string::npos)
        << e.what();
  }
}

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
      fwd.run(std::span(tokens).subspan(i, n), 0, cache, model::LogitRows::kAll, logits.data());
      all.insert(all.end(), logits.begin(), logits.begin() + static_cast<int64_t>(n * model->config.n_vocab));
    }
    outs.push_back(all);
  }
  EXPECT_EQ(outs[0], outs[1]);
}

// LogitRows::kStates leaves the output-normed state of every token, and the output projection of each
// state row gives the bits kAll gives for that position (so equal states prove equal logits: what
// `run --state-digest` and the exactness matrix rely on). Session::evaluate_states hands the same rows
// over and returns the last position's logits.
TEST(SyntheticForward, StatesGiveTheLogitsBitForBit) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kQ8_0}) {
    const auto model = load_model(synth_file(type));
    const auto tokens = prompt(70);
    const size_t V = model->config.n_vocab;
    const size_t E = model->config.n_embd;
    ThreadPool pool(2);
    kv::MemoryLedger ledger;
    std::vector<float> logits_all;
    std::vector<float> from_states;
    std::vector<float> states;
    for (const auto rows : {model::LogitRows::kAll, model::LogitRows::kStates}) {
      model::Forward fwd(model->config, model->weights, 32, pool, cpu::best_isa(), ledger);
      kv::ResidentKv cache(fwd.kv_geometry(32, cpu::KvDtype::kF16), 128, model->config.n_head, ledger, pool,
                           cpu::best_isa());
      std::vector<float> logits(32 * V);
      for (size_t i = 0; i < tokens.size(); i += 32) {
        const size_t n = std::min<size_t>(32, tokens.size() - i);
        fwd.run(std::span(tokens).subspan(i, n), 0, cache, rows, logits.data());
        if (rows == model::LogitRows::kAll) {
          logits_all.insert(logits_all.end(), logits.begin(), logits.begin() + static_cast<int64_t>(n * V));
          continue;
        }
        const std::vector<float> chunk(fwd.states().begin(), fwd.states().end());
        ASSERT_EQ(chunk.size(), n * E);
        states.insert(states.end(), chunk.begin(), chunk.end());
        for (size_t t = 0; t < n; ++t) {  // one row at a time, from a copy: the projection is row-wise
          fwd.output(chunk.data() + t * E, 1, logits.data());
          from_states.insert(from_states.end(), logits.begin(), logits.begin() + static_cast<int64_t>(V));
        }
      }
    }
    ASSERT_EQ(from_states.size(), tokens.size() * V);
    EXPECT_TRUE(from_states == logits_all) << ggml_type_name(type);

    SessionOptions o;
    o.n_ctx = 128;
    o.chunk = 25;
    Session s(*model, o);
    std::vector<float> seen;
    std::vector<int64_t> positions;
    const auto last = s.evaluate_states(0, tokens, [&](int64_t pos, std::span<const float> row) {
      positions.push_back(pos);
      seen.insert(seen.end(), row.begin(), row.end());
    });
    EXPECT_TRUE(seen == states) << "states do not depend on the pass size";
    ASSERT_EQ(positions.size(), tokens.size());
    EXPECT_EQ(positions.back(), static_cast<int64_t>(tokens.size()) - 1);
    EXPECT_TRUE(std::equal(last.begin(), last.end(), logits_all.end() - static_cast<int64_t>(V)));
  }
}

// A cache that asks for the layer inputs and pre-RoPE rows and records what each write hands over.
class RecordingKv final : public kv::KvCache {
 public:
  RecordingKv(kv::KvCache& inner, const model::ModelConfig& cfg) : inner_(inner), cfg_(cfg) {}
  const kv::KvGeometry& geometry() const override { return inner_.geometry(); }
  int64_t capacity() const override { return inner_.capacity(); }
  uint32_t max_sequences() const override { return inner_.max_sequences(); }
  int64_t positions(kv::SeqId s) const override { return inner_.positions(s); }
  uint32_t needs() const override { return kv::kNeedLayerInput | kv::kNeedPreRope; }
  std::span<const kv::PassPositions> begin_batch(std::span<const kv::PassInfo> seqs) override {
    x.clear();
    k.clear();
    v.clear();
    const auto p = inner_.begin_batch(seqs);
    EXPECT_EQ(p.size(), 1u);
    pass_ = p[0];
    return p;
  }
  void write(uint32_t l, const kv::LayerRows& r) override {
    const int64_t n = pass_.n, hk = cfg_.layers[l].n_head_kv;
    EXPECT_NE(r.x, nullptr);
    EXPECT_NE(r.q_pre, nullptr);
    EXPECT_NE(r.k_pre, nullptr);
    x.emplace_back(r.x, r.x + n * cfg_.n_embd);
    k.emplace_back(r.k, r.k + n * hk * cfg_.head_dim_k);
    v.emplace_back(r.v, r.v + n * hk * cfg_.head_dim_v);
    inner_.write(l, r);
  }
  void attend(uint32_t l, const float* q, int64_t h, const kv::LayerAttention& la, float* o) override {
    inner_.attend(l, q, h, la, o);
  }
  void end_pass() override { inner_.end_pass(); }
  void abort_pass() override { inner_.abort_pass(); }
  void truncate(kv::SeqId s, int64_t n) override { inner_.truncate(s, n); }

  kv::PassPositions pass_;
  std::vector<std::vector<float>> x, k, v;  // [layer] rows of the last pass

 private:
  kv::KvCache& inner_;
  const model::ModelConfig& cfg_;
};

TEST(SyntheticForward, ComputeHookRecomputesTheBitsThePassWrote) {
  for (const auto& [type, preset] :
       {std::pair{GgmlType::kF32, "tiny-llama"}, std::pair{GgmlType::kQ8_0, "tiny-llama"},
        std::pair{GgmlType::kF32, "tiny-opt"}, std::pair{GgmlType::kQ8_0, "tiny-opt"}}) {
    const bool rope = std::string(preset) != "tiny-opt";
    const auto model = load_model(synth_file(type, preset));
    const auto& cfg = model->config;
    const auto tokens = prompt(40);
    ThreadPool pool(2);
    kv::MemoryLedger ledger;
    model::Forward fwd(cfg, model->weights, 32, pool, cpu::best_isa(), ledger,
                       kv::kNeedLayerInput | kv::kNeedPreRope);
    kv::ResidentKv inner(fwd.kv_geometry(32, cpu::KvDtype::kF16), 128, cfg.n_head, ledger, pool,
                         cpu::best_isa());
    RecordingKv cache(inner, cfg);
    std::vector<float> logits(32 * cfg.n_vocab);
    fwd.run(std::span(tokens).first(32), 0, cache, model::LogitRows::kLast, logits.data());
    fwd.run(std::span(tokens).subspan(32, 8), 0, cache, model::LogitRows::kLast, logits.data());
    ASSERT_EQ(cache.pass_.pos0, 32);
    // Recompute the second pass's rows (positions 32..39) from the recorded layer inputs.
    std::vector<int64_t> pos(8);
    for (int64_t t = 0; t < 8; ++t) pos[static_cast<size_t>(t)] = 32 + t;
    for (uint32_t l = 0; l < cfg.n_layer; ++l) {
      std::vector<float> k(cache.k[l].size()), v(cache.v[l].size());
      fwd.project_kv(l, cache.x[l].data(), pos, k.data(), v.data());
      EXPECT_EQ(0, std::memcmp(k.data(), cache.k[l].data(), k.size() * sizeof(float))) << "layer " << l;
      EXPECT_EQ(0, std::memcmp(v.data(), cache.v[l].data(), v.size() * sizeof(float))) << "layer " << l;
      // At other positions the keys differ (RoPE; OPT has none: its positions enter the layer input),
      // the values do not.
      std::vector<int64_t> shifted(pos);
      for (auto& p : shifted) p += 5;
      std::vector<float> k2(k.size()), v2(v.size());
      fwd.project_kv(l, cache.x[l].data(), shifted, k2.data(), v2.data());
      if (rope) {
        EXPECT_NE(k2, k) << "layer " << l;
      } else {
        EXPECT_EQ(k2, k) << "layer " << l;
      }
      EXPECT_EQ(v2, v) << "layer " << l;
    }
  }
}

TEST(SyntheticForward, InterleavedSequencesInOneSessionMatchRunningAlone) {
  const auto model = load_model(synth_file(GgmlType::kQ8_0));
  const size_t V = model->config.n_vocab;
  SessionOptions o;
  o.n_ctx = 256;
  o.kv_block_tokens = 64;
  o.chunk = 48;
  o.threads = 2;
  const auto a = prompt(100);
  std::vector<TokenId> b;
  for (size_t i = 0; i < 70; ++i) b.push_back(static_cast<TokenId>((i * 101 + 3) % 256));
  // Alone: prefill, then greedy steps; the logits of 10 generated tokens.
  const auto ref_a = test::greedy_logits_alone(*model, o, a, 10),
             ref_b = test::greedy_logits_alone(*model, o, b, 10);
  SessionOptions o2 = o;
  o2.kv_placement.max_seqs = 2;
  Session s(*model, o2);
  std::vector<float> got_a, got_b;
  auto la = s.prefill(1, b);  // sequence 1 first, then 0: their blocks interleave in the pools
  std::vector<float> last_b(la.begin(), la.end());
  auto lb = s.prefill(0, a);
  std::vector<float> last_a(lb.begin(), lb.end());
  for (int step = 0; step < 10; ++step) {
    got_a.insert(got_a.end(), last_a.begin(), last_a.end());
    got_b.insert(got_b.end(), last_b.begin(), last_b.end());
    const auto na = static_cast<TokenId>(std::max_element(last_a.begin(), last_a.end()) - last_a.begin());
    const auto nb = static_cast<TokenId>(std::max_element(last_b.begin(), last_b.end()) - last_b.begin());
    auto l0 = s.decode(0, na);
    last_a.assign(l0.begin(), l0.end());
    auto l1 = s.decode(1, nb);
    last_b.assign(l1.begin(), l1.end());
  }
  ASSERT_EQ(got_a.size(), 10 * V);
  EXPECT_EQ(got_a, ref_a);
  EXPECT_EQ(got_b, ref_b);
  EXPECT_EQ(s.n_past(0), 110);
  EXPECT_EQ(s.n_past(1), 80);
  s.truncate(1, 0);
  EXPECT_EQ(s.n_past(1), 0);
  EXPECT_EQ(s.n_past(0), 110);
}

// Batched passes: three sequences with prompts of different lengths, the third joining later, go
// through Session::step together (prefill chunks and decode tokens mixed in one pass, split as the
// chunk allows). For every exact policy each one's logits at every generated step are the bits it
// gets alone (prefill + decode). The matmul rows are batch-independent (matmul.h) and each sequence
// attends its own KV (attention.h: results independent of the number of query tokens).
TEST(SyntheticForward, BatchedStepsMatchEachSequenceAloneForEveryExactPolicy) {
  const auto model = load_model(synth_file(GgmlType::kQ8_0));
  const size_t V = model->config.n_vocab;
  constexpr int kGen = 8;
  std::vector<std::vector<TokenId>> prompts;
  for (size_t len : {90u, 37u, 61u}) {
    std::vector<TokenId> p;
    for (size_t i = 0; i < len; ++i) p.push_back(static_cast<TokenId>((i * (31 + len) + len) % 256));
    prompts.push_back(p);
  }
  const std::vector<int> join_step = {0, 0, 3};
  struct Policy {
    const char* name;
    policy::Placement placement;
    policy::Retention retention;
    uint32_t group, static_heads, depth;
  };
  const Policy policies[] = {
      {"resident", policy::Placement::kResident, policy::Retention::kNone, 0, 0, 1},
      {"resident+sliding", policy::Placement::kResident, policy::Retention::kSliding, 0, 0, 1},
      {"layer", policy::Placement::kLayer, policy::Retention::kNone, 0, 0, 1},
      {"layer+sliding", policy::Placement::kLayer, policy::Retention::kSliding, 0, 0, 1},
      {"headinfer g1", policy::Placement::kHeadInfer, policy::Retention::kNone, 1, 0, 1},
      {"headinfer g1 static 1 depth 2", policy::Placement::kHeadInfer, policy::Retention::kNone, 1, 1, 2},
  };
  for (const Policy& pol : policies) {
    SessionOptions o;
    o.n_ctx = 256;
    o.kv_block_tokens = 128;  // whole 4 KiB pages of f16 rows of 16 (offloaded homes)
    o.chunk = 32;
    o.threads = 2;
    o.kv_placement.placement.placement = pol.placement;
    o.kv_placement.placement.group = pol.group;
    o.kv_placement.placement.static_heads = pol.static_heads;
    o.kv_placement.placement.prefetch_depth = pol.depth;
    o.kv_placement.retention = pol.retention;
    // Alone: the logits each generated token is chosen from.
    std::vector<std::vector<float>> ref;
    for (const auto& p : prompts) ref.push_back(test::greedy_logits_alone(*model, o, p, kGen));
    SessionOptions ob = o;
    ob.kv_placement.max_seqs = 4;
    Session s(*model, ob);
    ASSERT_GE(s.max_batch(), 3);
    const size_t B = prompts.size();
    std::vector<size_t> fed(B, 0);  // prompt tokens fed
    std::vector<TokenId> next(B, -1);
    std::vector<std::vector<float>> got(B);
    int max_parts = 0;
    for (int step = 0; step < 200; ++step) {
      std::vector<model::SeqTokens> parts;
      std::vector<size_t> who;
      int64_t budget = s.chunk();
      for (size_t b = 0; b < B; ++b) {  // decode tokens first
        if (next[b] >= 0 && got[b].size() < kGen * V && budget > 0) {
          parts.push_back({static_cast<kv::SeqId>(b), {&next[b], 1}, model::LogitRows::kLast});
          who.push_back(b);
          --budget;
        }
      }
      for (size_t b = 0; b < B; ++b) {  // then prompt pieces as the budget allows
        if (step < join_step[b] || fed[b] == prompts[b].size() || budget <= 0) continue;
        const size_t m = std::min<size_t>(static_cast<size_t>(budget), prompts[b].size() - fed[b]);
        const bool last = fed[b] + m == prompts[b].size();
        parts.push_back({static_cast<kv::SeqId>(b), std::span(prompts[b]).subspan(fed[b], m),
                         last ? model::LogitRows::kLast : model::LogitRows::kNone});
        who.push_back(b);
        fed[b] += m;
        budget -= static_cast<int64_t>(m);
      }
      if (parts.empty()) break;
      max_parts = std::max(max_parts, static_cast<int>(parts.size()));
      const auto logits = s.step(parts);
      size_t row = 0;
      for (size_t i = 0; i < parts.size(); ++i) {
        if (parts[i].rows == model::LogitRows::kNone) continue;
        const auto l = logits.subspan(row++ * V, V);
        const size_t b = who[i];
        got[b].insert(got[b].end(), l.begin(), l.end());
        next[b] = static_cast<TokenId>(std::max_element(l.begin(), l.end()) - l.begin());
      }
      ASSERT_EQ(row * V, logits.size());
    }
    EXPECT_GE(max_parts, 3) << pol.name;
    for (size_t b = 0; b < B; ++b) {
      ASSERT_EQ(got[b].size(), kGen * V) << pol.name << " seq " << b;
      EXPECT_TRUE(got[b] == ref[b]) << pol.name << " seq " << b << ": logits differ from running alone";
      EXPECT_EQ(s.n_past(static_cast<kv::SeqId>(b)), static_cast<int64_t>(prompts[b].size()) + kGen - 1);
    }
  }
}

// Matrices packed for the CPU kernels (model::pack_output_lanes / pack_layer_lanes, done by load_model where
// the ISA has a lanes kernel for their type: the output matrix, and the layers' unless pack_layers is off)
// give every logit the GGUF rows' bits: every-position evaluation (prefill chunks of 16 tokens: panel tiles
// on the GGUF rows where the type has them, q8_0's lanes kernel otherwise), and one-token decode steps, with
// 1 and 2 threads, on each vector path of the CPU.
TEST(SyntheticForward, PackedMatricesGiveTheSameLogits) {
  bool any_kernel = false;
  for (cpu::Isa isa : {cpu::Isa::kAvx2, cpu::Isa::kAvx512}) {
    if (!cpu::isa_supported(isa)) continue;
    // tiny-opt's output matrix is its embedding (tied), whose rows are then looked up in the copy.
    for (const auto& [type, preset] : std::vector<std::pair<GgmlType, std::string>>{
             {GgmlType::kQ8_0, "tiny-llama"},
             {GgmlType::kQ4_0, "tiny-llama"},
             {GgmlType::kQ4_1, "tiny-llama"},
             {GgmlType::kQ8_0, "tiny-opt"},
             {GgmlType::kQ4_1, "tiny-opt"}}) {  // the synthetic types
      const std::string f = synth_file(type, preset);
      const std::string what =
          std::string(cpu::isa_name(isa)) + " " + preset + " " + std::string(ggml_type_name(type));
      const auto packed = load_model(f, LoadOptions{.cpu_isa = isa});
      const auto output_only = load_model(f, LoadOptions{.cpu_isa = isa, .pack_layers = false});
      const auto plain = load_model(f, LoadOptions{.cpu_isa = std::nullopt});
      EXPECT_EQ(plain->weights.output.lanes, nullptr);
      EXPECT_EQ(plain->weights.layers[0].wq.lanes, nullptr);
      EXPECT_EQ(output_only->weights.layers[0].wq.lanes, nullptr);
      EXPECT_EQ(plain->weights.tok_embd.lanes, nullptr);
      EXPECT_EQ(packed->weights.tok_embd.lanes,
                packed->weights.tied_output ? packed->weights.output.lanes : nullptr)
          << preset;
      const cpu::KernelTable& table = cpu::kernel_table(isa);
      const auto ti = static_cast<size_t>(type);
      const bool has_kernel = table.lanes[ti] != nullptr;
      // The output matrix's copy counts as extra bytes only where prefill still reads its GGUF rows
      // (a type with panel tiles whose lanes kernel does not serve prefill: q4_0, q4_1); q8_0's
      // replaces them.
      ASSERT_EQ(output_only->weights.lanes.size(), has_kernel ? 1u : 0u) << what;
      const bool rows_kept = table.panel[ti].fn != nullptr && !table.lanes_any_tokens[ti];
      EXPECT_EQ(output_only->weights.lanes_extra_bytes,
                has_kernel && rows_kept ? output_only->weights.lanes.front()->size() : 0u)
          << what;
      any_kernel = any_kernel || has_kernel;
      ASSERT_EQ(packed->weights.layers[1].down.lanes != nullptr, has_kernel) << what;
      EXPECT_EQ(packed->weights.lanes_extra_bytes > 0, has_kernel && rows_kept) << what;
      // The layers' copies lie end to end in one buffer (each in a buffer of its own would take whole
      // 2 MiB pages), and their bytes are what lanes_extra_bytes counts beside the output's where
      // prefill keeps reading the GGUF rows; where the copies replace them (the AVX-512 path without
      // AMX), nothing is counted twice.
      uint64_t layer_bytes = 0;
      for (size_t i = 2; i < packed->weights.lanes.size(); ++i) {
        const auto& before = *packed->weights.lanes[i - 1];
        EXPECT_EQ(packed->weights.lanes[i]->data(), before.data() + before.size()) << what << ", copy " << i;
      }
      for (size_t i = 1; i < packed->weights.lanes.size(); ++i)
        layer_bytes += packed->weights.lanes[i]->size();
      EXPECT_EQ(packed->weights.lanes_extra_bytes,
                (rows_kept ? layer_bytes : 0) + output_only->weights.lanes_extra_bytes)
          << what;
      const auto tokens = prompt(45);
      for (int threads : {1, 2}) {
        SessionOptions o;
        o.threads = threads;
        o.n_ctx = 512;
        o.chunk = 16;
        o.isa = isa;
        const auto b = all_logits(*plain, o, tokens);
        const auto gb = test::greedy_logits_alone(*plain, o, tokens, 8);
        for (const LoadedModel* m : {packed.get(), output_only.get()}) {
          const auto a = all_logits(*m, o, tokens);
          ASSERT_EQ(a.size(), b.size());
          EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
              << what << ", " << threads << " threads";
          const auto ga = test::greedy_logits_alone(*m, o, tokens, 8);
          ASSERT_EQ(ga.size(), gb.size());
          EXPECT_EQ(0, std::memcmp(ga.data(), gb.data(), ga.size() * sizeof(float)))
              << what << ", " << threads << " threads";
        }
      }
    }
  }
  if (!any_kernel)
    GTEST_SKIP() << "no lanes kernel on this CPU's paths: the matrices stay in GGUF rows here, so every "
                    "load ran the same path";
}

}  // namespace
}  // namespace kvtier::runtime
