#include <gtest/gtest.h>
#include <sys/resource.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "fixtures.h"
#include "gguf/reader.h"

namespace kvtier::gguf {
namespace {

namespace fs = std::filesystem;

const Value& find(const Content& c, const std::string& key) {
  for (const auto& kv : c.metadata) {
    if (kv.key == key) return kv.value;
  }
  ADD_FAILURE() << "missing key " << key;
  static const Value none;
  return none;
}

void expect_same_value(const Value& a, const Value& b, const std::string& where) {
  ASSERT_EQ(a.type, b.type) << where;
  if (const auto* aa = a.as_array()) {
    const auto* ba = b.as_array();
    ASSERT_NE(ba, nullptr) << where;
    ASSERT_EQ(aa->elem_type, ba->elem_type) << where;
    ASSERT_EQ(aa->count, ba->count) << where;
    EXPECT_EQ(aa->raw, ba->raw) << where;
    EXPECT_EQ(aa->strings, ba->strings) << where;
    ASSERT_EQ(aa->arrays.size(), ba->arrays.size()) << where;
    for (size_t i = 0; i < aa->arrays.size(); ++i) {
      expect_same_value(aa->arrays[i], ba->arrays[i], where + "[" + std::to_string(i) + "]");
    }
    return;
  }
  ASSERT_EQ(a.data.index(), b.data.index()) << where;
  if (const auto* s = a.as_string()) {
    EXPECT_EQ(*s, *b.as_string()) << where;
  } else {
    EXPECT_EQ(a.as_number(), b.as_number()) << where;
    EXPECT_EQ(a.as_bool(), b.as_bool()) << where;
  }
}

TEST(GgufRoundTrip, EveryValueTypeAndTensorSurvives) {
  for (uint32_t align : {32u, 64u, 1u, 4096u}) {
    const Writer w = testing::all_types_writer(align);
    const std::vector<uint8_t> bytes = w.to_bytes();
    EXPECT_EQ(bytes.size(), w.file_size());
    const Content c = parse(bytes, "mem");
    EXPECT_EQ(c.version, 3u);
    EXPECT_EQ(c.alignment, align);
    EXPECT_EQ(c.data_offset % align, 0u);

    // Compare against a second, independent construction of the same values.
    const Content again = parse(testing::all_types_writer(align).to_bytes(), "mem2");
    ASSERT_EQ(c.metadata.size(), again.metadata.size());
    for (size_t i = 0; i < c.metadata.size(); ++i) {
      EXPECT_EQ(c.metadata[i].key, again.metadata[i].key);
      expect_same_value(c.metadata[i].value, again.metadata[i].value, c.metadata[i].key);
    }
    EXPECT_EQ(std::get<uint64_t>(find(c, "t.u64").data), UINT64_MAX);
    EXPECT_EQ(std::get<int64_t>(find(c, "t.i8").data), -128);
    EXPECT_EQ(std::get<double>(find(c, "t.f32").data), static_cast<double>(0.1f));
    EXPECT_EQ(*find(c, "t.string_empty").as_string(), "");
    const Array& nested = *find(c, "t.arr_nested").as_array();
    ASSERT_EQ(nested.count, 2u);
    EXPECT_EQ(nested.arrays[1].as_array()->strings[1], "y");
    EXPECT_EQ(nested.arrays[0].as_array()->get<int32_t>(2), 3);
    EXPECT_EQ(find(c, "t.arr_bool").as_array()->get<bool>(1), false);
    EXPECT_EQ(find(c, "t.arr_empty").as_array()->count, 0u);

    ASSERT_EQ(c.tensors.size(), 4u);
    const TensorInfo& f = c.tensors[0];
    EXPECT_EQ(f.name, "weights.f32");
    EXPECT_EQ(f.ne, (std::vector<uint64_t>{16, 4}));
    EXPECT_EQ(f.n_bytes, 256u);
    float v;
    std::memcpy(&v, f.data + 4 * 5, 4);
    EXPECT_EQ(v, 5 * 0.25f - 3.0f);
    EXPECT_EQ(c.tensors[1].type, GgmlType::kQ4_0);
    EXPECT_EQ(c.tensors[1].n_bytes, 36u);
    EXPECT_EQ(c.tensors[1].data[5], 35);
    EXPECT_EQ(c.tensors[3].ne.size(), 4u);
    for (const auto& t : c.tensors) EXPECT_EQ(t.offset % align, 0u) << t.name;
  }
}

TEST(GgufRoundTrip, FileWriteIsAtomicAndReadable) {
  const fs::path dir = fs::path(KVTIER_BINARY_DIR) / "test_tmp" / "roundtrip";
  fs::create_directories(dir);
  const fs::path out = dir / "all.gguf";
  fs::remove_all(dir);
  fs::create_directories(dir);
  testing::all_types_writer().write(out.string());
  // Only the file itself is left: no temporary.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 1);
  const File f(out.string());
  EXPECT_EQ(f.get_string("general.architecture"), "test");
  EXPECT_EQ(f.get_int("t.i32"), INT32_MIN);
  EXPECT_EQ(f.opt_int("missing"), std::nullopt);
  EXPECT_THROW(f.get_int("missing"), Error);
  EXPECT_THROW(f.get_int("t.string"), Error);  // wrong type is an error, not a guess
  EXPECT_EQ(f.find_tensor("weights.q4_0")->n_elements, 64u);
  EXPECT_EQ(f.find_tensor("nope"), nullptr);
}

TEST(GgufRoundTrip, WriteIntoMissingDirectoryFailsCleanly) {
  const std::string out = std::string(KVTIER_BINARY_DIR) + "/test_tmp/no/such/dir/x.gguf";
  try {
    testing::all_types_writer().write(out);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("x.gguf"), std::string::npos) << e.what();
  }
}

// A full disk is simulated with a file-size limit: writes fail (EFBIG) part-way through.
TEST(GgufRoundTrip, FullDiskLeavesNothingBehind) {
  const fs::path dir = fs::path(KVTIER_BINARY_DIR) / "test_tmp" / "fulldisk";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path out = dir / "big.gguf";
  Writer w;
  w.set("general.architecture", Value::string("test"));
  w.add_tensor("big", GgmlType::kF32, {1u << 20},
               [](std::span<uint8_t> dst) { std::fill(dst.begin(), dst.end(), uint8_t{1}); });
  std::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit small = old;
  small.rlim_cur = 64 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  bool threw = false;
  try {
    w.write(out.string());
  } catch (const Error& e) {
    threw = true;
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
    EXPECT_NE(std::string(e.what()).find("write failed"), std::string::npos) << e.what();
  }
  setrlimit(RLIMIT_FSIZE, &old);
  EXPECT_TRUE(threw);
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 0);  // no temporary left
}

TEST(GgufRoundTrip, WriterRejectsBadTensors) {
  Writer w;
  EXPECT_THROW(w.add_tensor_bytes("x", GgmlType::kQ4_0, {33}, {}), Error);  // not a multiple of 32
  EXPECT_THROW(w.add_tensor_bytes("x", GgmlType::kF32, {1, 1, 1, 1, 1}, {}), Error);
  w.add_tensor_bytes("x", GgmlType::kF32, {1}, std::vector<uint8_t>(4));
  EXPECT_THROW(w.add_tensor_bytes("x", GgmlType::kF32, {1}, std::vector<uint8_t>(4)), Error);
}

}  // namespace
}  // namespace kvtier::gguf
