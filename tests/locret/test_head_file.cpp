// The retaining heads' sidecar GGUF: round trip, the model-hash check, corrupt files.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "common/temp_file.h"
#include "core/error.h"
#include "gguf/writer.h"
#include "locret/head_file.h"

namespace kvtier::locret {
namespace {

model::ModelConfig small_config() {
  model::ModelConfig cfg;
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.head_dim_k = 8;
  cfg.head_dim_v = 8;
  cfg.act = model::FfnActivation::kSilu;
  cfg.layers.resize(2);
  for (auto& l : cfg.layers) l.n_head_kv = 2;
  return cfg;
}

std::string error_of(const std::function<void()>& fn, ErrorKind kind) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return {};
}

TEST(LocretHeadFile, RoundTripKeepsEveryBitAndTheMetadata) {
  const test::TempFile tmp("locret_heads", ".gguf");
  const auto cfg = small_config();
  const RetainingHeads heads = RetainingHeads::random(head_shapes(cfg, 16), 1);
  HeadFileMeta meta{"fp64v1:0123456789abcdef", "tiny", {{"command", "kvtier train-locret ..."}}};
  save_heads(tmp.str(), heads, meta);
  const HeadFile got = load_heads(tmp.str(), meta.model_hash, cfg);
  EXPECT_EQ(got.heads.shapes(), heads.shapes());
  for (uint32_t l = 0; l < 2; ++l) {
    EXPECT_EQ(got.heads.layer(l).fc1, heads.layer(l).fc1);
    EXPECT_EQ(got.heads.layer(l).fc2, heads.layer(l).fc2);
  }
  EXPECT_EQ(got.meta.model_name, "tiny");
  ASSERT_EQ(got.meta.provenance.size(), 1u);
  EXPECT_EQ(got.meta.provenance[0].second, "kvtier train-locret ...");
  EXPECT_FALSE(got.optimizer.has_value());
}

TEST(LocretHeadFile, CheckpointKeepsTheOptimizerState) {
  const test::TempFile tmp("locret_ckpt", ".gguf");
  const auto cfg = small_config();
  const HeadShapes shapes = head_shapes(cfg, 8);
  const RetainingHeads heads = RetainingHeads::random(shapes, 1);
  OptimizerState opt = OptimizerState::zeros(shapes);
  opt.step = 123;
  opt.m[1].fc1[5] = 0.25f;
  opt.v[0].fc2[3] = 1e-7f;
  save_heads(tmp.str(), heads, {"fp64v1:00", "", {}}, &opt);
  const HeadFile got = read_heads(tmp.str());
  ASSERT_TRUE(got.optimizer.has_value());
  EXPECT_EQ(got.optimizer->step, 123);
  EXPECT_EQ(got.optimizer->m[1].fc1, opt.m[1].fc1);
  EXPECT_EQ(got.optimizer->v[0].fc2, opt.v[0].fc2);
}

TEST(LocretHeadFile, AnotherModelsHashIsAClearError) {
  const test::TempFile tmp("locret_hash", ".gguf");
  const auto cfg = small_config();
  save_heads(tmp.str(), RetainingHeads::random(head_shapes(cfg, 8), 1), {"fp64v1:aaaa", "model A", {}});
  const std::string msg =
      error_of([&] { load_heads(tmp.str(), "fp64v1:bbbb", cfg); }, ErrorKind::kInvalidFile);
  EXPECT_NE(msg.find("fp64v1:aaaa"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fp64v1:bbbb"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model A"), std::string::npos) << msg;
}

TEST(LocretHeadFile, AnotherModelsShapesAreAClearError) {
  const test::TempFile tmp("locret_shape", ".gguf");
  auto cfg = small_config();
  save_heads(tmp.str(), RetainingHeads::random(head_shapes(cfg, 8), 1), {"h", "", {}});
  auto more_layers = cfg;
  more_layers.layers.resize(3, cfg.layers[0]);
  EXPECT_NE(error_of([&] { load_heads(tmp.str(), "h", more_layers); }, ErrorKind::kInvalidFile).find("3"),
            std::string::npos);
  auto other_kv = cfg;
  other_kv.layers[1].n_head_kv = 4;
  EXPECT_NE(error_of([&] { load_heads(tmp.str(), "h", other_kv); }, ErrorKind::kInvalidFile).find("layer 1"),
            std::string::npos);
  auto gelu = cfg;
  gelu.act = model::FfnActivation::kGeluTanh;
  error_of([&] { load_heads(tmp.str(), "h", gelu); }, ErrorKind::kInvalidFile);
}

TEST(LocretHeadFile, CorruptOrForeignFilesAreClearErrors) {
  const test::TempFile tmp("locret_corrupt", ".gguf");
  const auto cfg = small_config();
  save_heads(tmp.str(), RetainingHeads::random(head_shapes(cfg, 8), 1), {"h", "", {}});
  std::vector<char> bytes(std::filesystem::file_size(tmp.path()));
  std::ifstream(tmp.path(), std::ios::binary).read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  auto write = [&](const std::vector<char>& b) {
    std::ofstream(tmp.path(), std::ios::binary | std::ios::trunc)
        .write(b.data(), static_cast<std::streamsize>(b.size()));
  };
  // Truncated: the GGUF reader's bounds checks.
  write(std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(bytes.size() / 2)));
  error_of([&] { load_heads(tmp.str(), "h", cfg); }, ErrorKind::kInvalidFile);
  // Not a GGUF at all.
  write(std::vector<char>(64, 'x'));
  error_of([&] { load_heads(tmp.str(), "h", cfg); }, ErrorKind::kInvalidFile);
  // A GGUF that is not a head file.
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::string("llama"));
  w.write(tmp.str());
  EXPECT_NE(error_of([&] { load_heads(tmp.str(), "h", cfg); }, ErrorKind::kInvalidFile)
                .find("not a retaining-head"),
            std::string::npos);
  // A head tensor of the wrong shape.
  gguf::Writer bad;
  bad.set("general.architecture", gguf::Value::string("locret-heads"));
  for (const char* k : {"locret.format_version", "locret.layer_count"}) bad.set(k, gguf::Value::u32(1));
  bad.set("locret.model_hash", gguf::Value::string("h"));
  bad.set("locret.intermediate_size", gguf::Value::u32(8));
  bad.set("locret.activation", gguf::Value::string("silu"));
  bad.set("locret.head_count", gguf::Value::u32(4));
  bad.set("locret.key_length", gguf::Value::u32(8));
  bad.set("locret.value_length", gguf::Value::u32(8));
  bad.add_tensor_bytes("locret.blk.0.fc1.weight", GgmlType::kF32, {64, 7}, std::vector<uint8_t>(64 * 7 * 4));
  bad.add_tensor_bytes("locret.blk.0.fc2.weight", GgmlType::kF32, {8, 2}, std::vector<uint8_t>(8 * 2 * 4));
  bad.write(tmp.str());
  EXPECT_NE(error_of([&] { load_heads(tmp.str(), "h", cfg); }, ErrorKind::kInvalidFile).find("fc1.weight"),
            std::string::npos);
}

}  // namespace
}  // namespace kvtier::locret
