// The InfiniGen sidecar file: round trip, the model-hash check and the corruption checks.
#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <string>

#include "common/temp_file.h"
#include "core/content_hash.h"
#include "core/error.h"
#include "skew/skew_file.h"
#include "skew/skew_math.h"

namespace kvtier::skew {
namespace {

SkewSet make_set() {
  SkewSet set;
  set.model_hash = xxh3_tag(std::vector<uint8_t>{1, 2, 3});
  set.head_dim = 16;
  set.partial_ratio = 0.3f;
  set.partial_columns = 4;
  set.sample_tokens = 40;
  set.sample_source = "test";
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (uint32_t n_kv : {2u, 1u}) {  // layers may differ in KV heads
    LayerSkew L;
    L.n_head_kv = n_kv;
    for (uint32_t h = 0; h < n_kv; ++h) {
      std::vector<float> q(40 * 16);
      for (float& x : q) x = nd(rng);
      const SkewMatrix a = skew_matrix(q, 40, 16);
      L.a.insert(L.a.end(), a.a.begin(), a.a.end());
      L.sigma.insert(L.sigma.end(), a.sigma.begin(), a.sigma.end());
      for (int32_t c : {0, 3, 7, 15}) L.cols.push_back(c);
    }
    set.layers.push_back(std::move(L));
  }
  return set;
}

void expect_error(const std::string& path, const std::string& hash, const std::string& needle) {
  try {
    read_skew(path, hash);
    ADD_FAILURE() << "no error, expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidFile);
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(SkewFile, RoundTripKeepsEveryValue) {
  const test::TempFile tmp("skew_roundtrip", ".gguf");
  const SkewSet set = make_set();
  size_t calls = 0;
  write_skew(set, tmp.str(), [&](size_t done, size_t total) {
    ++calls;
    EXPECT_LE(done, total);
  });
  EXPECT_GT(calls, 0u);
  const SkewSet got = read_skew(tmp.str(), set.model_hash);
  EXPECT_EQ(got.model_hash, set.model_hash);
  EXPECT_EQ(got.head_dim, 16u);
  EXPECT_EQ(got.partial_columns, 4u);
  EXPECT_EQ(got.sample_tokens, 40u);
  EXPECT_EQ(got.sample_source, "test");
  ASSERT_EQ(got.layers.size(), 2u);
  for (size_t l = 0; l < 2; ++l) {
    EXPECT_EQ(got.layers[l].n_head_kv, set.layers[l].n_head_kv);
    EXPECT_EQ(got.layers[l].a, set.layers[l].a);
    EXPECT_EQ(got.layers[l].sigma, set.layers[l].sigma);
    EXPECT_EQ(got.layers[l].cols, set.layers[l].cols);
  }
}

TEST(SkewFile, AnotherModelsHashIsRefusedNamingBothHashes) {
  const test::TempFile tmp("skew_hash", ".gguf");
  const SkewSet set = make_set();
  write_skew(set, tmp.str());
  const std::string other = xxh3_tag(std::vector<uint8_t>{9});
  expect_error(tmp.str(), other, "made for another model");
  expect_error(tmp.str(), other, other);
  EXPECT_NO_THROW(read_skew(tmp.str(), ""));
}

TEST(SkewFile, ACorruptMatrixIsRefused) {
  const test::TempFile tmp("skew_corrupt", ".gguf");
  SkewSet set = make_set();
  set.layers[1].a[5] += 0.01f;  // no longer orthogonal
  write_skew(set, tmp.str());
  expect_error(tmp.str(), set.model_hash, "not orthogonal");
}

TEST(SkewFile, BadColumnSetsAreRefused) {
  const test::TempFile tmp("skew_cols", ".gguf");
  SkewSet set = make_set();
  set.layers[0].cols[5] = 2;  // head 1: {0, 2, 1, 15}, not ascending
  set.layers[0].cols[6] = 1;
  write_skew(set, tmp.str());
  expect_error(tmp.str(), set.model_hash, "partial columns");
}

TEST(SkewFile, TruncatedOrForeignFilesAreRefused) {
  const test::TempFile tmp("skew_trunc", ".gguf");
  const SkewSet set = make_set();
  write_skew(set, tmp.str());
  std::string bytes;
  {
    std::ifstream in(tmp.str(), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  {
    std::ofstream out(tmp.str(), std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 100));
  }
  EXPECT_THROW(read_skew(tmp.str(), set.model_hash), Error);
  const test::TempFile other("skew_foreign", ".gguf");
  {
    std::ofstream out(other.str(), std::ios::binary);
    out << "not a gguf file at all";
  }
  EXPECT_THROW(read_skew(other.str(), ""), Error);
}

TEST(SkewFile, HashesDifferForDifferentBytes) {
  EXPECT_NE(xxh3_tag(std::vector<uint8_t>{1, 2, 3}), xxh3_tag(std::vector<uint8_t>{1, 2, 4}));
  EXPECT_EQ(xxh3_tag(std::vector<uint8_t>{1, 2, 3}).rfind("xxh3-64:", 0), 0u);
}

}  // namespace
}  // namespace kvtier::skew
