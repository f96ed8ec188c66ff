#include "skew/model_hash.h"

#include <fmt/format.h>
#include <xxhash.h>

#include "core/mapped_file.h"

namespace kvtier::skew {

std::string bytes_hash(std::span<const uint8_t> bytes) {
  return fmt::format("xxh3-64:{:016x}", XXH3_64bits(bytes.data(), bytes.size()));
}

std::string file_hash(const std::string& path) {
  const MappedFile map(path);
  return bytes_hash(map.bytes());
}

}  // namespace kvtier::skew
