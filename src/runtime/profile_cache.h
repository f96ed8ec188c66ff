// The profile cache: a small JSON file of profiles keyed by ProfileKey (model hash, CPU, ISA,
// threads, disk directory, link throttle), so that a model is profiled once per machine. The CLI
// chooses the file's location (tools/ is the only place that reads the environment).
//
//   {"format": "kvtier-profile-cache", "version": 1, "entries": [{"key": {...}, "host": {...}, ...}]}
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "runtime/profiler.h"

namespace kvtier::runtime {

// One entry of the file: {"key": {...}, "host": {...}, "disk": {...} | null, "projection": {...}, ...}.
nlohmann::json profile_json(const Profile& p);

// The profile stored for `key`; nullopt when the file does not exist or holds no entry for the key.
// A file that is not a profile cache (bad JSON, wrong format or version, a missing or bad field)
// throws Error(kInvalidFile) naming the file and the problem.
std::optional<Profile> find_cached_profile(const std::string& path, const ProfileKey& key);

// Adds `p` to the file, replacing an entry with the same key and keeping the others; creates the
// parent directory; writes a temporary file and renames it (a crash leaves the old file). An
// unreadable or corrupt existing file is replaced when `replace_corrupt`, else Error(kInvalidFile).
void store_profile(const std::string& path, const Profile& p, bool replace_corrupt = false);

struct CachedProfile {
  Profile profile;
  bool from_cache = false;
};
// The cached profile for the key of (m, o), or a new measurement stored in the file. `force`
// measures and stores even when an entry exists or the file is corrupt.
CachedProfile get_profile(const std::string& path, const LoadedModel& m, const ProfileOptions& o,
                          bool force = false);

}  // namespace kvtier::runtime
