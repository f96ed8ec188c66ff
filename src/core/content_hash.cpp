#include "core/content_hash.h"

#include <fmt/format.h>
#include <xxhash.h>

#include "core/mapped_file.h"

namespace kvtier {

uint64_t xxh3_64(std::span<const uint8_t> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

uint64_t xxh3_64(std::span<const float> values) {
  return XXH3_64bits(values.data(), values.size_bytes());
}

std::string xxh3_tag(std::span<const uint8_t> bytes) {
  return fmt::format("xxh3-64:{:016x}", xxh3_64(bytes));
}

std::string file_xxh3_tag(const std::string& path) {
  const MappedFile map(path);
  return xxh3_tag(map.bytes());
}

}  // namespace kvtier
