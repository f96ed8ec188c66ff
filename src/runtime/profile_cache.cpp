#include "runtime/profile_cache.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace kvtier::runtime {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "kvtier-profile-cache";
constexpr int kVersion = 1;

json key_json(const ProfileKey& k) {
  return {{"model_hash", k.model_hash}, {"cpu", k.cpu},           {"isa", k.isa},
          {"threads", k.threads},       {"disk_dir", k.disk_dir}, {"link_bytes_per_s", k.link_bytes_per_s}};
}

json link_json(const LinkMeasurement& l) {
  return {{"bytes_per_s", l.bytes_per_s},
          {"job_bytes", l.job_bytes},
          {"copies", l.copies},
          {"median_s", l.median_s}};
}

}  // namespace

json profile_json(const Profile& p) {
  return {{"key", key_json(p.key)},
          {"host", link_json(p.host)},
          {"disk", p.disk ? link_json(*p.disk) : json(nullptr)},
          {"disk_io", p.disk_io},
          {"projection",
           {{"flops_per_s", p.proj_flops_per_s},
            {"tokens_per_s", p.proj_tokens_per_s},
            {"tokens", p.proj_tokens}}},
          {"decode_weights_s", p.decode_weights_s},
          {"per_token",
           {{"kv_bytes", p.kv_bytes_per_token},
            {"x_bytes", p.x_bytes_per_token},
            {"recompute_flops", p.proj_flops_per_token}}}};
}

namespace {

// Reading, with the path and the JSON pointer of a bad field in every error.
struct Reader {
  const std::string& path;

  [[noreturn]] void bad(const std::string& where, const std::string& what) const {
    fail(ErrorKind::kInvalidFile,
         "profile cache {}: {}: {} (delete the file, or re-profile with `kvtier profile --force`)", path,
         where, what);
  }
  const json& field(const json& obj, const char* name, const std::string& where) const {
    if (!obj.is_object()) bad(where, "not an object");
    auto it = obj.find(name);
    if (it == obj.end()) bad(where, fmt::format("no field \"{}\"", name));
    return *it;
  }
  std::string str(const json& obj, const char* name, const std::string& where) const {
    const json& v = field(obj, name, where);
    if (!v.is_string()) bad(where + "/" + name, "not a string");
    return v.get<std::string>();
  }
  double num(const json& obj, const char* name, const std::string& where, bool positive) const {
    const json& v = field(obj, name, where);
    if (!v.is_number()) bad(where + "/" + name, "not a number");
    const double d = v.get<double>();
    if (!std::isfinite(d) || d < 0 || (positive && d == 0))
      bad(where + "/" + name, fmt::format("bad value {}", d));
    return d;
  }
  int64_t integer(const json& obj, const char* name, const std::string& where) const {
    const json& v = field(obj, name, where);
    if (!v.is_number_integer() || v.get<int64_t>() < 0) bad(where + "/" + name, "not a non-negative integer");
    return v.get<int64_t>();
  }

  ProfileKey key(const json& e, const std::string& where) const {
    const json& k = field(e, "key", where);
    const std::string w = where + "/key";
    ProfileKey out;
    out.model_hash = str(k, "model_hash", w);
    out.cpu = str(k, "cpu", w);
    out.isa = str(k, "isa", w);
    out.threads = static_cast<int>(integer(k, "threads", w));
    out.disk_dir = str(k, "disk_dir", w);
    out.link_bytes_per_s = num(k, "link_bytes_per_s", w, false);
    return out;
  }
  LinkMeasurement link(const json& l, const std::string& where) const {
    LinkMeasurement out;
    out.bytes_per_s = num(l, "bytes_per_s", where, true);
    out.job_bytes = static_cast<uint64_t>(integer(l, "job_bytes", where));
    out.copies = static_cast<int>(integer(l, "copies", where));
    out.median_s = num(l, "median_s", where, true);
    return out;
  }
  Profile profile(const json& e, const std::string& where) const {
    Profile p;
    p.key = key(e, where);
    p.host = link(field(e, "host", where), where + "/host");
    const json& d = field(e, "disk", where);
    if (!d.is_null()) p.disk = link(d, where + "/disk");
    p.disk_io = str(e, "disk_io", where);
    const json& pr = field(e, "projection", where);
    p.proj_flops_per_s = num(pr, "flops_per_s", where + "/projection", true);
    p.proj_tokens_per_s = num(pr, "tokens_per_s", where + "/projection", true);
    p.proj_tokens = integer(pr, "tokens", where + "/projection");
    // (absent from entries written before it was measured: 0, unused)
    if (e.is_object() && e.contains("decode_weights_s"))
      p.decode_weights_s = num(e, "decode_weights_s", where, false);
    const json& pt = field(e, "per_token", where);
    p.kv_bytes_per_token = num(pt, "kv_bytes", where + "/per_token", true);
    p.x_bytes_per_token = num(pt, "x_bytes", where + "/per_token", true);
    p.proj_flops_per_token = num(pt, "recompute_flops", where + "/per_token", true);
    return p;
  }
  // The file's entries, fully checked; nullopt when the file does not exist.
  std::optional<json> entries() const {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return std::nullopt;
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(ErrorKind::kIo, "profile cache {}: cannot open it for reading", path);
    std::stringstream ss;
    ss << in.rdbuf();
    json doc = json::parse(ss.str(), nullptr, false);
    if (doc.is_discarded()) bad("/", "not valid JSON");
    if (str(doc, "format", "") != kFormat) bad("/format", fmt::format("not \"{}\"", kFormat));
    if (integer(doc, "version", "") != kVersion) bad("/version", fmt::format("not {}", kVersion));
    const json& e = field(doc, "entries", "");
    if (!e.is_array()) bad("/entries", "not an array");
    for (size_t i = 0; i < e.size(); ++i) profile(e[i], fmt::format("/entries/{}", i));
    return e;
  }
};

}  // namespace

std::optional<Profile> find_cached_profile(const std::string& path, const ProfileKey& key) {
  const Reader r{path};
  const std::optional<json> entries = r.entries();
  if (!entries) return std::nullopt;
  for (size_t i = 0; i < entries->size(); ++i) {
    const std::string where = fmt::format("/entries/{}", i);
    if (r.key((*entries)[i], where) == key) return r.profile((*entries)[i], where);
  }
  return std::nullopt;
}

void store_profile(const std::string& path, const Profile& p, bool replace_corrupt) {
  const Reader r{path};
  json entries = json::array();
  try {
    if (std::optional<json> e = r.entries()) entries = std::move(*e);
  } catch (const Error& e) {
    if (!replace_corrupt || e.kind() != ErrorKind::kInvalidFile) throw;
  }
  json kept = json::array();
  for (size_t i = 0; i < entries.size(); ++i) {
    if (!(r.key(entries[i], fmt::format("/entries/{}", i)) == p.key)) kept.push_back(entries[i]);
  }
  kept.push_back(profile_json(p));
  const json doc = {{"format", kFormat}, {"version", kVersion}, {"entries", kept}};

  const std::filesystem::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path(), ec);
  const std::string tmp = fmt::format("{}.tmp{}", path, ::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << doc.dump(2) << "\n";
    out.flush();
    if (!out) fail(ErrorKind::kIo, "profile cache {}: cannot write {}", path, tmp);
  }
  std::filesystem::rename(tmp, target, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    fail(ErrorKind::kIo, "profile cache {}: cannot replace it: {}", path, ec.message());
  }
}

CachedProfile get_profile(const std::string& path, const LoadedModel& m, const ProfileOptions& o,
                          bool force) {
  if (!force) {
    if (std::optional<Profile> p = find_cached_profile(path, profile_key(m, o))) return {*p, true};
  }
  CachedProfile out{measure_profile(m, o), false};
  store_profile(path, out.profile, force);
  return out;
}

}  // namespace kvtier::runtime
