// Hand-built malformed files: each must be rejected with kInvalidFile and a message that says what
// is wrong (and where, for header errors).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/reader.h"

namespace kvtier::gguf {
namespace {

// Builds raw GGUF bytes field by field, so tests can write what the writer never would.
class Raw {
 public:
  Raw& u32(uint32_t v) { return put(v); }
  Raw& u64(uint64_t v) { return put(v); }
  Raw& str(const std::string& s) {
    u64(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
    return *this;
  }
  Raw& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return u32(kMagic).u32(version).u64(n_tensors).u64(n_kv);
  }
  Raw& kv_u32(const std::string& key, uint32_t v) { return str(key).u32(4).u32(v); }
  Raw& tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(ne.size()));
    for (auto d : ne) u64(d);
    return u32(type).u64(offset);
  }
  Raw& pad(size_t align) {
    while (bytes.size() % align) bytes.push_back(0);
    return *this;
  }
  Raw& zeros(size_t n) {
    bytes.resize(bytes.size() + n, 0);
    return *this;
  }
  std::vector<uint8_t> bytes;

 private:
  template <typename T>
  Raw& put(T v) {
    const size_t at = bytes.size();
    bytes.resize(at + sizeof v);
    std::memcpy(bytes.data() + at, &v, sizeof v);
    return *this;
  }
};

std::string parse_error(const std::vector<uint8_t>& bytes) {
  try {
    parse(bytes, "bad.gguf");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidFile) << e.what();
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind("bad.gguf: ", 0), 0u) << "message must name the file: " << msg;
    return msg;
  }
  ADD_FAILURE() << "file was accepted";
  return "";
}

#define EXPECT_ERROR(raw, fragment)                                     \
  do {                                                                  \
    const std::string m = parse_error((raw).bytes);                     \
    EXPECT_NE(m.find(fragment), std::string::npos) << "message: " << m; \
  } while (0)

TEST(GgufErrors, Header) {
  EXPECT_ERROR(Raw(), "at byte 0: file ends while reading magic");
  EXPECT_ERROR(Raw().u32(0x46554746), "not a GGUF file");
  EXPECT_ERROR(Raw().u32(kMagic), "at byte 4: file ends while reading version");
  EXPECT_ERROR(Raw().header(0, 0, 1), "version 1 is obsolete");
  EXPECT_ERROR(Raw().header(0, 0, 7), "unsupported GGUF version 7");
  EXPECT_ERROR(Raw().header(0, 0, 0x03000000), "big-endian");
  EXPECT_ERROR(Raw().u32(kMagic).u32(3).u64(0), "file ends while reading metadata count");
  EXPECT_ERROR(Raw().header(0, 1ULL << 60), "metadata count 1152921504606846976 cannot fit");
  EXPECT_ERROR(Raw().header(UINT64_MAX, 0), "tensor count 18446744073709551615 cannot fit");
}

TEST(GgufErrors, Metadata) {
  EXPECT_ERROR(Raw().header(0, 1).u64(1ULL << 62).zeros(16), "at byte 24: metadata key has length");
  EXPECT_ERROR(Raw().header(0, 1).str("").u32(4).u32(0), "empty key");
  EXPECT_ERROR(Raw().header(0, 1).str("k").u32(13).u32(0), "metadata 'k': unknown value type 13");
  EXPECT_ERROR(Raw().header(0, 2).kv_u32("k", 1).kv_u32("k", 2),
               "duplicate metadata key 'k' (first at byte 24)");
  EXPECT_ERROR(Raw().header(0, 1).str("k").u32(8).u64(100).zeros(8), "string value has length 100");
  EXPECT_ERROR(Raw().header(0, 1).str("k").u32(4).zeros(2), "file ends while reading u32 value");
  // Arrays: unknown element type, impossible counts for fixed-size, string and nested elements.
  EXPECT_ERROR(Raw().header(0, 1).str("a").u32(9).u32(99).u64(0), "unknown array element type 99");
  EXPECT_ERROR(Raw().header(0, 1).str("a").u32(9).u32(4).u64(1ULL << 62).zeros(64),
               "array of 4611686018427387904 u32");
  EXPECT_ERROR(Raw().header(0, 1).str("a").u32(9).u32(8).u64(UINT64_MAX).zeros(64), "does not fit");
  EXPECT_ERROR(Raw().header(0, 1).str("a").u32(9).u32(9).u64(1000).zeros(64), "does not fit");
  Raw deep;
  deep.header(0, 1).str("a").u32(9);
  for (int i = 0; i < 20; ++i) deep.u32(9).u64(1);
  deep.u32(4).u64(0);
  EXPECT_ERROR(deep, "nested deeper than 8 levels");
  // general.alignment must be a u32 power of two.
  EXPECT_ERROR(Raw().header(0, 1).kv_u32("general.alignment", 48), "power of two");
  EXPECT_ERROR(Raw().header(0, 1).kv_u32("general.alignment", 0), "power of two");
  EXPECT_ERROR(Raw().header(0, 1).str("general.alignment").u32(10).u64(32), "must be a u32");
}

TEST(GgufErrors, Tensors) {
  auto one = [](std::vector<uint64_t> ne, uint32_t type, uint64_t off, size_t data) {
    Raw r;
    r.header(1, 0).tensor("t", std::move(ne), type, off).pad(32).zeros(data);
    return r;
  };
  EXPECT_ERROR(one({1, 1, 1, 1, 1}, 0, 0, 4), "has 5 dimensions");
  EXPECT_ERROR(one({4}, 4, 0, 64), "unknown GGML type id 4");
  EXPECT_ERROR(one({4}, 1000, 0, 64), "unknown GGML type id 1000");
  EXPECT_ERROR(one({33}, 2, 0, 64), "row length 33 is not a multiple of the q4_0 block size 32");
  EXPECT_ERROR(one({4}, 0, 8, 64), "data offset 8 is not a multiple of the alignment 32");
  EXPECT_ERROR(one({100}, 0, 0, 64), "extends past the end of the file");
  EXPECT_ERROR(one({16}, 0, 1ULL << 63, 64), "extends past the end of the file");
  EXPECT_ERROR(one({1ULL << 32, 1ULL << 32}, 0, 0, 64), "element count overflows");
  EXPECT_ERROR(one({1ULL << 61, 2}, 0, 0, 64), "byte size overflows");
  EXPECT_ERROR(one({1ULL << 63}, 0, 0, 64), "dimension 0 is");
  Raw truncated;
  truncated.header(1, 0).str("a_long_enough_tensor_name_xx").u32(3).u64(4);
  EXPECT_ERROR(truncated, "file ends while reading tensor dimension");
  Raw dup;
  dup.header(2, 0).tensor("t", {4}, 0, 0).tensor("t", {4}, 0, 32).pad(32).zeros(64);
  EXPECT_ERROR(dup, "duplicate tensor name 't'");
  Raw overlap;
  overlap.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {16}, 0, 32).pad(32).zeros(128);
  EXPECT_ERROR(overlap, "tensors 'a' and 'b' overlap");
  Raw no_data;
  no_data.header(1, 0).tensor("a", {4}, 0, 0);
  EXPECT_ERROR(no_data, "file ends before its data section");
}

TEST(GgufErrors, ValidMinimalFilesAreAccepted) {
  Raw empty;
  empty.header(0, 0);
  EXPECT_NO_THROW(parse(empty.bytes, "empty.gguf"));
  Raw v2;
  v2.header(1, 1, 2).kv_u32("general.alignment", 64).tensor("t", {16}, 0, 0).pad(64).zeros(64);
  const Content c = parse(v2.bytes, "v2.gguf");
  EXPECT_EQ(c.version, 2u);
  EXPECT_EQ(c.alignment, 64u);
  EXPECT_EQ(c.data_offset % 64, 0u);
  ASSERT_EQ(c.tensors.size(), 1u);
  EXPECT_EQ(c.tensors[0].n_bytes, 64u);
}

}  // namespace
}  // namespace kvtier::gguf
