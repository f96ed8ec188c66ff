#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "gguf/reader.h"
#include "model/hparams.h"
#include "model/presets.h"
#include "model/synthetic.h"

namespace kvtier::model {
namespace {

// Parameter counts published for the real models these presets imitate: the shapes must match.
TEST(Presets, ParameterCountsMatchTheRealModels) {
  EXPECT_EQ(parameter_count(*find_preset("llama3-8b")), 8030261248ULL);   // Meta-Llama-3-8B
  EXPECT_EQ(parameter_count(*find_preset("llama2-7b")), 6738415616ULL);   // Llama-2-7b-hf
  EXPECT_EQ(parameter_count(*find_preset("mistral-7b")), 7241732096ULL);  // Mistral-7B-v0.1/v0.2
  EXPECT_EQ(parameter_count(*find_preset("qwen2-7b")), 7615616512ULL);    // Qwen2-7B
  EXPECT_EQ(parameter_count(*find_preset("smollm2-135m")),
            134515008ULL);  // SmolLM2-135M (the GGUF in models/)
}

// OPT: Hugging Face's facebook/opt-* count 2050 learned positions (positions are offset by 2); the
// presets hold the 2048 usable ones, so they have 2 * n_embd parameters fewer.
TEST(Presets, OptParameterCountsMatchTheRealModels) {
  EXPECT_EQ(parameter_count(*find_preset("opt-125m")), 125239296ULL - 2 * 768);
  EXPECT_EQ(parameter_count(*find_preset("opt-1.3b")), 1315758080ULL - 2 * 2048);
  EXPECT_EQ(parameter_count(*find_preset("opt-6.7b")), 6658473984ULL - 2 * 4096);
  EXPECT_EQ(parameter_count(*find_preset("opt-13b")), 12853473280ULL - 2 * 5120);
}

TEST(Presets, EveryPresetWritesAFileThatReadsBack) {
  for (const auto& p : all_presets()) {
    if (p.n_embd > 1024) continue;  // the 7B-class presets are covered by the shape test above
    SynthOptions o;
    o.type = GgmlType::kQ8_0;
    o.n_layer = 1;
    o.n_ctx = 1234;
    const auto bytes = synth_writer(p, o).to_bytes();
    const gguf::Content c = gguf::parse(bytes, std::string(p.name));
    EXPECT_EQ(c.tensors.size(), synth_tensors(p, o).size()) << p.name;
    bool found_q = false;
    for (const auto& t : c.tensors) {
      if (t.name == "blk.0.attn_q.weight") {
        found_q = true;
        EXPECT_EQ(t.type, GgmlType::kQ8_0);
        EXPECT_EQ(t.ne, (std::vector<uint64_t>{p.n_embd, uint64_t{p.n_head} * p.head_dim}));
      }
      if (t.name.find("norm") != std::string::npos) {
        EXPECT_EQ(t.type, GgmlType::kF32) << t.name;
      }
    }
    EXPECT_TRUE(found_q) << p.name;
  }
}

TEST(Synthetic, ValuesAreDeterministicPerSeedAndScaled) {
  const SynthTensor t{"blk.0.attn_q.weight", {4096, 4096}, GgmlType::kF16, SynthInit::kUniform, 1.0f / 64};
  std::vector<float> a(10000), b(10000), c(10000), tail(100);
  synth_values(t, 1, 0, a);
  synth_values(t, 1, 0, b);
  synth_values(t, 2, 0, c);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Any slice is the same as the whole: values depend only on (seed, name, index).
  synth_values(t, 1, 9900, tail);
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), a.begin() + 9900));
  double sum = 0, sq = 0;
  for (float x : a) {
    sum += x;
    sq += double{x} * x;
  }
  const double mean = sum / a.size(), sd = std::sqrt(sq / a.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(sd, 1.0 / 64, 0.0005);
}

TEST(Synthetic, VocabularyIsByteLevel) {
  const auto v = synth_vocab(272);
  ASSERT_EQ(v.size(), 272u);
  EXPECT_EQ(v['A'], "A");
  EXPECT_EQ(v[' '], "\xc4\xa0");  // GPT-2 maps the space byte to U+0120
  EXPECT_EQ(v[256], "<|begin_of_text|>");
  EXPECT_EQ(v[271], "<|reserved_13|>");
  std::set<std::string> unique(v.begin(), v.end());
  EXPECT_EQ(unique.size(), v.size());
}

TEST(Synthetic, RejectsTypesItCannotWrite) {
  SynthOptions o;
  o.type = GgmlType::kQ4_K;
  EXPECT_THROW(synth_writer(*find_preset("tiny-llama"), o), Error);
}

}  // namespace
}  // namespace kvtier::model
