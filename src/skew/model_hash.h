// The identity of a model file that sidecar files (skewing matrices) are tied to: XXH3-64 of the
// whole file's bytes, written as "xxh3-64:<16 hex digits>".
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace kvtier::skew {

std::string bytes_hash(std::span<const uint8_t> bytes);
// Maps the file and hashes it; throws Error(kIo) naming the path when it cannot be read.
std::string file_hash(const std::string& path);

}  // namespace kvtier::skew
