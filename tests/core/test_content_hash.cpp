// core/content_hash: the one XXH3-64 the project uses for model files, training data and logits.
// The expected values come from the independent `xxhash` PyPI package (xxhash.xxh3_64_intdigest).
#include "core/content_hash.h"

#include <gtest/gtest.h>

#include <fstream>
#include <vector>

#include "common/temp_file.h"
#include "core/error.h"

namespace kvtier {
namespace {

std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> a(n);
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<uint8_t>(i * 7);
  return a;
}

TEST(ContentHash, KnownAnswersFromThePythonPackage) {
  // python -c "import xxhash; print(hex(xxhash.xxh3_64_intdigest(b'')))"
  EXPECT_EQ(xxh3_64(std::span<const uint8_t>{}), 0x2d06800538d394c2ull);
  // ... xxh3_64_intdigest(bytes((i*7)&255 for i in range(1000)))
  EXPECT_EQ(xxh3_64(pattern(1000)), 0x10ad30264426c830ull);
  EXPECT_EQ(xxh3_tag(pattern(1000)), "xxh3-64:10ad30264426c830");
}

TEST(ContentHash, DependsOnEveryByteAndTheLength) {
  const auto a = pattern(1000);
  const uint64_t h = xxh3_64(a);
  for (size_t i : {size_t{0}, size_t{31}, size_t{32}, size_t{990}, size_t{999}}) {
    auto b = a;
    b[i] ^= 1;
    EXPECT_NE(xxh3_64(b), h) << i;
  }
  EXPECT_NE(xxh3_64(std::span(a).first(999)), h);
}

TEST(ContentHash, FloatRowsHashTheirBytes) {
  const std::vector<float> row = {1.0f, -2.5f, 0.0f, 3.25f};
  const std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(row.data()),
                                       row.size() * sizeof(float));
  EXPECT_EQ(xxh3_64(std::span<const float>(row)), xxh3_64(bytes));
}

TEST(ContentHash, FileTagIsTheTagOfItsBytesAndAMissingFileNamesItsPath) {
  const auto a = pattern(1000);
  const test::TempFile tmp("content_hash", ".bin");
  std::ofstream(tmp.path(), std::ios::binary).write(reinterpret_cast<const char*>(a.data()), 1000);
  EXPECT_EQ(file_xxh3_tag(tmp.str()), xxh3_tag(a));
  try {
    file_xxh3_tag("/nonexistent/kvtier_model.gguf");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/kvtier_model.gguf"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvtier
