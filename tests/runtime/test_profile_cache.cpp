// The KVPR profiler and its cache file: a measurement of a tiny synthetic model has the model's
// per-token sizes and positive rates; the cache is written, reused, missed on a different key (and
// then holds both), and a corrupt file is a clear error unless a re-profile is forced.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>

#include "backend/cpu/cpu_features.h"
#include "common/temp_file.h"
#include "core/error.h"
#include "model/presets.h"
#include "model/synthetic.h"
#include "runtime/profile_cache.h"
#include "runtime/profiler.h"

namespace kvtier::runtime {
namespace {

std::string synth_file(GgmlType type, uint64_t seed) {
  static std::map<std::pair<GgmlType, uint64_t>, std::unique_ptr<::kvtier::test::TempFile>> files;
  auto& f = files[{type, seed}];
  if (!f) {
    f = std::make_unique<::kvtier::test::TempFile>(
        "kvtier_test_profile_" + std::string(ggml_type_name(type)) + "_" + std::to_string(seed), ".gguf");
    model::SynthOptions o;
    o.type = type;
    o.seed = seed;
    o.n_ctx = 256;
    model::synth_writer(*model::find_preset("tiny-llama"), o).write(f->str());
  }
  return f->str();
}

ProfileOptions quick_options() {
  ProfileOptions o;
  o.threads = 1;
  o.isa = cpu::best_isa();
  o.transfer_tokens = 64;
  o.proj_tokens = 32;
  return o;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A profile with made-up numbers, for the file tests (no measuring).
Profile fake_profile(const std::string& hash, int threads) {
  Profile p;
  p.key.model_hash = hash;
  p.key.cpu = "Test CPU";
  p.key.isa = "avx2";
  p.key.threads = threads;
  p.host = {10e9, 1 << 20, 5, 5e-4};
  p.proj_flops_per_s = 50e9;
  p.proj_tokens_per_s = 1e5;
  p.proj_tokens = 256;
  p.kv_bytes_per_token = 768;
  p.x_bytes_per_token = 720;
  p.proj_flops_per_token = 442368;
  p.decode_weights_s = 0.0125;
  return p;
}

TEST(Profiler, MeasuresTheModelsSizesAndPositiveRates) {
  const auto m = load_model(synth_file(GgmlType::kQ8_0, 1));
  ::kvtier::test::TempFile disk("kvtier_test_profile_disk", "");
  std::filesystem::create_directories(disk.path());
  ProfileOptions o = quick_options();
  o.disk_dir = disk.str();
  const Profile p = measure_profile(*m, o);
  const model::Hparams& hp = m->hparams;
  EXPECT_EQ(p.kv_bytes_per_token, hp.n_head_kv[0] * (hp.head_dim_k + hp.head_dim_v) * 2.0);
  // Q8_0 weights take Q8_32 activation rows: 32 int8 + scale + sum = 40 bytes per 32 elements.
  EXPECT_EQ(p.x_bytes_per_token, hp.n_embd / 32 * 40.0);
  const auto& lw = m->weights.layers[0];
  EXPECT_EQ(p.proj_flops_per_token, 2.0 * hp.n_embd * static_cast<double>(lw.wk.n_rows + lw.wv.n_rows));
  EXPECT_GT(p.host.bytes_per_s, 0);
  EXPECT_EQ(p.host.job_bytes % 4096, 0u);
  ASSERT_TRUE(p.disk.has_value());
  EXPECT_GT(p.disk->bytes_per_s, 0);
  EXPECT_FALSE(p.disk_io.empty());
  EXPECT_GT(p.proj_flops_per_s, 0);
  EXPECT_NEAR(p.proj_flops_per_s, p.proj_tokens_per_s * p.proj_flops_per_token, 1e-6 * p.proj_flops_per_s);
  EXPECT_GT(p.decode_weights_s, 0);  // the decode weight pass
  EXPECT_EQ(p.key, profile_key(*m, o));
  EXPECT_EQ(p.key.cpu, cpu::cpu_brand());
  // The scheduler's terms over each link.
  const policy::KvprCosts host = kvpr_costs(p, false);
  EXPECT_EQ(host.v_com_kv, p.host.bytes_per_s);
  EXPECT_EQ(host.kv_bytes, p.kv_bytes_per_token);
  EXPECT_EQ(kvpr_costs(p, true).v_com_kv, p.disk->bytes_per_s);
  o.disk_dir.clear();
  EXPECT_THROW(kvpr_costs(measure_profile(*m, o), true), Error);
}

TEST(Profiler, ModelHashFollowsShapesNotValues) {
  const auto a = load_model(synth_file(GgmlType::kQ8_0, 1));
  const auto b = load_model(synth_file(GgmlType::kQ8_0, 2));
  const auto c = load_model(synth_file(GgmlType::kF32, 1));
  const ProfileOptions o = quick_options();
  EXPECT_EQ(profile_key(*a, o).model_hash, profile_key(*b, o).model_hash);
  EXPECT_NE(profile_key(*a, o).model_hash, profile_key(*c, o).model_hash);
  EXPECT_EQ(profile_key(*a, o).model_hash.size(), 16u);
}

TEST(ProfileCache, WriteReuseAndKeyMismatch) {
  const auto m = load_model(synth_file(GgmlType::kQ8_0, 1));
  ::kvtier::test::TempFile dir("kvtier_test_profile_cache", "");
  const std::string path = (dir.path() / "sub" / "profile.json").string();  // parent created on write
  const ProfileOptions o = quick_options();

  const CachedProfile first = get_profile(path, *m, o);
  EXPECT_FALSE(first.from_cache);
  ASSERT_TRUE(std::filesystem::exists(path));
  const std::string written = read_text(path);

  const CachedProfile again = get_profile(path, *m, o);
  EXPECT_TRUE(again.from_cache);
  EXPECT_EQ(again.profile.key, first.profile.key);
  EXPECT_EQ(again.profile.host.bytes_per_s, first.profile.host.bytes_per_s);  // read back, not re-measured
  EXPECT_EQ(again.profile.proj_flops_per_s, first.profile.proj_flops_per_s);
  EXPECT_EQ(read_text(path), written);  // a hit does not rewrite the file

  // Another key (threads) misses, measures, and the file then holds both.
  ProfileOptions o2 = o;
  o2.threads = 2;
  const CachedProfile other = get_profile(path, *m, o2);
  EXPECT_FALSE(other.from_cache);
  EXPECT_TRUE(find_cached_profile(path, profile_key(*m, o)).has_value());
  EXPECT_TRUE(find_cached_profile(path, profile_key(*m, o2)).has_value());
  // A key that differs in any field misses.
  for (int field = 0; field < 6; ++field) {
    ProfileKey k = profile_key(*m, o);
    switch (field) {
      case 0:
        k.model_hash = "0000000000000000";
        break;
      case 1:
        k.cpu = "Another CPU";
        break;
      case 2:
        k.isa = "scalar-x";
        break;
      case 3:
        k.threads = 99;
        break;
      case 4:
        k.disk_dir = "/elsewhere";
        break;
      case 5:
        k.link_bytes_per_s = 1e9;
        break;
    }
    EXPECT_FALSE(find_cached_profile(path, k).has_value()) << "field " << field;
  }
  // force re-measures and replaces the entry (still two entries).
  EXPECT_FALSE(get_profile(path, *m, o, true).from_cache);
  EXPECT_TRUE(get_profile(path, *m, o).from_cache);
  EXPECT_TRUE(get_profile(path, *m, o2).from_cache);
}

TEST(ProfileCache, StoreReplacesTheSameKeyAndKeepsOthers) {
  ::kvtier::test::TempFile file("kvtier_test_profile_store", ".json");
  EXPECT_FALSE(find_cached_profile(file.str(), fake_profile("a", 1).key).has_value());  // no file
  store_profile(file.str(), fake_profile("a", 1));
  store_profile(file.str(), fake_profile("b", 1));
  Profile a2 = fake_profile("a", 1);
  a2.host.bytes_per_s = 3e9;
  a2.disk = LinkMeasurement{1e9, 4096, 5, 2e-5};
  a2.disk_io = "O_DIRECT";
  store_profile(file.str(), a2);
  const auto got = find_cached_profile(file.str(), a2.key);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->host.bytes_per_s, 3e9);
  ASSERT_TRUE(got->disk.has_value());
  EXPECT_EQ(got->disk->bytes_per_s, 1e9);
  EXPECT_EQ(got->disk_io, "O_DIRECT");
  EXPECT_EQ(got->x_bytes_per_token, 720);
  EXPECT_EQ(got->decode_weights_s, 0.0125);
  EXPECT_TRUE(find_cached_profile(file.str(), fake_profile("b", 1).key).has_value());
  EXPECT_EQ(read_text(file.str()).find("\"model_hash\": \"a\""),
            read_text(file.str()).rfind("\"model_hash\": \"a\""))
      << "one entry per key";
}

// Entries written before the decode weight pass was measured have no such field: they read back with
// 0 (the scheduler then has no estimate of the first steps' other compute), not as corrupt.
TEST(ProfileCache, EntriesWithoutTheDecodeWeightPassReadAsZero) {
  ::kvtier::test::TempFile file("kvtier_test_profile_old", ".json");
  store_profile(file.str(), fake_profile("old", 1));
  std::string text = read_text(file.str());
  const size_t at = text.find("\"decode_weights_s\"");
  ASSERT_NE(at, std::string::npos);
  text.erase(at, text.find('\n', at) + 1 - at);  // the field's line, as an older kvtier wrote it
  write_text(file.str(), text);
  const auto got = find_cached_profile(file.str(), fake_profile("old", 1).key);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->decode_weights_s, 0.0);
  EXPECT_EQ(got->proj_tokens_per_s, 1e5);
}

TEST(ProfileCache, CorruptFilesAreClearErrorsUnlessForced) {
  const auto m = load_model(synth_file(GgmlType::kQ8_0, 1));
  ::kvtier::test::TempFile file("kvtier_test_profile_corrupt", ".json");
  const ProfileOptions o = quick_options();
  struct Case {
    const char* text;
    const char* says;
  };
  const Case cases[] = {
      {"{not json", "not valid JSON"},
      {"[1, 2]", "not an object"},
      {R"({"format": "something-else", "version": 1, "entries": []})", "/format"},
      {R"({"format": "kvtier-profile-cache", "version": 7, "entries": []})", "/version"},
      {R"({"format": "kvtier-profile-cache", "version": 1, "entries": {}})", "/entries"},
      {R"({"format": "kvtier-profile-cache", "version": 1, "entries": [{"key": {}}]})", "model_hash"},
  };
  for (const Case& c : cases) {
    write_text(file.str(), c.text);
    try {
      find_cached_profile(file.str(), profile_key(*m, o));
      ADD_FAILURE() << "no error for " << c.text;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidFile);
      const std::string msg = e.what();
      EXPECT_NE(msg.find(file.str()), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.says), std::string::npos) << msg;
      EXPECT_NE(msg.find("--force"), std::string::npos) << msg;
    }
    EXPECT_THROW(get_profile(file.str(), *m, o), Error) << c.text;
    EXPECT_EQ(read_text(file.str()), c.text) << "a failed lookup must leave the file alone";
  }
  // A stored entry with a bad value (a zero bandwidth) is corrupt too.
  Profile bad = fake_profile("z", 1);
  std::filesystem::remove(file.path());
  store_profile(file.str(), bad);
  std::string text = read_text(file.str());
  const size_t at = text.find("10000000000");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 11, "0");
  write_text(file.str(), text);
  EXPECT_THROW(find_cached_profile(file.str(), bad.key), Error);
  // Forced: re-profiles and replaces the corrupt file with a good one.
  write_text(file.str(), "{not json");
  const CachedProfile p = get_profile(file.str(), *m, o, true);
  EXPECT_FALSE(p.from_cache);
  EXPECT_TRUE(get_profile(file.str(), *m, o).from_cache);
}

}  // namespace
}  // namespace kvtier::runtime
