// Deterministic mutation testing of the reader: real model files and synthetic ones are truncated
// at every section boundary, have bytes flipped and counts replaced by huge values. Every mutant
// must parse or be rejected with Error(kInvalidFile) -- never crash, hang, over-read (the asan
// preset checks that) or throw anything else (bad_alloc, length_error, ...).
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "core/mapped_file.h"
#include "fixtures.h"
#include "gguf/reader.h"
#include "model/presets.h"
#include "model/synthetic.h"

namespace kvtier::gguf {
namespace {

struct Outcome {
  int accepted = 0;
  int rejected = 0;
};

// Parses a private copy of exactly these bytes (so reads past the end are caught by ASan).
void try_parse(std::span<const uint8_t> bytes, Outcome& out, const std::string& what) {
  const std::vector<uint8_t> copy(bytes.begin(), bytes.end());
  try {
    parse(copy, "mutant");
    ++out.accepted;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidFile) << what << ": " << e.what();
    ++out.rejected;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": unexpected exception " << typeid(e).name() << ": " << e.what();
  }
}

// Offsets worth cutting or corrupting at: each section entry start (every `stride`-th tensor info)
// shifted by each of `deltas` (the key/name length, the type after it, ...).
std::vector<uint64_t> boundaries(const Content& c, size_t stride, std::initializer_list<int> deltas) {
  std::vector<uint64_t> b = {0, 4, 8, 16, 24};
  for (size_t i = 0; i < c.kv_offsets.size(); i += 1) b.push_back(c.kv_offsets[i]);
  for (size_t i = 0; i < c.tensor_info_offsets.size(); i += stride) b.push_back(c.tensor_info_offsets[i]);
  b.push_back(c.header_end);
  b.push_back(c.data_offset);
  std::vector<uint64_t> out;
  for (uint64_t x : b) {
    for (int d : deltas) {
      if (static_cast<int64_t>(x) + d >= 0) out.push_back(x + d);
    }
  }
  return out;
}

void mutate_all(std::span<const uint8_t> file, size_t stride, int n_flips, uint32_t seed) {
  const Content c = parse(file, "original");
  Outcome out;
  // 1. Truncation at every boundary (and the last byte).
  for (uint64_t cut : boundaries(c, stride, {-1, 0, 1, 8, 12})) {
    if (cut < file.size()) try_parse(file.first(cut), out, "cut at " + std::to_string(cut));
  }
  // Header-only view: mutations below run over the header (tensor data is not parsed).
  const uint64_t head = std::min<uint64_t>(file.size(), c.data_offset + 64);
  std::vector<uint8_t> m(file.begin(), file.begin() + head);
  std::mt19937 rng(seed);
  // 2. Huge counts/lengths written over every u64 that starts a section entry or follows a key.
  for (uint64_t at : boundaries(c, stride, {0, 8})) {
    for (uint64_t huge : std::initializer_list<uint64_t>{UINT64_MAX, 1ULL << 32, 0}) {
      if (at + 8 > m.size()) continue;
      uint64_t saved;
      std::memcpy(&saved, m.data() + at, 8);
      std::memcpy(m.data() + at, &huge, 8);
      try_parse(m, out, "u64 at " + std::to_string(at));
      std::memcpy(m.data() + at, &saved, 8);
    }
  }
  // 3. Random byte flips, biased towards the structural bytes near entry starts.
  const auto b = boundaries(c, stride, {0});
  for (int i = 0; i < n_flips; ++i) {
    const uint64_t pos = (i % 2 == 0) ? (b[rng() % b.size()] + rng() % 16) % m.size() : rng() % m.size();
    const uint8_t saved = m[pos];
    m[pos] = static_cast<uint8_t>(rng());
    try_parse(m, out, "flip at " + std::to_string(pos));
    m[pos] = saved;
  }
  // Some mutants must survive (a flipped byte in a string) and most must not: a sanity check that
  // the test exercises both paths.
  EXPECT_GT(out.rejected, 0);
  ::testing::Test::RecordProperty("accepted", out.accepted);
  ::testing::Test::RecordProperty("rejected", out.rejected);
}

std::string model_path(const char* name) {
  const std::string p = std::string(KVTIER_SOURCE_DIR) + "/models/" + name;
  if (!std::filesystem::exists(p)) ADD_FAILURE() << p << " is missing: run scripts/setup.sh";
  return p;
}

TEST(GgufMutation, AllTypesFixture) {
  const auto bytes = testing::all_types_writer().to_bytes();
  mutate_all(bytes, 1, 3000, 1);
}

TEST(GgufMutation, SyntheticModel) {
  model::SynthOptions o;
  o.type = GgmlType::kQ4_0;
  const auto bytes = model::synth_writer(*model::find_preset("tiny-llama"), o).to_bytes();
  mutate_all(bytes, 1, 1500, 2);
}

TEST(GgufMutation, SmolLM2) {
  const MappedFile f(model_path("SmolLM2-135M-Instruct.Q4_1.gguf"));
  mutate_all(f.bytes(), 16, 200, 3);
}

TEST(GgufMutation, Gemma3) {
  const MappedFile f(model_path("gemma-3-270m-q4_k_m.gguf"));
  mutate_all(f.bytes(), 32, 60, 4);
}

}  // namespace
}  // namespace kvtier::gguf
