#include <gtest/gtest.h>

#include <filesystem>

#include "gguf/reader.h"
#include "model/hparams.h"
#include "model/synthetic.h"

namespace kvtier::model {
namespace {

std::string write_tmp(const gguf::Writer& w, const std::string& name) {
  const auto dir = std::filesystem::path(KVTIER_BINARY_DIR) / "test_tmp" / "hparams";
  std::filesystem::create_directories(dir);
  const auto p = (dir / name).string();
  w.write(p);
  return p;
}

TEST(Hparams, SyntheticRoundTrip) {
  SynthOptions o;
  o.type = GgmlType::kF32;
  o.n_ctx = 777;
  const auto path = write_tmp(synth_writer(*find_preset("tiny-llama"), o), "tiny.gguf");
  const gguf::File f(path);
  const Hparams hp = read_hparams(f);
  EXPECT_EQ(hp.arch, Arch::kLlama);
  EXPECT_EQ(hp.n_layer, 2u);
  EXPECT_EQ(hp.n_embd, 64u);
  EXPECT_EQ(hp.n_head, 4u);
  EXPECT_EQ(hp.n_head_kv, (std::vector<uint32_t>{2, 2}));
  EXPECT_EQ(hp.head_dim_k, 16u);
  EXPECT_EQ(hp.n_ctx_train, 777u);
  EXPECT_EQ(hp.n_vocab, 272u);
  EXPECT_EQ(hp.kv_bytes_per_token(2), 2u * 2 * 2 * 16 * 2);  // layers * kv heads * (K+V) * dim * f16
}

TEST(Hparams, PerLayerKvHeadsAndBadValues) {
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::string("mystery"));
  w.set("mystery.block_count", gguf::Value::u32(3));
  w.set("mystery.embedding_length", gguf::Value::u32(256));
  w.set("mystery.attention.head_count", gguf::Value::u32(8));
  w.set("mystery.attention.head_count_kv", gguf::Value::i32_array({8, 2, 0}));
  const auto path = write_tmp(w, "perlayer.gguf");
  const Hparams hp = read_hparams(gguf::File(path));
  EXPECT_EQ(hp.arch, Arch::kOther);
  EXPECT_FALSE(hp.uniform_kv_heads());
  EXPECT_EQ(hp.kv_bytes_per_token(2), (8u + 2u + 0u) * 2 * 32 * 2);

  w.set("mystery.attention.head_count_kv", gguf::Value::u32(3));  // does not divide 8
  EXPECT_THROW(read_hparams(gguf::File(write_tmp(w, "bad_kv.gguf"))), Error);
  w.set("mystery.attention.head_count_kv", gguf::Value::i32_array({8, 2}));  // wrong length
  EXPECT_THROW(read_hparams(gguf::File(write_tmp(w, "bad_len.gguf"))), Error);
  w.set("mystery.block_count", gguf::Value::string("three"));
  try {
    read_hparams(gguf::File(write_tmp(w, "bad_type.gguf")));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mystery.block_count"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvtier::model
